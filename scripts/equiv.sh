#!/usr/bin/env bash
# Equivalence harness: the output of this tree's ./vramplan against the
# output of a git revision (default main), over a broad grid of commands,
# byte for byte. For refactors that must not change any output.
#
#   scripts/equiv.sh [REV]        (or: make equiv EQUIV_BASE=REV)
#
# REV is built from `git archive` in build/equiv/<sha>/src and run there
# (on its own models/ and gpus/; its ../shared is this tree's); its outputs
# are kept in build/equiv/<sha>-<grid hash>/ (rebuilt when the grid
# changes). This tree's outputs go to build/equiv/current/. Every case
# records the command's stdout, stderr and exit status, and the --timeline
# CSV where one is written. Exit 0 when every file is identical, 1 with
# the differing files listed (and the first lines of each diff) otherwise.
#
# The grid: `estimate` of every model in models/ and tests/data/hf/ over
# each precision, each optimizer, checkpointing (none, all, selective, a
# pattern), accumulation, keep-grads, inference, every attention kernel,
# both offloads, activation compression, INT8 weights, expandable
# segments, budgets and batch/sequence sizes; --format json, csv and table;
# timelines for three setups per model; `estimate` of every file under
# tests/data (the error messages of the bad ones); `validate` of every
# ground-truth file; `maxbatch`, `plan`, `techniques`, `compare` and
# `export`.
set -euo pipefail

cd "$(dirname "$0")/.."
root=$(pwd)
rev=${1:-main}
jobs=${EQUIV_JOBS:-2}
sha=$(git rev-parse --verify "$rev^{commit}")

# ---- the grid: one case a line, "ID<TAB>args" (args split on spaces) ----
grid() {
    local models m id
    models=$(ls models/*.yaml tests/data/hf/*.json)
    for m in $models; do
        id=$(basename "$m" | tr . _)
        local e="estimate $m"
        cat <<EOF
$id.fp32	$e --format json
$id.fp32-b3	$e --batch 3 --format json
$id.ambf16-b2	$e --batch 2 --precision amp-bf16 --format json
$id.amfp16-b2	$e --batch 2 --precision amp-fp16 --format json
$id.bf16-b2	$e --batch 2 --precision bf16 --format json
$id.fp16-b2	$e --batch 2 --precision fp16 --format json
$id.seq64	$e --batch 4 --seq 64 --precision amp-bf16 --format json
$id.seq200	$e --batch 2 --seq 200 --precision bf16 --format json
$id.table	$e --batch 2 --precision amp-bf16
$id.csv	$e --batch 2 --precision amp-bf16 --format csv
$id.ckall	$e --batch 2 --precision amp-bf16 --checkpoint all --format json
$id.ckall-fp32	$e --batch 2 --checkpoint all --format json
$id.ckpat	$e --batch 2 --precision bf16 --checkpoint *.1,*.3 --format json
$id.sel	$e --batch 2 --precision amp-bf16 --selective all --format json
$id.sel-eager	$e --batch 2 --precision amp-bf16 --selective all --attention eager --format json
$id.sel-math	$e --batch 2 --selective all --attention math --format json
$id.ck-sel	$e --batch 2 --precision amp-bf16 --checkpoint *.0 --selective all --format json
$id.accum3	$e --batch 2 --precision amp-bf16 --accum 3 --format json
$id.accum3-ck	$e --batch 2 --precision bf16 --accum 3 --checkpoint all --format json
$id.keep	$e --batch 2 --precision amp-bf16 --keep-grads --format json
$id.keep-fp32	$e --batch 2 --keep-grads --accum 3 --format json
$id.inf	$e --batch 2 --inference --format json
$id.inf-bf16	$e --batch 4 --precision bf16 --inference --format json
$id.inf-amp	$e --batch 4 --precision amp-bf16 --inference --format json
$id.int8	$e --batch 2 --inference --int8-weights --format json
$id.int8-amp	$e --batch 2 --precision amp-fp16 --inference --int8-weights --format json
$id.int8-train	$e --batch 2 --int8-weights --format json
$id.att-sdpa	$e --batch 2 --precision amp-bf16 --attention sdpa --format json
$id.att-flash	$e --batch 2 --precision amp-bf16 --attention flash --format json
$id.att-eff	$e --batch 2 --precision amp-bf16 --attention efficient --format json
$id.att-eager	$e --batch 2 --precision amp-bf16 --attention eager --format json
$id.att-math	$e --batch 2 --precision amp-bf16 --attention math --format json
$id.att-eager32	$e --batch 2 --attention eager --format json
$id.att-eager16	$e --batch 2 --precision fp16 --attention eager --format json
$id.att-math16	$e --batch 2 --precision bf16 --attention math --format json
$id.att-eff32	$e --batch 2 --attention efficient --format json
$id.opt-fused	$e --batch 2 --precision amp-bf16 --optimizer adamw-fused --format json
$id.opt-forloop	$e --batch 2 --precision amp-bf16 --optimizer adamw-forloop --format json
$id.opt-sgd	$e --batch 2 --precision amp-bf16 --optimizer sgd --format json
$id.opt-sgdplain	$e --batch 2 --precision bf16 --optimizer sgd-nomomentum --format json
$id.opt-adafactor	$e --batch 2 --precision amp-bf16 --optimizer adafactor --format json
$id.opt-8bit	$e --batch 2 --precision amp-bf16 --optimizer adamw-8bit --format json
$id.opt-none	$e --batch 2 --precision fp16 --optimizer none --format json
$id.opt-8bit-half	$e --batch 2 --precision bf16 --optimizer adamw-8bit --steps 2 --format json
$id.off-opt	$e --batch 2 --precision amp-bf16 --offload-optimizer --format json
$id.off-opt16	$e --batch 2 --precision bf16 --offload-optimizer --optimizer sgd --format json
$id.off-act	$e --batch 2 --precision amp-bf16 --offload-activations --format json
$id.off-act-ck	$e --batch 2 --precision bf16 --offload-activations --checkpoint *.0 --format json
$id.act2	$e --batch 2 --precision amp-bf16 --compress-activations 2 --format json
$id.act4	$e --batch 2 --compress-activations 4 --format json
$id.act8	$e --batch 2 --precision bf16 --compress-activations 8 --selective all --format json
$id.expand	$e --batch 2 --precision amp-bf16 --expandable-segments --format json
$id.expand-ck	$e --batch 3 --expandable-segments --checkpoint all --accum 3 --format json
$id.steps1	$e --batch 2 --precision amp-bf16 --steps 1 --format json
$id.steps7	$e --batch 2 --steps 7 --optimizer adamw-fused --format json
$id.ws	$e --batch 2 --precision amp-bf16 --cublas-workspace 4MiB --context 500MiB --format json
$id.budget	$e --batch 8 --precision amp-bf16 --budget 3GiB --format json
$id.budget-exp	$e --batch 8 --budget 2GiB --expandable-segments --format json
$id.auto	$e --batch 8 --precision amp-bf16 --checkpoint auto --budget 6GiB --format json
$id.tl1	$e --batch 2 --timeline @TL@
$id.tl2	$e --batch 2 --precision amp-bf16 --checkpoint all --accum 3 --keep-grads --timeline @TL@
$id.tl3	$e --batch 2 --precision fp16 --attention eager --offload-activations --optimizer adamw-forloop --timeline @TL@
EOF
    done
    # every model file under tests/data: parses, or fails with its message
    for m in $(ls tests/data/*/*.yaml tests/data/*/*.json 2>/dev/null); do
        id=data.$(echo "$m" | tr / . )
        printf '%s\testimate %s --format json\n' "$id" "$m"
        printf '%s.amp\testimate %s --batch 2 --precision amp-bf16 --checkpoint all --format json\n' "$id" "$m"
    done
    # validate every ground-truth file
    for f in ../shared/groundtruth/*.jsonl ../shared/groundtruth/dist/*.jsonl \
             groundtruth/*.jsonl tests/data/*/*.jsonl; do
        id=validate.$(echo "$f" | tr / . )
        printf '%s\tvalidate %s --format jsonl\n' "$id" "$f"
        printf '%s.h200\tvalidate %s --gpu h200\n' "$id" "$f"
    done
    cat <<'EOF'
ckpat.resnet50	estimate models/resnet50.yaml --batch 8 --checkpoint layer2,layer4 --precision amp-bf16 --format json
ckpat.resnet152	estimate models/resnet152.yaml --batch 4 --checkpoint layer3 --selective all --format json
ckpat.vit	estimate models/vit-b16.yaml --batch 4 --checkpoint encoder.layers.1 --precision bf16 --format json
ckpat.vit-sel	estimate models/vit-l16.yaml --batch 4 --checkpoint encoder.layers.2 --selective encoder.layers.3 --attention math --format json
ckpat.mlp	estimate models/mlp10.yaml --batch 64 --checkpoint net.2,net.6 --precision amp-fp16 --format json
validate.dist-models	validate tests/data/dist/cases.jsonl --models tests/data/dist --format jsonl
validate.dist-models-gpu	validate tests/data/dist/cases.jsonl --models tests/data/dist --gpu h200
maxbatch.gpt2m	maxbatch models/gpt2-medium.yaml --budget 24GiB --precision amp-bf16
maxbatch.llama1b	maxbatch models/llama-1b.yaml --gpu rtx4090 --budget 0.9 --precision bf16
maxbatch.resnet50	maxbatch models/resnet50.yaml --budget 16GiB --format json
maxbatch.vit	maxbatch models/vit-b16.yaml --budget 20GiB --precision amp-fp16 --checkpoint all
maxbatch.bert	maxbatch tests/data/hf/bert-base.json --budget 12GiB --optimizer sgd --expandable-segments
maxbatch.mixtral	maxbatch models/mixtral-8x7b.yaml --gpu h200 --precision bf16 --checkpoint all --seq 512
maxbatch.mlp	maxbatch models/mlp10.yaml --budget 8GiB --inference
maxbatch.resnet-a100	maxbatch models/resnet50.yaml --gpu a100-40g --format json
maxbatch.resnet-v100	maxbatch models/resnet152.yaml --gpu v100-32g --budget 0.5
tech.resnet-3090	techniques models/resnet50.yaml --batch 32 --budget 16GiB --gpu rtx3090 --format json
plan.gpt2s	plan models/gpt2-small.yaml --gpu h200
plan.llama1b	plan models/llama-1b.yaml --gpu rtx4090 --global-batch 64 --seq 2048
plan.resnet	plan models/resnet50.yaml --gpu a100-40g --global-batch 256 --format json
plan.vit	plan models/vit-b16.yaml --gpu l40s --budget 0.8 --precision amp-bf16
plan.c405b	plan models/llama-3.1-405b.yaml --gpus 1024 --gpu h100-80g --nodes-of 8
plan.c70b	plan models/llama-3-70b.yaml --gpus 64 --gpu h200 --format json
plan.cmix	plan models/mixtral-8x7b.yaml --gpus 32 --gpu a100-80g
plan.cgpt3	plan tests/data/cluster/gpt3-175b.yaml --gpus 256 --gpu a100-80g
tech.gpt2s	techniques models/gpt2-small.yaml --batch 16 --precision amp-bf16 --budget 24GiB --gpu h200
tech.resnet	techniques models/resnet50.yaml --batch 64 --budget 16GiB
tech.llama1b	techniques models/llama-1b.yaml --batch 4 --seq 1024 --precision bf16 --budget 20GiB --gpu rtx4090
tech.bert	techniques tests/data/hf/bert-base.json --batch 32 --seq 512 --budget 24GiB --format json
compare.70b	compare models/llama-3-70b.yaml --gpus 64,256,1024 --gpu a100-80g,h100-80g,h200 --tokens 1T
compare.8b	compare models/llama-3-8b.yaml --gpus 8,16 --gpu h100-80g --format json
compare.gpt2xl	compare models/gpt2-xl.yaml --gpus 8 --gpu a100-40g,rtx4090 --format csv
export.ds	export models/llama-3-8b.yaml --gpus 16 --gpu h100-80g --to deepspeed
export.mg	export models/llama-3-70b.yaml --gpus 64 --gpu h200 --to megatron
export.tr	export models/mistral-7b.yaml --gpus 8 --gpu a100-80g --to torchrun
EOF
}

grid_hash=$(grid | sha1sum | cut -c1-10)
base=build/equiv/$sha-$grid_hash
cur=build/equiv/current

# ---- run the grid with one binary into a directory ----------------------
run_one() { # DIR BIN OUT ID ARGS...
    cd "$1"
    local bin=$2 out=$3 id=$4
    shift 4
    local args=() a
    for a in "$@"; do
        if [ "$a" = @TL@ ]; then
            args+=("$out/$id.timeline.csv")
        else
            args+=("$a")
        fi
    done
    local rc=0
    "$bin" "${args[@]}" >"$out/$id.out" 2>"$out/$id.err" </dev/null || rc=$?
    # a timeline path in a message would differ between the two runs
    sed -i "s|$out/|OUT/|g" "$out/$id.out" "$out/$id.err"
    echo "$rc" >"$out/$id.rc"
}
export -f run_one

run_grid() { # DIR BIN OUT: run in DIR (its models/, gpus/ and ../shared)
    local dir=$1 bin=$2 out=$3
    rm -rf "$out"
    mkdir -p "$out"
    grid | while IFS=$'\t' read -r id args; do
        echo "$dir $bin $out $id $args"
    done | xargs -P "$jobs" -L 1 bash -c 'run_one "$@"' _
    grid | wc -l >"$out/.cases"
}

# ---- the baseline --------------------------------------------------------
if [ ! -f "$base/.done" ]; then
    src=build/equiv/$sha/src
    if [ ! -x "$src/vramplan" ]; then
        echo "equiv: building $rev ($sha) in $src"
        rm -rf "$src"
        mkdir -p "$src"
        git archive "$sha" | tar -x -C "$src"
        make -C "$src" -s -j"$jobs" all >/dev/null
    fi
    # its ../shared (the ground truth) is this tree's
    ln -sfn "$(cd ../shared && pwd)" "build/equiv/$sha/shared"
    echo "equiv: baseline outputs of $rev in $base"
    run_grid "$root/$src" "$root/$src/vramplan" "$root/$base"
    touch "$base/.done"
fi

echo "equiv: building this tree"
make -s -j"$jobs" all >/dev/null
# a copy, so that a rebuild while the grid runs does not disturb it
mkdir -p build/equiv
cp vramplan build/equiv/current.bin
echo "equiv: outputs of this tree in $cur"
run_grid "$root" "$root/build/equiv/current.bin" "$root/$cur"

n=$(cat "$cur/.cases")
if diff -rq "$base" "$cur" -x .done >build/equiv/diff.txt 2>&1; then
    echo "equiv: $n cases, every output identical to $rev"
    exit 0
fi
echo "equiv: outputs differ from $rev:"
head -n 40 build/equiv/diff.txt
for f in $(awk '/^Files/ {print $2}' build/equiv/diff.txt | head -n 5); do
    echo "--- $f"
    diff "$f" "$cur/${f#"$base"/}" | head -n 10 || true
done
exit 1
