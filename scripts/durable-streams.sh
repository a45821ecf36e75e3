#!/usr/bin/env bash
# The reference Durable Streams server for the streams benchmark: Electric's
# `durable-streams` crate (binary `durable-streams-server`), pinned, installed
# with `cargo install --locked` into a cache dir so later runs reuse it. It
# builds on the project's fixed toolchain (Rust 1.95).
#
#   scripts/durable-streams.sh          install if needed, print the binary path
#
# Start it as the bench does (default storage mode is the WAL):
#   "$(scripts/durable-streams.sh)" --port PORT --data-dir DIR
#
# Settings (env): CELLFLEET_DS_ROOT (install root, default
# ~/.cache/cellfleet-durable-streams).
set -euo pipefail

version=0.1.5
root=${CELLFLEET_DS_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/cellfleet-durable-streams}
bin="$root/bin/durable-streams-server"

if [[ ! -x "$bin" ]] || ! grep -qs "^$version\$" "$root/.version"; then
  # stdout carries only the path: cargo's progress goes to stderr.
  cargo install --locked --version "$version" durable-streams --root "$root" >&2
  echo "$version" > "$root/.version"
fi
echo "$bin"
