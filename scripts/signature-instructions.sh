#!/usr/bin/env bash
# What checking one envelope signature costs, alone (`verify_strict`) and
# in batches of B (`signing::verify_many`, what a busy node's batch thread
# does), in instructions counted by valgrind (callgrind): repeatable
# whatever else the machine does.
#
# Each case runs crates/router/examples/signature_cost.rs with N and 2N
# signatures; (count(2N) - count(N)) / N is the cost of one, process start
# cancelled out. The example signs its messages in every case, so the
# same figure for signing alone is subtracted.
#
#   scripts/signature-instructions.sh [N]      (default N = 512)
set -euo pipefail
cd "$(dirname "$0")/.."
N="${1:-512}"
if ! command -v valgrind >/dev/null; then
    echo "valgrind is not installed (apt-get install valgrind)" >&2
    exit 1
fi
cargo build --release -q -p cellfleet-router --example signature_cost
BIN=target/release/examples/signature_cost

count() { # ARGS... (the last one is the number of signatures) -> instructions
    valgrind --tool=callgrind --callgrind-out-file=/dev/null "$BIN" "$@" 2>&1 |
        sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}

per_signature() { # MODE [B] -> instructions per signature, signing included
    local one two
    one=$(count "$@" "$N")
    two=$(count "$@" $((2 * N)))
    echo $(((two - one) / N))
}

sign=$(per_signature sign)
strict=$(($(per_signature strict) - sign))
printf '%-12s %18s %12s\n' "check" "instr/signature" "x strict"
printf '%-12s %18s %12s\n' "strict" "$strict" "1.00"
for size in 2 4 8 16 64; do
    value=$(($(per_signature batch "$size") - sign))
    ratio=$(awk -v a="$value" -v b="$strict" 'BEGIN { printf "%.2f", a / b }')
    printf '%-12s %18s %12s\n' "batch $size" "$value" "$ratio"
done
echo "(signing alone: $sign instructions per signature, subtracted; N = $N)"
