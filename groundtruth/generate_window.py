"""generate() past a sliding window, and the issue's held-out llama-1b run, measured on one H200 with
collect_more.py's run_generate protocol (transformers 5.x, bf16 weights built in bf16, EOS disabled, min_new_tokens =
max_new_tokens), plus allocator traces of a prefill longer than the window and of the llama-7b run whose reserved
bytes the simulator misses most.

    python3 groundtruth/generate_window.py OUTDIR

writes OUTDIR/generate-window.jsonl (the environment line, then one case a line, the schema of
h200-torch2.11-generate.jsonl) and OUTDIR/traces/<id>.trace.jsonl.gz (trace_more.py's format). What it checks:
Mistral's DynamicSlidingWindowLayer keeps window - 1 tokens after each update once the prompt is longer than the
window (4096 for mistral-2b), and _ignore_causal_mask_sdpa materializes the sliding-window mask [B, 1, q, kv] once
the key length reaches the window (docs/GENERATE.md). About two minutes on an H200.
"""
import json, os, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import collect_more as M  # noqa: E402
import trace_more as T  # noqa: E402


def case(model, b, p, n, cache="dynamic"):
    return dict(id=f"{model}-gen-b{b}-p{p}-n{n}-{cache}", model=model, batch=b, cache=cache,
                generate=dict(prompt=p, new_tokens=n, sample=False, pad=False))


CASES = [case("mistral-2b", 4, 6144, 64),             # over the window: the cache stays at 4096 tokens
         case("mistral-2b", 2, 6144, 64, "static"),   # StaticSlidingWindowLayer
         case("mistral-2b", 8, 4000, 200),            # crosses the window in the decode steps
         case("llama-1b", 16, 1024, 256)]             # the held-out run (3.2 GiB)
TRACES = [dict(case("mistral-2b", 2, 5120, 8), reps=1),
          # the measured case whose reserved bytes the simulator misses most (-9.8 %): the growing cache's blocks
          dict(case("llama-7b", 4, 4096, 64), reps=1)]


def main():
    out = sys.argv[1]
    os.makedirs(os.path.join(out, "traces"), exist_ok=True)
    M.warmup()
    with open(os.path.join(out, "generate-window.jsonl"), "w") as f:
        f.write(json.dumps(dict(env=M.env_line())) + "\n")
        for c in CASES:
            t0 = time.time()
            try:
                r = M.run_generate(dict(c), out)
            except Exception as e:  # an OOM or a transformers error is a line of its own
                r = dict(c, error=repr(e)[:300])
            M.G.cleanup()
            r["wall_s"] = round(time.time() - t0, 2)
            f.write(json.dumps(r) + "\n")
            f.flush()
            print(r["id"], r.get("error", ""), r.get("peak_alloc"), r.get("kv_cache_bytes"), r["wall_s"], flush=True)
    for c in TRACES:
        T.traced(M.run_generate, c, os.path.join(out, "traces", c["id"] + ".trace.jsonl.gz"))
        print("traced", c["id"], flush=True)


if __name__ == "__main__":
    main()
