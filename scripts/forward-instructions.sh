#!/usr/bin/env bash
# What a forwarded query costs the two nodes it reaches, in instructions
# counted by valgrind (callgrind): repeatable whatever else the machine
# does.
#
# A two-node `cellfleet dev` cluster runs with both nodes under callgrind;
# the example crates/client/examples/query_cost.rs sends N and then 2N
# queries of one Cell, once straight to its owner (`raw`) and once to the
# other node, which forwards each to the owner (`forwarded`). Per query =
# (count(2N) - count(N)) / N, per node, between zero and dump of its
# counters. The forward's cost is forwarded - raw, both nodes summed.
#
#   scripts/forward-instructions.sh [N]      (default N = 500)
# CELLFLEET_COST_PORT_BASE moves the nodes' ports (default 17500);
# CELLFLEET_COST_BIN runs that `cellfleet` binary as the nodes instead of
# this checkout's release build (to compare two builds).
set -euo pipefail
if [[ "${CELLFLEET_COST_BIN:-}" == */* ]]; then
    CELLFLEET_COST_BIN="$(realpath -m -- "$CELLFLEET_COST_BIN")"
fi
cd "$(dirname "$0")/.."
N="${1:-500}"
PORT_BASE="${CELLFLEET_COST_PORT_BASE:-17500}"
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
callgrind_node_start "$CELLFLEET" "$PORT_BASE" 2
config="$work/d/client.toml"
"$CLIENT" --config "$config" raw 10 >/dev/null # the Cell exists, warm
"$CLIENT" --config "$config" forwarded 10 >/dev/null # the peer channel too

# One run of VARIANT with COUNT queries: "n1 n2" instructions.
run() {
    callgrind_control -z "${node_pids[0]}" >/dev/null 2>&1
    callgrind_control -z "${node_pids[1]}" >/dev/null 2>&1
    "$CLIENT" --config "$config" "$1" "$2" >/dev/null
    echo "$(callgrind_node_count "" 0) $(callgrind_node_count "" 1)"
}

declare -A n1_cost n2_cost
for variant in raw forwarded; do
    read -r a1 b1 <<<"$(run "$variant" "$N")"
    read -r a2 b2 <<<"$(run "$variant" $((2 * N)))"
    n1_cost[$variant]=$(((a2 - a1) / N))
    n2_cost[$variant]=$(((b2 - b1) / N))
done

printf '%-10s %14s %14s %14s\n' "variant" "n1 instr" "n2 instr" "both"
for variant in raw forwarded; do
    printf '%-10s %14s %14s %14s\n' "$variant" "${n1_cost[$variant]}" "${n2_cost[$variant]}" \
        $((n1_cost[$variant] + n2_cost[$variant]))
done
raw=$((n1_cost[raw] + n2_cost[raw]))
forwarded=$((n1_cost[forwarded] + n2_cost[forwarded]))
echo "the forward adds $((forwarded - raw)) node instructions per query ($(awk -v f="$forwarded" -v r="$raw" 'BEGIN { printf "%.2f", f / r }')x a query its owner receives)"
echo "(per query; N = $N queries; set-up cancelled by the 2N - N difference; two nodes, local store)"
