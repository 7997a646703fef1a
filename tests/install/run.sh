#!/bin/sh
# The install test, run by `make test`: `make install` into a temporary
# staging directory (DESTDIR, PREFIX as built), then from / the installed
# program finds its shipped GPU profiles and models by name (so from its
# own prefix, not the source tree), an example links with
# `pkg-config --libs vramplan`, man shows the page, and the Python package
# imports with PYTHONPATH set as the README says. Prints the checks and a
# Criterion-style synthesis line that `make test` adds up.
MAKE=${MAKE:-make}
PKG_CONFIG=${PKG_CONFIG:-pkg-config}
PY=${PYTHON:-python3}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/vramplan-install.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
src=$(pwd)
passed=0 failed=0

check() { # NAME COMMAND...: passes when the command exits 0
    name=$1; shift
    if out=$("$@" 2>&1); then
        passed=$((passed + 1)); echo "[PASS] install::$name"
    else
        failed=$((failed + 1)); echo "[FAIL] install::$name"
        printf '%s\n' "$out" | sed 's/^/    /' | tail -n 15
    fi
}

prefix=$($MAKE -s --no-print-directory -C "$src" print-prefix \
         SANITIZE="$VP_SANITIZE")
root="$tmp/stage$prefix"
check make_install $MAKE -s --no-print-directory -C "$src" install \
    DESTDIR="$tmp/stage" SANITIZE="$VP_SANITIZE"

# from /, by name: the model and the GPU come from the staged prefix
estimate_by_name() {
    cd / && "$root/bin/vramplan" estimate llama-3-8b --gpu h100-80g \
        --precision bf16 --checkpoint all --format json >"$tmp/est.json" &&
    grep -q "\"model_path\": \"$root/share/vramplan/models/llama-3-8b.yaml\"" \
        "$tmp/est.json"
}
check estimate_by_name_from_root estimate_by_name

unknown_gpu_names_the_dirs() {
    cd / && ! "$root/bin/vramplan" estimate mlp10 --gpu h100-80 \
        2>"$tmp/err" >/dev/null &&
    grep -q "did you mean 'h100-80g'.*$root/share/vramplan/gpus" "$tmp/err"
}
check unknown_gpu_names_the_dirs unknown_gpu_names_the_dirs

soname_link() {
    [ -L "$root/lib/libvramplan.so" ] &&
    [ -L "$root/lib/libvramplan.so.0" ] &&
    readelf -d "$root/lib/libvramplan.so.0" | grep -q 'SONAME.*libvramplan.so.0'
}
check shared_library_soname soname_link

link_example() {
    PKG_CONFIG_PATH="$root/lib/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$tmp/stage" \
        $PKG_CONFIG --cflags --libs vramplan >"$tmp/flags" &&
    ${CC:-cc} -std=c11 $VP_SAN_FLAGS -o "$tmp/example" \
        "$src/tests/install/example.c" $(cat "$tmp/flags") &&
    cd / && LD_LIBRARY_PATH="$root/lib" "$tmp/example" >"$tmp/ex.out" &&
    grep -q "^$root/share/vramplan/models/mlp10.yaml peak_alloc [1-9]" \
        "$tmp/ex.out"
}
check pkg_config_links_an_example link_example

man_page() {
    MANPATH="$root/share/man" man vramplan 2>/dev/null | grep -q 'vramplan watch'
}
check man_shows_the_page man_page

# an instrumented library needs the sanitizer runtime first in python3
preload=
case ",$VP_SANITIZE," in
*,address,*) preload=$(${CC:-cc} -print-file-name=libasan.so) ;;
esac
python_import() {
    cd / && PYTHONPATH="$root/lib/vramplan/python" VRAMPLAN_LIB= \
        PYTHONDONTWRITEBYTECODE=1 LD_PRELOAD=$preload \
        ASAN_OPTIONS=detect_leaks=0 "$PY" -c '
import vramplan, sys
e = vramplan.estimate("mlp10")
assert vramplan.library_path().startswith(sys.argv[1] + "/lib/"), \
    vramplan.library_path()
assert e["model_path"].startswith(sys.argv[1] + "/share/vramplan/"), \
    e["model_path"]
' "$root"
}
check python_imports_from_the_prefix python_import

uninstall() {
    $MAKE -s --no-print-directory -C "$src" uninstall DESTDIR="$tmp/stage" \
        SANITIZE="$VP_SANITIZE" &&
    [ -z "$(find "$tmp/stage" -type f)" ]
}
check uninstall_removes_every_file uninstall

echo "[====] Synthesis: Tested: $((passed + failed)) | Passing: $passed |" \
     "Failing: $failed | Crashing: 0"
[ "$failed" -eq 0 ]
