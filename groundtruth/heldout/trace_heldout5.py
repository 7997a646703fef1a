"""Allocator event traces (groundtruth/trace_more.py's format) of the fifth held-out set's peak-allocated outliers at
measurement: gemma-2b LoRA r8 q/k/v/o in AMP over a bf16 base (+4.22 %), gemma3-1b bf16 b8 (+0.99 %) and
deepseek-v3-tiny bf16 b8 (-1.12 %), for reading the rule they miss off them.

    python3 groundtruth/heldout/trace_heldout5.py OUTDIR [id-filter]
"""
import copy, os, sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
import collect_heldout as H  # noqa: E402
import trace_more as T  # noqa: E402
import collect_heldout5  # noqa: E402,F401  (fills collect_heldout's lists)

WANT = ("ho5-gemma-2b-lora-r8-qkvo-bf16base-amp-b2", "ho5-gemma3-1b-bf16-b8", "ho5-deepseek-v3-tiny-bf16-b8")


def main():
    cases = [(T.M.run_ft, copy.deepcopy(c)) for c in H.FT if c["id"] in WANT]
    cases += [(T.M.run_family, copy.deepcopy(c)) for c in H.FAM if c["id"] in WANT]
    T.trace_all(cases, sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "")


if __name__ == "__main__":
    main()
