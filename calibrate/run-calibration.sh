#!/usr/bin/env bash
# Build vp-calibrate and calibrate this machine's GPU: the run that made
# calibrate/profiles/h200.{yaml,log} (see calibrate/README.md).
#
#   calibrate/run-calibration.sh GPU OUTDIR [VRAMPLAN]
#
# GPU is the datasheet profile to start from (gpus/GPU.yaml), OUTDIR gets
# GPU.yaml (the profile), GPU.log (everything printed), GPU.raw.jsonl
# (vp-calibrate's raw measurements and the PyTorch probe's line) and,
# where PyTorch is installed, GPU.sweep.jsonl (the kernel sweep of
# scripts/h200_sweeps.py: GEMMs through torch, SDPA, memory-bound
# kernels, optimizers, eager dispatch; SWEEP_BUDGET seconds, default
# 1800), fitted into the profile by `vramplan calibrate --sweep`.
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

sweep=()
python=${PYTHON:-python3}
if "$python" -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
    say "== $python scripts/h200_sweeps.py $out/$gpu.sweep.jsonl (budget ${SWEEP_BUDGET:-1800} s)"
    if "$python" scripts/h200_sweeps.py "$out/$gpu.sweep.jsonl" \
        gemm,sdpa,membound,optim,launch "${SWEEP_BUDGET:-1800}" 2>&1 | tee -a "$log"; then
        sweep=(--sweep "$out/$gpu.sweep.jsonl")
    else
        say "the kernel sweep failed: the profile keeps the default curves"
    fi
else
    say "== no PyTorch with CUDA ($python): no kernel sweep"
fi

say "== $vramplan calibrate --gpu $gpu --raw $out/$gpu.raw.jsonl ${sweep[*]} --out $out/$gpu.yaml"
start=$(date +%s.%N)
"$vramplan" calibrate --gpu "$gpu" --raw "$out/$gpu.raw.jsonl" "${sweep[@]}" \
    --out "$out/$gpu.yaml" 2>&1 | tee -a "$log"
rc=${PIPESTATUS[0]}
end=$(date +%s.%N)
say "== vramplan calibrate: exit status $rc, $(awk "BEGIN { printf \"%.1f\", $end - $start }") s wall"
exit "$rc"
