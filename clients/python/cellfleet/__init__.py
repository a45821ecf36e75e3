"""Cellfleet's Python client: see :mod:`cellfleet.client`.

    from cellfleet import Client
    client = Client.from_config()            # .cellfleet-dev/client.toml
    put = client.execute("kv", "user-1", "put", {"key": "name", "value": "Ada"})
    print(client.query("kv", "user-1", "get", {"key": "name"}, after=put.receipt).value)

The stubs in :mod:`cellfleet.v1` are generated from the repository's
``proto/`` (``scripts/python-package.sh --regenerate``); a test checks they
are current.
"""

from cellfleet.client import (
    AsyncClient,
    CellfleetError,
    Client,
    Config,
    ConfigError,
    Executed,
    Queried,
    Receipt,
    Refused,
    Resolved,
    RetryPolicy,
    TransportError,
    UnknownOutcome,
    Unreachable,
    after_failure,
)

__all__ = [
    "AsyncClient", "CellfleetError", "Client", "Config", "ConfigError", "Executed",
    "Queried", "Receipt", "Refused", "Resolved", "RetryPolicy", "TransportError",
    "UnknownOutcome", "Unreachable", "after_failure",
]
