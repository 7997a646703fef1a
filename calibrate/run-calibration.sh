#!/usr/bin/env bash
# Build vp-calibrate and calibrate this machine's GPU: the run that made
# calibrate/profiles/h200.{yaml,log} (see calibrate/README.md).
#
#   calibrate/run-calibration.sh GPU OUTDIR [VRAMPLAN]
#
# GPU is the datasheet profile to start from (gpus/GPU.yaml), OUTDIR gets
# GPU.yaml (the profile), GPU.log (everything printed) and GPU.raw.jsonl
# (vp-calibrate's raw measurements and the PyTorch probe's line).
# VRAMPLAN is the vramplan binary (default ./vramplan).
set -uo pipefail
gpu=${1:?usage: run-calibration.sh GPU OUTDIR [VRAMPLAN]}
out=${2:?usage: run-calibration.sh GPU OUTDIR [VRAMPLAN]}
vramplan=${3:-./vramplan}
mkdir -p "$out"
log="$out/$gpu.log"
: >"$log"
say() { printf '%s\n' "$*" | tee -a "$log"; }

say "== $(date -u '+%Y-%m-%d %H:%M:%S UTC') on $(hostname)"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,temperature.gpu,power.draw \
    --format=csv 2>&1 | tee -a "$log"
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
say "== $("$NVCC" --version | tail -n 1)"
say "== make calibrate NVCC=$NVCC"
if ! make --no-print-directory calibrate NVCC="$NVCC" 2>&1 | tee -a "$log"; then
    say "make calibrate failed"
    exit 1
fi

# cuBLASLt is loaded at run time; point the loader at the toolkit's or
# PyTorch's copy when it is not on the default path.
if ! ldconfig -p 2>/dev/null | grep -q 'libcublasLt\.so\.13'; then
    lt=$(find /usr/local /opt /usr/lib -name 'libcublasLt.so.13' 2>/dev/null | head -n 1)
    if [ -n "$lt" ]; then
        export LD_LIBRARY_PATH="$(dirname "$lt")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        say "== cuBLASLt from $lt"
    fi
fi

say "== $vramplan calibrate --gpu $gpu --raw $out/$gpu.raw.jsonl --out $out/$gpu.yaml"
start=$(date +%s.%N)
"$vramplan" calibrate --gpu "$gpu" --raw "$out/$gpu.raw.jsonl" \
    --out "$out/$gpu.yaml" 2>&1 | tee -a "$log"
rc=${PIPESTATUS[0]}
end=$(date +%s.%N)
say "== vramplan calibrate: exit status $rc, $(awk "BEGIN { printf \"%.1f\", $end - $start }") s wall"
exit "$rc"
