# shellcheck shell=bash
# Sourced by the instruction-count scripts: a one-node `cellfleet dev`
# cluster whose node runs under valgrind's callgrind.
#
#   callgrind_node_start CELLFLEET PORT_BASE   sets $work (a temporary
#       directory, removed on exit) and $node_pid; returns once the node
#       is ready, or exits 1 with its log. CELLFLEET_COST_LIMITS, if set,
#       is added to the node's TOML as its [limits] table (for example
#       "cells_open_max = 256", to count a node past its open-Cell limit).
#   callgrind_node_count                       dumps the node's counters
#       and prints the instructions since the last `callgrind_control -z`.

# A failing command inside $(...) fails the script too.
shopt -s inherit_errexit

work="$(mktemp -d)"
node_pid=""
callgrind_node_cleanup() {
    if [ -n "$node_pid" ]; then
        kill "$node_pid" 2>/dev/null || true
        wait "$node_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap callgrind_node_cleanup EXIT

callgrind_node_start() {
    local cellfleet="$1" port_base="$2"
    "$cellfleet" dev --nodes 1 --data "$work/d" --port-base "$port_base" --no-start >/dev/null
    if [ -n "${CELLFLEET_COST_LIMITS:-}" ]; then
        printf '\n[limits]\n%s\n' "$CELLFLEET_COST_LIMITS" >>"$work/d/n1.toml"
    fi
    valgrind --tool=callgrind --callgrind-out-file="$work/node.out" \
        "$cellfleet" node --config "$work/d/n1.toml" >"$work/node.log" 2>&1 &
    node_pid=$!
    for _ in $(seq 1 120); do
        if grep -q ' ready ' "$work/node.log"; then return 0; fi
        if ! kill -0 "$node_pid" 2>/dev/null; then
            echo "the node under valgrind exited:" >&2
            cat "$work/node.log" >&2
            exit 1
        fi
        sleep 1
    done
    echo "the node under valgrind was not ready after 120 s:" >&2
    cat "$work/node.log" >&2
    exit 1
}

# Prints the count; with KEEP set, also copies the dump to KEEP. Exits 1
# when no dump appears (callers run it in $(...): see inherit_errexit).
callgrind_node_count() {
    local keep="${1:-}" dump=""
    callgrind_control -d "$node_pid" >/dev/null 2>&1
    for _ in $(seq 1 50); do
        dump=$(ls -t "$work"/node.out.* 2>/dev/null | head -1 || true)
        if [ -n "$dump" ] && grep -q '^totals:' "$dump"; then break; fi
        sleep 0.2
    done
    if [ -z "$dump" ] || ! grep -q '^totals:' "$dump"; then
        echo "callgrind wrote no dump of the node's counters" >&2
        exit 1
    fi
    sed -n 's/^totals: *\([0-9]*\).*/\1/p' "$dump"
    if [ -n "$keep" ]; then
        cp "$dump" "$keep"
    fi
    rm -f "$work"/node.out.*
}
