"""Allocator event traces (groundtruth/trace_more.py's format) of the reserved outliers left in the held-out sets at
the start of stop 26: the fourth set's qwen3-moe-128e checkpointed (+5.98 %) and mixtral-4l at 4096 tokens
(+2.41 %), the second set's gemma2-9b-4l bf16 b2 (+6.89 %) and the families file's qwen3-moe-small amp b4 (−4.87 %),
for reading the allocator rule they miss off them.

    python3 groundtruth/heldout/trace_heldout4.py OUTDIR [id-filter]
"""
import copy, os, sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
import collect_heldout as H  # noqa: E402
import trace_more as T  # noqa: E402


def wanted():
    """The four cases, each from the script that measured it (each import refills collect_heldout's lists)."""
    out = [c for c in T.M.FAM if c["id"] == "qwen3-moe-small-amp-bf16-b4"]
    import collect_heldout2  # noqa: F401
    out += [copy.deepcopy(c) for c in H.FAM if c["id"] == "ho2-gemma2-9b-4l-bf16-b2"]
    import collect_heldout4  # noqa: F401
    out += [copy.deepcopy(c) for c in H.FAM
            if c["id"] in ("ho4-qwen3-moe-128e-bf16-b4-ckpt", "ho4-mixtral-4l-amp-bf16-b1-s4096")]
    return out


def main():
    T.trace_all([(T.M.run_family, c) for c in wanted()], sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "")


if __name__ == "__main__":
    main()
