#!/bin/sh
# Probe the largest batch of every max-batch case of the H200 ground truth
# with `vramplan probe`, running scripts/train_step.py (collect.py's model
# and training step) as the command, with and without --model.
#
#   scripts/probe_h200.sh [--cases FILE] [--mode model|plain|both]
#                         [--filter TEXT] [--warmup] [OUTDIR]
#
# FILE defaults to ../shared/groundtruth/h200-torch2.11-maxbatch.jsonl (or
# shared/groundtruth/... inside the checkout). Each probe writes OUTDIR/
# ID-MODE.json (vramplan's JSON result plus the case, the measured
# max_batch and the probe's wall time) and its trials' logs under
# OUTDIR/logs/ID-MODE/; OUTDIR/summary.jsonl gets one line per probe.
# OUTDIR defaults to probe-h200-out. VRAMPLAN (default ./vramplan) and
# PYTHON (default python3) pick the programs. Needs a CUDA GPU with
# PyTorch, transformers and torchvision.
#
# The exact command each probe runs is printed before it starts, e.g.
#   ./vramplan probe --model models/gpt2-small.yaml --precision amp-bf16 \
#       --budget 16GiB --format json --log-dir OUT/logs/... -- \
#       python3 scripts/train_step.py --model gpt2-small --prec amp-bf16 \
#       --budget-gib 16 --batch {batch}
set -eu

cases=""
mode=both
filter=""
warmup=""
out=probe-h200-out
while [ $# -gt 0 ]; do
    case $1 in
    --cases) cases=$2; shift 2 ;;
    --mode) mode=$2; shift 2 ;;
    --filter) filter=$2; shift 2 ;;
    --warmup) warmup=--warmup; shift ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    -*) echo "probe_h200.sh: unknown option $1" >&2; exit 2 ;;
    *) out=$1; shift ;;
    esac
done
if [ -z "$cases" ]; then
    for c in ../shared/groundtruth/h200-torch2.11-maxbatch.jsonl \
             shared/groundtruth/h200-torch2.11-maxbatch.jsonl; do
        if [ -f "$c" ]; then cases=$c; break; fi
    done
fi
[ -n "$cases" ] && [ -f "$cases" ] || {
    echo "probe_h200.sh: no cases file (give --cases FILE)" >&2; exit 2; }
case $mode in model|plain|both) ;; *)
    echo "probe_h200.sh: --mode is model, plain or both" >&2; exit 2 ;; esac
VRAMPLAN=${VRAMPLAN:-./vramplan}
PYTHON=${PYTHON:-python3}
mkdir -p "$out/logs"

# id model prec budget_gib max_batch probes wall_s ckpt seq, one case a line
$PYTHON - "$cases" "$filter" > "$out/cases.txt" <<'EOF'
import json, sys
for line in open(sys.argv[1]):
    c = json.loads(line)
    if "env" in c or "budget_gib" not in c or sys.argv[2] not in c["id"]:
        continue
    print(c["id"], c["model"], c.get("prec", "fp32"), c["budget_gib"],
          c["max_batch"], c["probes"], c["wall_s"],
          1 if c.get("ckpt") else 0, c.get("seq", 0))
EOF

now() { $PYTHON -c 'import time; print("%.3f" % time.time())'; }

probe() {  # probe ID MODE: run one probe, write $out/ID-MODE.json
    id=$1 m=$2
    set -- --model "$model" --prec "$prec" --budget-gib "$budget"
    [ "$ckpt" = 1 ] && set -- "$@" --ckpt
    [ "$seq" != 0 ] && set -- "$@" --seq "$seq"
    [ -n "$warmup" ] && set -- "$@" "$warmup"
    set -- "$@" --batch '{batch}'
    logs="$out/logs/$id-$m"
    rm -rf "$logs"
    if [ "$m" = model ]; then
        set -- --model "models/$model.yaml" --precision "$prec" \
            --budget "${budget}GiB" --format json --log-dir "$logs" \
            --timeout 600 --grace 10 -- $PYTHON scripts/train_step.py "$@"
        [ "$ckpt" = 1 ] && set -- --checkpoint all "$@"
        [ "$seq" != 0 ] && set -- --seq "$seq" "$@"
    else
        set -- --format json --log-dir "$logs" --timeout 600 --grace 10 \
            -- $PYTHON scripts/train_step.py "$@"
    fi
    echo "== $id ($m): $VRAMPLAN probe $*" >&2
    t0=$(now)
    rc=0
    "$VRAMPLAN" probe "$@" > "$out/$id-$m.raw" || rc=$?
    t1=$(now)
    $PYTHON - "$out/$id-$m.raw" "$id" "$m" "$measured" "$probes" "$wall" \
        "$t0" "$t1" "$rc" "$VRAMPLAN probe $*" > "$out/$id-$m.json" <<'EOF'
import json, sys
raw, cid, mode, meas, probes, wall, t0, t1, rc, cmd = sys.argv[1:]
try:
    r = json.load(open(raw))
except ValueError:
    r = {"max_batch": None, "trials": []}
r.update(id=cid, mode=mode, measured_max_batch=int(meas),
         recorded_probes=int(probes), recorded_wall_s=float(wall),
         probe_wall_s=round(float(t1) - float(t0), 2), exit_status=int(rc),
         command=cmd, match=r.get("max_batch") == int(meas))
print(json.dumps(r))
EOF
    cat "$out/$id-$m.json" >> "$out/summary.jsonl"
    $PYTHON -c 'import json,sys; r=json.load(open(sys.argv[1])); print("   max_batch %s (measured %s) in %d trials, %.1f s%s" % (r["max_batch"], r["measured_max_batch"], len(r["trials"]), r["probe_wall_s"], "" if r["match"] else "  MISMATCH"))' "$out/$id-$m.json" >&2
}

while read -r id model prec budget measured probes wall ckpt seq; do
    if [ "$mode" != plain ]; then probe "$id" model; fi
done < "$out/cases.txt"
while read -r id model prec budget measured probes wall ckpt seq; do
    if [ "$mode" != model ]; then probe "$id" plain; fi
done < "$out/cases.txt"
