#!/bin/sh
# Show a memory snapshot in PyTorch's own viewer, off-line, and take a
# screenshot with headless Chromium.
#
#   scripts/memory_viz_render.sh VIEWER_DIR SNAPSHOT.pickle OUT.png [VIEW]
#
# VIEWER_DIR holds torch/utils/viz/*.js of the torch that wrote or reads the
# snapshot (scripts/snapshot_check.py copies them to OUT/viewer on the GPU
# machine). VIEW is one of the viewer's tabs: 'Active Memory Timeline'
# (default), 'Allocator State History', 'Active Cached Segment Timeline',
# 'Allocator Settings'.
#
# The viewer imports d3 from a CDN; here an import map sends those imports
# to d3's one-file bundle wrapped as a module, installed from the npm
# registry into build/memory-viz/ (npm install d3@7, once). The page is served on
# 127.0.0.1 (Chromium loads no modules from file://) and embeds the
# snapshot as torch.cuda._memory_viz._format_viz does. Needs node/npm,
# python3 and chromium (apt-get install -y chromium).
set -eu
[ $# -ge 3 ] || { sed -n '2,20p' "$0"; exit 2; }
viewer=$1 snap=$2 png=$3 view=${4:-Active Memory Timeline}
work=build/memory-viz
mkdir -p "$work"
if [ ! -f "$work/node_modules/d3/dist/d3.min.js" ]; then
    (cd "$work" && npm install --silent --no-audit --no-fund d3@7)
fi
cp "$viewer"/*.js "$work/"
VIEW=$view python3 - "$snap" "$work/index.html" <<'PY'
import base64, json, os, sys
buf = open(sys.argv[1], "rb").read()
buf += b"\0" * (3 - len(buf) % 3)   # as _format_viz: no '=' padding
files = json.dumps([{"name": os.path.basename(sys.argv[1]),
                     "base64": base64.b64encode(buf).decode()}])
d3 = "./d3-esm.js"
cdn = ["https://cdn.jsdelivr.net/npm/d3@7/+esm",
       "https://cdn.jsdelivr.net/npm/d3-axis@3/+esm",
       "https://cdn.jsdelivr.net/npm/d3-scale@4/+esm",
       "https://cdn.jsdelivr.net/npm/d3-zoom@3/+esm",
       "https://cdn.jsdelivr.net/npm/d3-brush@3/+esm"]
imports = json.dumps({"imports": {u: d3 for u in cdn}})
open(sys.argv[2], "w").write(f"""<!DOCTYPE html>
<html><head><meta charset="utf-8">
<script type="importmap">{imports}</script></head><body>
<script type="module">
import {{add_local_files}} from "./MemoryViz.js";
add_local_files({files}, {json.dumps(os.environ["VIEW"])});
</script></body></html>
""")
PY
# d3's own ES modules import each other by bare names: wrap the one-file
# UMD bundle as a module instead (it sets globalThis.d3)
# (the bundle runs in a module of its own: the names it exports, such as
# `window`, must not shadow the globals it uses)
cp "$work/node_modules/d3/dist/d3.min.js" "$work/d3-umd.js"
cp "$work/d3-umd.js" "$work/d3-umd.cjs" # for node, which reads it as CommonJS
{ printf 'import "./d3-umd.js";\nconst d3 = globalThis.d3;\n'
  printf 'export default d3;\n'
  node -e "const d3=require('./$work/d3-umd.cjs');
           console.log('export const {'+Object.keys(d3).join(',')+'} = d3;')"
} >"$work/d3-esm.js"
port=$((20000 + $$ % 20000))
python3 -m http.server "$port" --bind 127.0.0.1 --directory "$work" \
    >/dev/null 2>&1 &
server=$!
trap 'kill $server 2>/dev/null' EXIT
sleep 1
profile=$(mktemp -d)
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update \
    --disable-sync --user-data-dir="$profile" --window-size=1400,900 \
    --virtual-time-budget=15000 --screenshot="$png" \
    "http://127.0.0.1:$port/index.html" 2>/dev/null
rm -rf "$profile"
echo "memory_viz_render: $png"
