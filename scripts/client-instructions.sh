#!/usr/bin/env bash
# What the client library (cellfleet-client) adds to a query, in
# instructions counted by valgrind (callgrind): repeatable whatever else
# the machine does, unlike queries/s on shared cores.
#
# A one-node `cellfleet dev` cluster runs under callgrind; the example
# crates/client/examples/query_cost.rs sends N and then 2N queries of one
# Cell, once as the raw tonic call (signed, sent to the owner, result left
# as bytes) and once through `Client::query` (routing, retry rule, result
# parsed), then N and 2N commands through `Client::execute` (`kv` `put`).
# Per request = (count(2N) - count(N)) / N, in the client process and,
# between zero and dump of its counters, in the node. The library's share
# of a query's cost is (library - raw) / (raw client + node).
#
#   scripts/client-instructions.sh [N]      (default N = 1000)
# CELLFLEET_COST_PORT_BASE moves the node's ports (default 17400);
# CELLFLEET_COST_BIN runs that `cellfleet` binary as the node instead of
# this checkout's release build (to compare two builds).
set -euo pipefail
# Paths the caller gives are relative to where it runs this script.
if [[ "${CELLFLEET_COST_BIN:-}" == */* ]]; then
    CELLFLEET_COST_BIN="$(realpath -m -- "$CELLFLEET_COST_BIN")"
fi
cd "$(dirname "$0")/.."
N="${1:-1000}"
PORT_BASE="${CELLFLEET_COST_PORT_BASE:-17400}"
for tool in valgrind callgrind_control; do
    if ! command -v "$tool" >/dev/null; then
        echo "$tool is not installed (apt-get install valgrind)" >&2
        exit 1
    fi
done
cargo build --release -q -p cellfleet --bin cellfleet
cargo build --release -q -p cellfleet-client --example query_cost
CELLFLEET="${CELLFLEET_COST_BIN:-target/release/cellfleet}"
CLIENT=target/release/examples/query_cost

# shellcheck source=lib/callgrind-node.sh
source scripts/lib/callgrind-node.sh
callgrind_node_start "$CELLFLEET" "$PORT_BASE"
config="$work/d/client.toml"
"$CLIENT" --config "$config" raw 10 >/dev/null # the Cell exists, warm

# One run of VARIANT with COUNT queries: "client node" instructions.
run() {
    local client node
    callgrind_control -z "$node_pid" >/dev/null 2>&1
    client=$(valgrind --tool=callgrind --callgrind-out-file=/dev/null \
        "$CLIENT" --config "$config" "$1" "$2" 2>&1 |
        sed -n 's/.*Collected : \([0-9]*\).*/\1/p')
    node=$(callgrind_node_count)
    echo "$client $node"
}

declare -A client_cost node_cost
for variant in raw library command; do
    read -r c1 n1 <<<"$(run "$variant" "$N")"
    read -r c2 n2 <<<"$(run "$variant" $((2 * N)))"
    client_cost[$variant]=$(((c2 - c1) / N))
    node_cost[$variant]=$(((n2 - n1) / N))
done

printf '%-8s %16s %16s %16s\n' "variant" "client instr" "node instr" "total instr"
for variant in raw library command; do
    printf '%-8s %16s %16s %16s\n' "$variant" "${client_cost[$variant]}" \
        "${node_cost[$variant]}" $((client_cost[$variant] + node_cost[$variant]))
done
added=$((client_cost[library] - client_cost[raw]))
awk -v added="$added" -v client="${client_cost[raw]}" -v node="${node_cost[raw]}" 'BEGIN {
    printf "library adds %d instructions per query: %.2f%% of the raw call'"'"'s client side, %.2f%% of a query'"'"'s cost (client + node)\n",
        added, 100 * added / client, 100 * added / (client + node)
}'
echo "(per request: a query for raw and library, a command for command; N = $N requests;"
echo " set-up cancelled by the 2N - N difference; one node, local store)"
