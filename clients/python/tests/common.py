"""The cluster the Rust test harness started: CELLFLEET_CONFIG (a client.toml
for it) and CELLFLEET_TEST_NODES ("id=pid=host:port,...")."""

import os

from cellfleet import Config


def config() -> Config:
    return Config.read(os.environ["CELLFLEET_CONFIG"])


def nodes() -> dict:
    """node id -> (pid, client endpoint)."""
    out = {}
    for item in os.environ["CELLFLEET_TEST_NODES"].split(","):
        node, pid, endpoint = item.split("=")
        out[node] = (int(pid), endpoint)
    return out
