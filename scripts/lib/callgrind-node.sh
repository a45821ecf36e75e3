# shellcheck shell=bash
# Sourced by the instruction-count scripts: a `cellfleet dev` cluster
# whose nodes run under valgrind's callgrind.
#
#   callgrind_node_start CELLFLEET PORT_BASE [NODES]   sets $work (a
#       temporary directory, removed on exit), $node_pids (n1, n2, ... in
#       order; NODES defaults to 1) and $node_pid (n1's); returns once
#       every node is ready, or exits 1 with the log of the one that is
#       not. CELLFLEET_COST_LIMITS, if set, is added to each node's TOML as
#       its [limits] table (for example "cells_open_max = 256", to count a
#       node past its open-Cell limit).
#   callgrind_node_count [KEEP] [INDEX]   dumps the counters of node INDEX
#       (0 for n1, the default) and prints the instructions since its last
#       `callgrind_control -z`; with KEEP set, also copies the dump there.

# A failing command inside $(...) fails the script too.
shopt -s inherit_errexit

work="$(mktemp -d)"
node_pid=""
node_pids=()
callgrind_node_cleanup() {
    local pid
    for pid in "${node_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${node_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$work"
}
trap callgrind_node_cleanup EXIT

callgrind_node_start() {
    local cellfleet="$1" port_base="$2" nodes="${3:-1}" i node
    "$cellfleet" dev --nodes "$nodes" --data "$work/d" --port-base "$port_base" --no-start >/dev/null
    for i in $(seq 1 "$nodes"); do
        node="n$i"
        if [ -n "${CELLFLEET_COST_LIMITS:-}" ]; then
            printf '\n[limits]\n%s\n' "$CELLFLEET_COST_LIMITS" >>"$work/d/$node.toml"
        fi
        valgrind --tool=callgrind --callgrind-out-file="$work/$node.out" \
            "$cellfleet" node --config "$work/d/$node.toml" >"$work/$node.log" 2>&1 &
        node_pids+=($!)
    done
    node_pid="${node_pids[0]}"
    for i in $(seq 1 "$nodes"); do
        node="n$i"
        for _ in $(seq 1 120); do
            if grep -q ' ready ' "$work/$node.log"; then continue 2; fi
            if ! kill -0 "${node_pids[$((i - 1))]}" 2>/dev/null; then
                echo "node $node under valgrind exited:" >&2
                cat "$work/$node.log" >&2
                exit 1
            fi
            sleep 1
        done
        echo "node $node under valgrind was not ready after 120 s:" >&2
        cat "$work/$node.log" >&2
        exit 1
    done
}

# Prints the count; with KEEP set, also copies the dump to KEEP. Exits 1
# when no dump appears (callers run it in $(...): see inherit_errexit).
callgrind_node_count() {
    local keep="${1:-}" index="${2:-0}" dump="" node
    node="n$((index + 1))"
    callgrind_control -d "${node_pids[$index]}" >/dev/null 2>&1
    for _ in $(seq 1 50); do
        dump=$(ls -t "$work/$node.out".* 2>/dev/null | head -1 || true)
        if [ -n "$dump" ] && grep -q '^totals:' "$dump"; then break; fi
        sleep 0.2
    done
    if [ -z "$dump" ] || ! grep -q '^totals:' "$dump"; then
        echo "callgrind wrote no dump of $node's counters" >&2
        exit 1
    fi
    sed -n 's/^totals: *\([0-9]*\).*/\1/p' "$dump"
    if [ -n "$keep" ]; then
        cp "$dump" "$keep"
    fi
    rm -f "$work/$node.out".*
}
