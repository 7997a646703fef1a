"""BatchNorm2d's training kernels by shape on this GPU (issue 13; docs/STEP_TIME.md "Batch norm by shape").

    python3 calibrate/vp-bn-shapes.py OUT.jsonl [--warm]       (one GPU, about a minute)

The U-Net steps (models/unet-seg.yaml: 64 channels at 256 x 256) spend 0.56 ms in each bf16 BatchNorm2d backward
kernel, several times the time of their bytes: ATen's NCHW kernels give the statistics and the backward one
thread block per channel (aten/src/ATen/native/cuda/Normalization.cuh batch_norm_cuda_template's
batch_norm_collect_statistics_kernel and batch_norm_backward_cuda_template's batch_norm_backward_kernel: dim3
blocks(input.size(1)), MAX_BLOCK_SIZE threads), so a layer with few channels and many pixels runs on a fraction of
the SMs. This sweep times F.batch_norm in training mode (running statistics, momentum 0.1) and its backward
(input, weight and bias gradients) over channels x images x pixels, NCHW contiguous, for each of:
  fp32   fp32 input and parameters (cuDNN's bn_fw_tr_1C11 / bn_bw_1C11 kernels in these runs)
  bf16   bf16 input and parameters (a bf16 model)
  amp    bf16 input, fp32 parameters (a model under autocast: batch_norm runs in its input's dtype)
  fp16   fp16 input, fp32 parameters (autocast fp16)
Each line: {"kind":"bn_shape","mode":..,"c":C,"n":N,"hw":HW,"elems":N*C*HW,
 "fwd_ms":..,"bwd_ms":..,"fwd_kernels":{name: ms},"bwd_kernels":{name: ms}}: the GPU time of the kernels of one
forward and one backward (torch.profiler, the mean of REPS calls after a warm-up), by kernel name (cut at 90).
Before each call a 512 MiB buffer is zeroed, so that the call reads its tensors from HBM as a layer of a network does
(the GPU's 50 MB L2 would otherwise hold a small layer's input from the previous call); the zeroing's kernel is left
out of the sums. `--warm` keeps the L2 (the first sweep's protocol, h200-bn-shapes-warm.jsonl).
"""
import json
import sys

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

REPS = 5
CHANNELS = (16, 32, 64, 128, 256, 512, 1024, 2048)
PIXELS = (49, 196, 784, 3136, 12544, 65536)
IMAGES = (2, 8, 32, 128)
MAX_ELEMS = 300_000_000
MIN_ELEMS = 200_000
MODES = {"fp32": (torch.float32, torch.float32), "bf16": (torch.bfloat16, torch.bfloat16),
         "amp": (torch.bfloat16, torch.float32), "fp16": (torch.float16, torch.float32)}


FLUSH = None


def flush():
    if FLUSH is not None:
        FLUSH.zero_()


def kernels(prof):
    out = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and "FillFunctor" not in e.name:
            k = e.name[:90]
            out[k] = out.get(k, 0.0) + (e.time_range.end - e.time_range.start) / 1e3 / REPS
    return out


def one(mode, c, n, hw):
    xd, pd = MODES[mode]
    side = int(round(hw ** 0.5))
    x = torch.randn(n, c, side, side, device="cuda", dtype=xd, requires_grad=True)
    w = torch.ones(c, device="cuda", dtype=pd, requires_grad=True)
    b = torch.zeros(c, device="cuda", dtype=pd, requires_grad=True)
    rm = torch.zeros(c, device="cuda", dtype=pd)
    rv = torch.ones(c, device="cuda", dtype=pd)
    g = torch.randn_like(x)

    def fwd():
        return F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1, eps=1e-5)
    y = fwd()
    torch.autograd.grad(y, (x, w, b), g, retain_graph=True)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as pf:
        for _ in range(REPS):
            flush()
            fwd()
        torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as pb:
        for _ in range(REPS):
            flush()
            torch.autograd.grad(y, (x, w, b), g, retain_graph=True)
        torch.cuda.synchronize()
    kf, kb = kernels(pf), kernels(pb)
    return dict(kind="bn_shape", mode=mode, c=c, n=n, hw=side * side, elems=n * c * side * side,
                fwd_ms=round(sum(kf.values()), 5), bwd_ms=round(sum(kb.values()), 5),
                fwd_kernels={k: round(v, 5) for k, v in kf.items()},
                bwd_kernels={k: round(v, 5) for k, v in kb.items()})


def main():
    global FLUSH
    if "--warm" not in sys.argv:
        FLUSH = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
    with open(sys.argv[1], "w") as f:
        f.write(json.dumps(dict(env=dict(torch=torch.__version__, gpu=torch.cuda.get_device_name(), l2_flush=FLUSH is not None,
                                         cudnn=torch.backends.cudnn.version(),
                                         sms=torch.cuda.get_device_properties(0).multi_processor_count))) + "\n")
        for mode in MODES:
            for c in CHANNELS:
                for hw in PIXELS:
                    for n in IMAGES:
                        e = n * c * hw
                        if e > MAX_ELEMS or e < MIN_ELEMS:
                            continue
                        f.write(json.dumps(one(mode, c, n, hw)) + "\n")
                        f.flush()
                torch.cuda.empty_cache()
            print(mode, "done", flush=True)


if __name__ == "__main__":
    main()
