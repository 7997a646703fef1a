#!/bin/sh
# Show a memory snapshot in PyTorch's own viewer, off-line, and take a
# screenshot with headless Chromium.
#
#   scripts/memory_viz_render.sh VIEWER INPUT OUT.png [VIEW]
#
# VIEWER is torch/utils/viz/MemoryViz.js of a PyTorch source tree (or the
# folder holding it): the wheels ship no copy (torch 2.11.0 has none), and
# the pages torch writes load it from cdn.jsdelivr.net. INPUT is either such
# a page (`python -m torch.cuda._memory_viz trace_plot|segment_plot`,
# torch.cuda._memory_viz._format_viz) or a snapshot pickle, which is put in
# a page of the same template here with its own bytes (_format_viz
# re-pickles it with Python's pickle); VIEW, the viewer's tab for a pickle:
# 'Active Memory Timeline' (default), 'Allocator State History', 'Active
# Cached Segment Timeline'.
#
# The viewer imports d3 from cdn.skypack.dev (d3@5, d3-axis@1, d3-scale@1,
# d3-zoom@1, d3-brush@1). Those packages are installed from the npm
# registry into $MEMORY_VIZ_DIR (default build/memory-viz), once, and an
# import map sends each import to the package's ES module, and d3's bare
# imports of its own packages to theirs. Their files import one another
# without '.js': the loopback server adds it. Prints how many polygons and
# rectangles the viewer drew. Needs node/npm, python3, chromium.
set -eu
[ $# -ge 3 ] || { sed -n '2,23p' "$0"; exit 2; }
viewer=$1 input=$2 png=$3 view=${4:-Active Memory Timeline}
[ -d "$viewer" ] && viewer=$viewer/MemoryViz.js
[ -f "$viewer" ] || { echo "memory_viz_render: no viewer $viewer" >&2; exit 2; }
work=${MEMORY_VIZ_DIR:-build/memory-viz}
mkdir -p "$work"
cp "$viewer" "$work/MemoryViz.js"
python3 - "$work" "$input" "$view" <<'PY'
import base64, json, os, re, subprocess, sys
work, src, view = sys.argv[1:4]
nm = os.path.join(work, "node_modules")

def fail(msg):
    sys.exit(f"memory_viz_render: {msg}")

def pkg(d):
    p = os.path.join(nm, d, "package.json")
    return json.load(open(p)) if os.path.exists(p) else None

def major(d):
    p = pkg(d)
    return p and p["version"].split(".")[0]

def npm(spec):
    subprocess.run(["npm", "install", "--silent", "--no-audit", "--no-fund",
                    "--prefix", work, spec], check=True)

js = open(os.path.join(work, "MemoryViz.js")).read()
urls = re.findall(r'from\s+"(https?://[^"]+)"', js)
imports = {}
for url in urls:
    m = re.fullmatch(r"https://cdn\.skypack\.dev/([a-z0-9-]+)@(\d+)", url)
    if not m:
        fail(f"the viewer imports {url}: only cdn.skypack.dev NAME@MAJOR "
             "is mapped")
    name, want = m.groups()
    alias = f"{name}-v{want}"    # when another major holds the name
    if major(name) is None:
        npm(f"{name}@{want}")
    elif major(name) != want and major(alias) != want:
        npm(f"{alias}@npm:{name}@{want}")
    imports[url] = name if major(name) == want else alias
if not imports:
    fail("the viewer imports nothing from cdn.skypack.dev")

def entry(d):
    e = os.path.normpath(os.path.join(d, pkg(d)["module"]))
    if not os.path.exists(os.path.join(nm, e)):
        e += ".js"
    return "/node_modules/" + e

mapped = {u: entry(d) for u, d in imports.items()}
for d in sorted(os.listdir(nm)):
    if (d == "d3" or d.startswith("d3-")) and "module" in (pkg(d) or {}):
        mapped.setdefault(d, entry(d))

cdn = (r"https://cdn\.jsdelivr\.net/gh/pytorch/pytorch@[^/\"]+"
       r"/torch/utils/viz/MemoryViz\.js")
if src.endswith(".pickle"):
    buf = open(src, "rb").read()
    buf += b"\0" * (3 - len(buf) % 3)     # as _format_viz: no '=' padding
    files = json.dumps([{"name": os.path.basename(src),
                         "base64": base64.b64encode(buf).decode()}])
    page = ('<!DOCTYPE html>\n<html>\n<head>\n</head>\n<body>\n'
            '<script type="module">\nimport {add_local_files} from '
            '"https://cdn.jsdelivr.net/gh/pytorch/pytorch@main/torch/utils/'
            f'viz/MemoryViz.js"\nconst local_files = {files}\n'
            f'add_local_files(local_files, {json.dumps(view)})\n'
            '</script>\n</body>\n')
else:
    page = open(src).read()
page, n = re.subn(cdn, "/MemoryViz.js", page)
if n != 1:
    fail(f"{src}: {n} imports of pytorch's MemoryViz.js from jsdelivr, "
         "not one (is it a page of torch.cuda._memory_viz?)")
imap = '<script type="importmap">%s</script>' % json.dumps(
    {"imports": mapped})
page, n = re.subn(r"<head>", lambda m: m.group(0) + imap, page, count=1,
                  flags=re.I)
if n != 1:
    fail(f"{src}: no <head>")
open(os.path.join(work, "index.html"), "w").write(page)
PY

rm -f "$work/.port"
python3 - "$work" <<'PY' &
import functools, http.server, os, sys
root = sys.argv[1]

class Handler(http.server.SimpleHTTPRequestHandler):
    def translate_path(self, path):
        p = super().translate_path(path)
        if not os.path.exists(p) and os.path.isfile(p + ".js"):
            return p + ".js"
        return p

    def log_message(self, *args):
        pass

    def log_request(self, code="-", size="-"):
        if str(code)[0] in "45" and self.path != "/favicon.ico":
            sys.stderr.write(f"memory_viz_render: {code} {self.path}\n")

srv = http.server.ThreadingHTTPServer(
    ("127.0.0.1", 0), functools.partial(Handler, directory=root))
open(os.path.join(root, ".port.tmp"), "w").write(str(srv.server_address[1]))
os.rename(os.path.join(root, ".port.tmp"), os.path.join(root, ".port"))
srv.serve_forever()
PY
server=$!
profile=$(mktemp -d)
trap 'kill $server 2>/dev/null; rm -rf "$profile"' EXIT
i=0
while [ ! -f "$work/.port" ]; do
    i=$((i + 1))
    [ $i -le 100 ] || { echo "memory_viz_render: no server" >&2; exit 1; }
    sleep 0.1
done
url="http://127.0.0.1:$(cat "$work/.port")/index.html"
shot() {
    chromium --headless --no-sandbox --disable-gpu --disable-quic \
        --no-first-run --disable-background-networking \
        --disable-component-update --disable-sync \
        --user-data-dir="$profile" --window-size=1600,1000 \
        --virtual-time-budget=20000 "$@" "$url" 2>/dev/null
}
shot --dump-dom >"$work/dom.html"
polygons=$(grep -o '<polygon' "$work/dom.html" | wc -l)
rects=$(grep -o '<rect' "$work/dom.html" | wc -l)
if [ "$polygons" -eq 0 ] && [ "$rects" -eq 0 ]; then
    echo "memory_viz_render: the viewer drew nothing ($work/dom.html)" >&2
    exit 1
fi
shot --screenshot="$png" >/dev/null
echo "memory_viz_render: $png ($polygons polygons, $rects rectangles drawn)"
