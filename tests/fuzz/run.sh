#!/usr/bin/env bash
# Replays fuzz/corpus/HARNESS/ (the inputs the fuzzing found, each a
# regression test) and a few seeds through every harness built without
# libFuzzer ($VP_FUZZ_REPLAYS, from make test): each must end, within
# 5 s, without a sanitizer report. Prints a Criterion-like synthesis.
set -u
cd "$(dirname "$0")/../.."
passed=0 failed=0
for bin in $VP_FUZZ_REPLAYS; do
    h=${bin##*/replay_}
    inputs=()
    [ -d "fuzz/corpus/$h" ] && inputs+=("fuzz/corpus/$h")
    case $h in
    model | sim) inputs+=(models/mlp10.yaml models/gpt2-small.yaml) ;;
    gpu) inputs+=(gpus/h200.yaml) ;;
    case) inputs+=(tests/data/validate/cases.jsonl) ;;
    lengths) inputs+=(tests/data/batching/hist.txt tests/data/batching/crlf.txt) ;;
    config) inputs+=(tests/data/hf/gpt2-medium.json tests/data/hf/deepseek-v3.json) ;;
    esac
    if out=$(timeout 60 "./$bin" "${inputs[@]}" 2>&1); then
        echo "[PASS] fuzz::$h: $out"
        passed=$((passed + 1))
    else
        printf '%s\n' "$out" | tail -n 30
        echo "[FAIL] fuzz::$h"
        failed=$((failed + 1))
    fi
done
echo "[====] Synthesis: Tested: $((passed + failed)) | Passing: $passed |" \
     "Failing: $failed | Crashing: 0"
[ "$failed" -eq 0 ]
