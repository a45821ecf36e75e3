#!/usr/bin/env bash
# Runs the public Durable Streams server conformance suite (npm
# @durable-streams/server-conformance-tests 0.3.6, pinned by
# conformance/package-lock.json) against a Cellfleet streams server.
#
#   scripts/conformance.sh                 # builds and starts a single node
#                                          # (crates/streams example) with a
#                                          # 500 ms long-poll timeout
#   scripts/conformance.sh http://HOST:PORT [vitest args]   # a running server
#
# The server must use a long-poll timeout well under 5 s (vitest's per-test
# timeout); 500 ms is what the suite's own harness uses. DS_SUBSCRIPTIONS=1
# includes the opt-in subscription tests. Output ends with vitest's
# "Tests  N passed | M failed" summary; the exit code is vitest's.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=${DS_CONFORMANCE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cellfleet-ds-conformance}
mkdir -p "$work"
cp "$root/conformance/package.json" "$root/conformance/package-lock.json" \
  "$root/conformance/conformance.test.mjs" "$work/"

url=${1:-}
[ $# -gt 0 ] && shift
server_pid=
cleanup() { [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null || true; }
trap cleanup EXIT
if [ -z "$url" ]; then
  port=${DS_PORT:-4437}
  cargo build --quiet -p cellfleet-streams --example streams_server --manifest-path "$root/Cargo.toml"
  target=$(cargo metadata --format-version 1 --no-deps --manifest-path "$root/Cargo.toml" \
    | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
  "$target/debug/examples/streams_server" "127.0.0.1:$port" "${DS_LONG_POLL_MS:-500}" &
  server_pid=$!
  url="http://127.0.0.1:$port"
  for _ in $(seq 100); do
    curl -s -o /dev/null "$url/" && break
    sleep 0.1
  done
fi

cd "$work"
if [ ! -d node_modules/@durable-streams/server-conformance-tests ]; then
  npm install --no-audit --no-fund --loglevel=error
fi
DS_URL="$url" npx --no-install vitest run conformance.test.mjs --reporter=default "$@"
