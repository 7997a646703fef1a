#!/bin/sh
# The style check of `make test` (issue 17): no function in src/ over 150
# lines (scripts/func_length.py lists the ones that are). Prints a
# Criterion-style synthesis line that `make test` adds up.
cd "$(dirname "$0")/../.." || exit 1
PY=${PYTHON:-python3}
if out=$("$PY" scripts/func_length.py --max 150 src 2>&1); then
    echo "[PASS] style::functions_at_most_150_lines"
    passed=1 failed=0
else
    echo "[FAIL] style::functions_at_most_150_lines"
    printf '%s\n' "$out" | sed 's/^/    /'
    passed=0 failed=1
fi
echo "[====] Synthesis: Tested: $((passed + failed)) | Passing: $passed |" \
     "Failing: $failed | Crashing: 0"
[ "$failed" -eq 0 ]
