"""The kernel constants of the step-time model read off the H200 measurements (docs/STEP_TIME.md "One GPU").

    python3 calibrate/fit-kernels.py calibrate/profiles/h200-gemm-align.jsonl calibrate/profiles/h200-kernels-byname.jsonl

Prints, from vp-gemm-align.py's output, the rate of each GEMM form (forward, input gradient, weight gradient) of a
16-bit head with unaligned rows (2-byte rows: vocabulary 50257; 4-byte rows: 30522), the median over m and d, and its
share of the bf16 GEMM peak (timing.c unaligned_share); and from vp-kernels.py's by-name profile: batch norm's
forward and backward per element of its output in fp32 (cuDNN) and 16-bit (ATen's NCHW kernels) as bytes at the copy
bandwidth (timing.c bn_h200), and the fp32 memory-efficient attention's rate as a share of the fp32 GEMM peak
(VP_ATTN_FP32_*_SHARE). The element and FLOP counts are the model's (vramplan's graph of resnet50 at batch 64:
7.113e8 batch-norm output elements; gpt2-small at batch 8: 154.6 / 386.5 GFLOP of attention forward / backward).
"""
import json
import statistics
import sys

BF16_PEAK = 731.337    # gpus/h200.yaml measured gemm bf16 peak_tflops
FP32_PEAK = 50.1003    # gpus/h200.yaml measured gemm fp32 peak_tflops
COPY_GBPS = 4580.28    # gpus/h200.yaml measured membound copy peak_gbps
BN_ELEMENTS = 7.113e8  # resnet50 batch 64: the batch norms' output elements
ATTN_GFLOP = (154.619, 386.547)  # gpt2-small batch 8: attention forward, backward


def unaligned(path):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    for v, what in ((50257, "2-byte rows"), (30522, "4-byte rows")):
        for form in ("fwd", "dgrad", "wgrad"):
            r = statistics.median(x["tflops"] for x in rows
                                  if x["dtype"] == "bfloat16" and x["vocab"] == v and x["form"] == form)
            print("unaligned %-12s %-5s %6.1f TFLOP/s  share %.4f" % (what, form, r, r / BF16_PEAK))


def profile(path):
    by = {json.loads(l)["case"]: json.loads(l)["by_name"] for l in open(path) if l.strip()}

    def total(case, *keys):
        return sum(ms for k, (n, ms) in by[case].items() if any(x in k for x in keys))
    for case, name, fwd, bwd in (
            ("resnet50-fp32-b64", "fp32", ("bn_fw",), ("bn_bw",)),
            ("resnet50-amp-bf16-b64", "16-bit", ("batch_norm_collect_statistics", "batch_norm_transform_input",
                                                 "batch_norm_update_stats", "for_multi_outputs<3"),
             ("batch_norm_backward",))):
        f, b = total(case, *fwd), total(case, *bwd)
        print("batch norm %-6s fwd %.3f ms %.2f ps/el %.2f B, bwd %.3f ms %.2f ps/el %.2f B" % (
            name, f, f / BN_ELEMENTS * 1e9, f / BN_ELEMENTS * 1e-3 * COPY_GBPS * 1e9,
            b, b / BN_ELEMENTS * 1e9, b / BN_ELEMENTS * 1e-3 * COPY_GBPS * 1e9))
    f = total("gpt2-small-fp32-b8", "fmha_cutlassF_f32")
    b = total("gpt2-small-fp32-b8", "fmha_cutlassB_f32")
    for what, ms, gf in (("fwd", f, ATTN_GFLOP[0]), ("bwd", b, ATTN_GFLOP[1])):
        r = gf / ms
        print("fp32 attention %s %.3f ms %.2f TFLOP/s share %.4f" % (what, ms, r, r / FP32_PEAK))


if __name__ == "__main__":
    unaligned(sys.argv[1])
    profile(sys.argv[2])
