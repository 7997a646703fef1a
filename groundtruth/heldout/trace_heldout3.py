"""Allocator event traces of the third held-out set's reserved outliers (groundtruth/trace_more.py's format), for
reading the allocator rule they miss off them.

    python3 groundtruth/heldout/trace_heldout3.py OUTDIR [id-filter]
"""
import os, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
import collect_heldout3 as H3  # noqa: E402  (its import fills collect_heldout's case lists)
import trace_more as T  # noqa: E402

WANT = ("ho3-qwen3-0.6b-bf16-b2-s4096", "ho3-mixtral-4l-bf16-b2-ckpt", "ho3-phi3-mini-16l-amp-bf16-b2-ckpt")


def main():
    out = sys.argv[1]
    filt = sys.argv[2] if len(sys.argv) > 2 else ""
    os.makedirs(out, exist_ok=True)
    T.M.warmup()
    for c in H3.H.FAM:
        if c["id"] not in WANT or (filt and filt not in c["id"]):
            continue
        t0 = time.time()
        T.traced(T.M.run_family, dict(c, steps=3), os.path.join(out, c["id"] + ".trace.jsonl.gz"))
        print("traced", c["id"], round(time.time() - t0, 1), flush=True)


if __name__ == "__main__":
    main()
