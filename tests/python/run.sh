#!/bin/sh
# The Python package's tests (tests/python/test_*.py), run by `make test`
# with the system python3 against the library just built (VRAMPLAN_LIB),
# and counted like the Criterion programs: the last line is Criterion's
# "Synthesis: Tested: N | Passing: P | Failing: F | Crashing: 0".
#
# Under SANITIZE the library is instrumented and python3 is not, so the
# sanitizer runtime is preloaded and leak detection is off (the
# interpreter keeps memory until exit by design).
PY=${PYTHON:-python3}
if ! command -v "$PY" >/dev/null 2>&1; then
    echo "tests/python: $PY NOT FOUND: the Python package cannot be tested" \
         "(install python3, or run make deps)" >&2
    echo "[====] Synthesis: Tested: 1 | Passing: 0 | Failing: 1 | Crashing: 0"
    exit 1
fi
if [ -n "$VP_SANITIZE" ]; then
    case ",$VP_SANITIZE," in
    *,address,*)
        rt=$(${CC:-cc} -print-file-name=libasan.so)
        export LD_PRELOAD="$rt${LD_PRELOAD:+:$LD_PRELOAD}"
        export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1" ;;
    esac
fi
export PYTHONPATH="python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1
exec "$PY" tests/python/runner.py
