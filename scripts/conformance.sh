#!/usr/bin/env bash
# Runs the public Durable Streams server conformance suite (npm
# @durable-streams/server-conformance-tests 0.3.6, pinned by
# conformance/package-lock.json) against a Cellfleet streams server.
#
#   scripts/conformance.sh                 # builds and starts a single node
#                                          # (crates/streams example) with a
#                                          # 500 ms long-poll timeout
#   scripts/conformance.sh http://HOST:PORT [vitest args]   # a running server
#   scripts/conformance.sh --install-only  # installs Node and the suite, checks
#                                          # vitest runs, and says which versions
#
# The server must use a long-poll timeout well under the per-test timeout
# (see below); 500 ms is what the suite's own harness uses. DS_SUBSCRIPTIONS=1
# includes the opt-in subscription tests. Node and npm come from
# scripts/node.sh (a pinned Node 22.20.0 from PyPI; it says why). Output ends
# with vitest's "Tests  N passed | M failed" summary; the exit code is
# vitest's. A failed install exits 3 before any server starts, naming the
# Node and npm it used, so it is never mistaken for a suite that ran 0 tests.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=${DS_CONFORMANCE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cellfleet-ds-conformance}
mkdir -p "$work"
# One installer at a time (test binaries and people may run this at once).
exec 8>"$work.lock"
flock 8
# DS_CONFORMANCE_SRC replaces conformance/ (the install step's own test
# gives it a lock file npm must refuse).
src=${DS_CONFORMANCE_SRC:-$root/conformance}
cp "$src/package.json" "$src/package-lock.json" "$src/conformance.test.mjs" "$work/"

node_bin=$(bash "$root/scripts/node.sh")
export PATH="$node_bin:$PATH"
versions="node $(node --version), npm $(npm --version) from $node_bin"
install_failed() {
  echo "conformance install FAILED with $versions: $1" >&2
  echo "(scripts/node.sh picks Node; CELLFLEET_NODE_SYSTEM=1 would use the system's)" >&2
  exit 3
}
pushd "$work" >/dev/null
# Install exactly the locked tree; again whenever the lock file changes.
if [ ! -d node_modules/@durable-streams/server-conformance-tests ] ||
   ! cmp -s package-lock.json node_modules/.cellfleet-installed-lock; then
  rm -f node_modules/.cellfleet-installed-lock
  npm ci --no-audit --no-fund --loglevel=error >npm-ci.log 2>&1 ||
    install_failed "npm ci refused or failed:
$(cat npm-ci.log)"
  cp package-lock.json node_modules/.cellfleet-installed-lock
fi
vitest_version=$(npx --no-install vitest --version 2>&1) ||
  install_failed "vitest does not run: $vitest_version"
flock -u 8
popd >/dev/null
if [ "${1:-}" = --install-only ]; then
  echo "conformance suite installed: $versions, vitest $vitest_version"
  exit 0
fi
url=${1:-}
[ $# -gt 0 ] && shift
server_pid=
cleanup() { [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null || true; }
trap cleanup EXIT
if [ -z "$url" ]; then
  cargo build --quiet -p cellfleet-streams --example streams_server --manifest-path "$root/Cargo.toml"
  target=$(cargo metadata --format-version 1 --no-deps --manifest-path "$root/Cargo.toml" \
    | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
  # Port 0 unless DS_PORT says otherwise: a fixed port could be another
  # server's, which the suite would then test instead.
  log=$(mktemp)
  "$target/debug/examples/streams_server" "127.0.0.1:${DS_PORT:-0}" "${DS_LONG_POLL_MS:-500}" >"$log" 2>&1 &
  server_pid=$!
  for _ in $(seq 300); do
    url=$(sed -n 's/^serving durable streams on \(http:[^ ]*\)$/\1/p' "$log")
    [ -n "$url" ] && break
    kill -0 "$server_pid" 2>/dev/null || { cat "$log" >&2; exit 1; }
    sleep 0.1
  done
  [ -n "$url" ] || { echo "the streams server did not start:" >&2; cat "$log" >&2; exit 1; }
fi

cd "$work"
# The fast-check property tests make hundreds of sequential requests each;
# on a slow or shared machine they outlast vitest's 5 s per-test default,
# which says nothing about conformance, so each test gets
# DS_TEST_TIMEOUT_MS (30 s unless set).
DS_URL="$url" npx --no-install vitest run conformance.test.mjs --reporter=default \
  --testTimeout="${DS_TEST_TIMEOUT_MS:-30000}" "$@"
