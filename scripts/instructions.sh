#!/usr/bin/env bash
# Instructions per command, counted by valgrind (callgrind), repeatable to
# the instruction whatever else the machine does.
#
# Each case runs twice, with N and 2N commands; (count(2N) - count(N)) / N
# is the cost of one command with set-up (open, schema, process start)
# cancelled out. Printed per case, with its ratio to bare SQLite (the same
# insert in its own transaction, the Cell's pragmas). The ledger and engine
# cases run with sequential command ids and with ids spread like the random
# ones clients send (CELL_BENCH_IDS=random, a fixed mix: still repeatable).
#
#   scripts/instructions.sh [N]        (default N = 2000)
set -euo pipefail
cd "$(dirname "$0")/.."
N="${1:-2000}"
if ! command -v valgrind >/dev/null; then
    echo "valgrind is not installed (apt-get install valgrind)" >&2
    exit 1
fi
cargo build --release -q -p cellfleet-cell --example cell_throughput
BIN=target/release/examples/cell_throughput

count() { # VARIANT GROUP COMMANDS -> instructions (ids from $IDS)
    CELL_BENCH_IDS="$IDS" valgrind --tool=callgrind --callgrind-out-file=/dev/null "$BIN" --once "$1" "$2" "$3" 2>&1 \
        | sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}

per_command() { # VARIANT GROUP
    local one two
    one=$(count "$1" "$2" "$N")
    two=$(count "$1" "$2" $((2 * N)))
    echo $(((two - one) / N))
}

printf '%-26s %6s %11s %16s %10s\n' "case" "group" "ids" "instr/command" "x sqlite"
floor=""
for case in "sqlite 16 sequential" "sqlite 1 sequential" "sqlite+ledger+savepoint 16 sequential" \
    "sqlite+ledger+savepoint 16 random" "cell 1 sequential" "cell 16 sequential" \
    "cell 1 random" "cell 16 random"; do
    set -- $case
    IDS=$3
    value=$(per_command "$1" "$2")
    if [ "$1" = sqlite ] && [ "$2" = 16 ]; then floor=$value; fi
    if [ -n "$floor" ]; then
        ratio=$(awk -v a="$value" -v b="$floor" 'BEGIN { printf "%.2f", a / b }')
    else
        ratio="-"
    fi
    printf '%-26s %6s %11s %16s %10s\n' "$1" "$2" "$3" "$value" "$ratio"
done
echo "x sqlite: against bare SQLite at group 16 (N = $N commands; set-up cancelled by the 2N - N difference)"
