#!/usr/bin/env bash
# Runs the Durable Streams conformance suite (scripts/conformance.sh)
# against a non-owner: a 3-node cluster on the embedded local store whose
# node n1 is ingress-only (live lease, serves and forwards, never a
# placement target), so every stream the suite creates through n1 is owned
# by n2 or n3 and each request is routed over the mTLS peer channel.
#
#   scripts/conformance-cluster.sh [vitest args]
#
# Listeners take kernel-chosen ports; the long-poll timeout is 500 ms (what
# the suite needs). The cluster is stopped on exit. Every request makes one
# more hop than on a single node, and the fast-check property tests make
# hundreds of sequential requests each (scripts/conformance.sh gives each
# test DS_TEST_TIMEOUT_MS, 30 s by default).
# After the suite, the script prints how many stream Cells exist and how
# many n1 owns (0 expected) and fails if n1 owns any. CELLFLEET_DIR keeps the cluster's
# files in that directory instead of a temporary one; CELLFLEET_BIN names a
# built cellfleet binary to use instead of building one.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${CELLFLEET_BIN:-}
if [ -z "$bin" ]; then
  cargo build --quiet -p cellfleet --manifest-path "$root/Cargo.toml"
  target=$(cargo metadata --format-version 1 --no-deps --manifest-path "$root/Cargo.toml" \
    | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
  bin="$target/debug/cellfleet"
fi
dir=${CELLFLEET_DIR:-$(mktemp -d)}
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  [ -z "${CELLFLEET_DIR:-}" ] && rm -rf "$dir"
  return 0
}
trap cleanup EXIT
"$bin" dev --no-start --data "$dir" --nodes 3 --lease-ms 5000 >/dev/null
for i in 1 2 3; do
  sed -i '/^streams = /a streams_long_poll_ms = 500' "$dir/n$i.toml"
done
export CELLFLEET_LISTEN_CLIENT=127.0.0.1:0 CELLFLEET_LISTEN_PEER=127.0.0.1:0 \
  CELLFLEET_LISTEN_HTTP=127.0.0.1:0 CELLFLEET_LISTEN_STREAMS=127.0.0.1:0 \
  CELLFLEET_LISTEN_CONSOLE=127.0.0.1:0
for i in 1 2 3; do
  ingress=0
  [ "$i" = 1 ] && ingress=1
  CELLFLEET_INGRESS_ONLY=$ingress "$bin" node --config "$dir/n$i.toml" \
    >"$dir/n$i.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 600); do
    grep -q " ready client=" "$dir/n$i.log" && break
    kill -0 "${pids[-1]}" 2>/dev/null || { cat "$dir/n$i.log"; exit 1; }
    sleep 0.1
  done
  grep -q " ready client=" "$dir/n$i.log" || { echo "n$i did not start" >&2; cat "$dir/n$i.log"; exit 1; }
done
url=$(sed -n 's/.* streams=\(http:[^ ]*\).*/\1/p' "$dir/n1.log" | head -1)
admin=$(sed -n 's/.* ready client=\([^ ]*\).*/\1/p' "$dir/n2.log" | head -1)
echo "3-node cluster in $dir; suite against ingress-only n1 at $url"
status=0
bash "$root/scripts/conformance.sh" "$url" "$@" ||
  status=$?
# Stream Cells in one page of the admin listing (at most 1,000; "+" when more).
cells() {
  local json
  json=$("$bin" cells --config "$dir/client.toml" --node "$admin" --limit 1000 --json "$@") || {
    echo "?"
    return 0
  }
  local count
  count=$(grep -o '"kind":"stream"' <<<"$json" | wc -l)
  grep -q '"next_page_token":""' <<<"$json" || count="$count+"
  echo "$count"
}
total=$(cells)
on_ingress=$(cells --owner n1)
echo "stream Cells: $total, owned by the ingress node n1: $on_ingress"
[ "$on_ingress" = 0 ] || status=1
exit $status
