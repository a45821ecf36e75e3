#!/usr/bin/env bash
# What one Durable Streams append costs the node, in instructions counted
# by valgrind (callgrind): repeatable whatever else the machine does,
# unlike appends/s on shared cores.
#
# A one-node `cellfleet dev` cluster (local store) runs under callgrind.
# A small HTTP client (python3, one keep-alive connection) creates STREAMS
# streams, appends a few times to each so they are open and warm, then
# sends N and then 2N appends of 256 bytes, round robin over the streams.
# Per append = (count(2N) - count(N)) / N, between zero and dump of the
# node's counters: the whole path (HTTP, routing, actor, SQLite, capture,
# node log, local store) with set-up and warm-up cancelled.
#
# Read with care: valgrind's CPU has no SHA extensions, so SHA-256 (the
# local store's ETags, command digests, Cell ids) runs the sha2 crate's
# software path here, about a quarter of the count, where a CPU with
# SHA-NI (perf, same workload) puts under 1% of the node's samples in it.
# The count also grows with the streams' size (checkpoints merge more
# records), so compare builds at the same N and STREAMS.
#
#   scripts/stream-instructions.sh [N] [STREAMS] [OP]
#       (defaults 1000, 50 and append). OP "create" counts creations
#       instead: N and then 2N new streams (PUT, empty), after the same
#       set-up, so the figure is per stream created. It includes the idle
#       checkpoints of earlier streams that fall due during the run, which
#       depend on time (a slower build sees more of them); the engine's own
#       share is Cell::open and Cell::execute in a dump kept with
#       CELLFLEET_COST_KEEP.
# CELLFLEET_COST_PORT_BASE moves the node's ports (default 17450);
# CELLFLEET_COST_BIN runs that `cellfleet` binary instead of this
# checkout's release build (to compare two builds); CELLFLEET_COST_KEEP=P
# keeps the two callgrind dumps as P.N and P.2N.
set -euo pipefail
# Paths the caller gives are relative to where it runs this script.
if [[ "${CELLFLEET_COST_BIN:-}" == */* ]]; then
    CELLFLEET_COST_BIN="$(realpath -m -- "$CELLFLEET_COST_BIN")"
fi
if [ -n "${CELLFLEET_COST_KEEP:-}" ]; then
    CELLFLEET_COST_KEEP="$(realpath -m -- "$CELLFLEET_COST_KEEP")"
fi
cd "$(dirname "$0")/.."
N="${1:-1000}"
STREAMS="${2:-50}"
OP="${3:-append}"
PORT_BASE="${CELLFLEET_COST_PORT_BASE:-17450}"
if ! [[ "$N" =~ ^[1-9][0-9]*$ && "$STREAMS" =~ ^[1-9][0-9]*$ ]]; then
    echo "N and STREAMS must be whole numbers of at least 1" >&2
    exit 1
fi
if [[ "$OP" != append && "$OP" != create ]]; then
    echo "OP must be append or create, not '$OP'" >&2
    exit 1
fi
for tool in valgrind callgrind_control python3; do
    if ! command -v "$tool" >/dev/null; then
        echo "$tool is not installed (apt-get install valgrind python3)" >&2
        exit 1
    fi
done
if [ -z "${CELLFLEET_COST_BIN:-}" ]; then
    cargo build --release -q -p cellfleet --bin cellfleet
fi
CELLFLEET="${CELLFLEET_COST_BIN:-target/release/cellfleet}"
STREAMS_PORT=$((PORT_BASE + 301))

# shellcheck source=lib/callgrind-node.sh
source scripts/lib/callgrind-node.sh
callgrind_node_start "$CELLFLEET" "$PORT_BASE"

# client.py MODE COUNT STREAMS PORT [TAG]: MODE "setup" creates the
# streams and appends to each twice; "append" sends COUNT appends round
# robin; "create" creates COUNT new streams named after TAG. Exits non-zero
# on any answer other than the protocol's success.
cat >"$work/client.py" <<'EOF'
import http.client, os, sys
mode, count, streams, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
body = os.urandom(256)
def call(method, path, data, want):
    conn.request(method, path, body=data, headers={"Content-Type": "application/octet-stream"})
    r = conn.getresponse()
    r.read()
    if r.status not in want:
        sys.exit(f"{method} {path}: HTTP {r.status}")
if mode == "setup":
    for s in range(streams):
        call("PUT", f"/v1/stream/cost-{s}", b"", (200, 201))
    for _ in range(2):
        for s in range(streams):
            call("POST", f"/v1/stream/cost-{s}", body, (200, 204))
elif mode == "create":
    for i in range(count):
        call("PUT", f"/v1/stream/new-{sys.argv[5]}-{i}", b"", (201,))
else:
    for i in range(count):
        call("POST", f"/v1/stream/cost-{i % streams}", body, (200, 204))
EOF
python3 "$work/client.py" setup 0 "$STREAMS" "$STREAMS_PORT"

# Node instructions for COUNT appends (the dump kept as KEEP.COUNT when
# asked).
run() {
    callgrind_control -z "$node_pid" >/dev/null 2>&1
    python3 "$work/client.py" "$OP" "$1" "$STREAMS" "$STREAMS_PORT" "n$1"
    callgrind_node_count "${CELLFLEET_COST_KEEP:+$CELLFLEET_COST_KEEP.$1}"
}

n1=$(run "$N")
n2=$(run $((2 * N)))
if [ "$OP" = create ]; then
    echo "node instructions per stream created: $(((n2 - n1) / N)) (N: $n1, 2N: $n2)"
    echo "(empty streams, one keep-alive HTTP connection, after $STREAMS streams were set up;"
else
    echo "node instructions per append: $(((n2 - n1) / N)) (N: $n1, 2N: $n2)"
    echo "(256-byte appends, one keep-alive HTTP connection, round robin over $STREAMS open streams;"
fi
echo " N = $N, set-up cancelled by the 2N - N difference; one node, local store)"
