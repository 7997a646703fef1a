#!/usr/bin/env bash
# Instructions per allocator event of this tree's simulator and of the
# issue's baseline (make bench-instr): callgrind counts the instructions
# inside vp_simulate of one simulation of each bench_sim setup, for each
# simulator; deterministic, unlike the CPU times of make bench.
#   bench/instr.sh BENCH_SIM_BINARY
set -euo pipefail
bin=$1
n=$("$bin" --once | wc -l)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
count() { # mode k -> "events instructions"
    local ev ir
    ev=$(valgrind --tool=callgrind --callgrind-out-file="$out/cg" \
             --toggle-collect=vp_simulate "$bin" "$1" "$2" 2>"$out/log" |
         awk '{print $2}')
    ir=$(awk '/Collected :/ {print $NF}' "$out/log")
    echo "$ev $ir"
}
printf '  %-22s %10s %12s %10s %10s\n' setup events instructions 'per event' ratio
for ((k = 0; k < n; k++)); do
    name=$("$bin" --once "$k" | awk '{print $1}')
    read -r ev ir < <(count --once "$k")
    read -r bev bir < <(count --once-base "$k")
    awk -v n="$name" -v ev="$ev" -v ir="$ir" -v bev="$bev" -v bir="$bir" 'BEGIN {
        printf "  %-22s %10d %12d %10.0f\n", n, ev, ir, ir / ev
        printf "  %-22s %10d %12d %10.0f %9.2fx\n", "  baseline", bev, bir,
               bir / bev, (bir / bev) / (ir / ev) }'
done
