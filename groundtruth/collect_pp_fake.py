"""FSDP2 + TP + PP (3-D), torchtitan's way, as one rank of a fake world on one H200.

Rank R of a world of PP x DP x TP (torchtitan's mesh order: global rank = stage x DP x TP + dp rank x TP + tp rank)
on PyTorch's fake process group (torch.testing._internal.distributed.fake_pg, as collect_tp_fake.py, whose
`apply_tp` plan is imported and used unchanged):

- the stage (torchtitan distributed/pipeline_parallel.py `pipeline_module_split`, `generate_llm_fqn_per_model_part`
  with input_weight = output_weight = 1: layers + 2 slots split evenly, the remainder on the first stages, the
  embedding one slot of stage 0, norm + output one of the last): a copy of the model with the stage's layers only.
  Here the copy is built on the GPU with num_hidden_layers = the stage's count (the layers torchtitan's copy keeps),
  then `model.embed_tokens` is deleted off stage 0 and `model.norm` / `lm_head` off the last, and their segments
  released (each is one segment of its own: > 10 MiB), before apply_tp and fully_shard, as collect_tp_fake.py
  builds a whole model;
- the stage's forward takes a tensor and returns one (torchtitan's model forward with `tok_embeddings` / `norm` /
  `output` None): the ids on stage 0, the previous stage's hidden states (the sequence-parallel local share,
  [mb, S/tp, H] bf16) elsewhere, through HF's own `model.model(inputs_embeds=...)`; the last stage's logits leave
  as the local tensor (`to_local()`, a view) and the loss function wraps them back (`DTensor.from_local`, a view)
  before HF's `loss_function` under `loss_parallel()`, so that PipelineStage sees plain tensors only;
- fully_shard per decoder layer and on the stage module (the root) over the "dp" mesh dimension,
  MixedPrecisionPolicy(bf16, fp32), reshard_after_forward False (torchtitan's `reshard_after_forward_policy`
  "default" = `not pp_enabled`); `torch.distributed.pipelining.PipelineStage` with EXPLICIT input_args /
  output_args (meta tensors: no shape inference, which would need real p2p) over the "pp" mesh group, and
  `Schedule1F1B(stage, n_microbatches, loss_fn)` on every stage (the loss function is what gives the stages their
  backward); `step(..., return_outputs=False)` where this torch has the argument (torchtitan's call).

Under the fake process group, p2p moves no data: FakeProcessGroup::send / recv return a completed FakeWork and
leave the tensors alone (torch/csrc/distributed/c10d/FakeProcessGroup.hpp), so a later stage's forward reads its
recv buffer as it was made (`_make_tensor_from_meta`: torch.empty, in `_prepare_forward_infra`, one per
micro-batch, requires_grad) and a stage's backward its grad recv buffer (`_prepare_backward_infra`, one per
micro-batch): values are arbitrary, sizes and lifetimes are the run's (torch/distributed/pipelining/stage.py
`PipelineStage._prepare_forward_infra`, `_create_grad_recv_info`, `_get_recv_ops`; schedules.py
`PipelineScheduleSingle._initialize_stage`, `Schedule1F1B._step_microbatches`).

Phase peaks: PipelineStage's `forward_one_chunk` / `backward_one_chunk` are wrapped to reset the peak at each
entry; a step's fwd_peak is the largest peak from a forward's entry to the next backward's (the loss included),
bwd_peak from a backward's entry to the next forward's (the last one's FSDP reduce-scatter included, and the
stage's first-step buffers in the first forward's), opt_peak the optimizer step's. Protocol and fields otherwise
collect_tp_fake.py's, plus `pp`, `stage`, `stage_layers`, `schedule` ("1f1b"), `microbatches` (`batch` is the
step's batch of the dp rank, split into `microbatches` micro-batches), `return_outputs`.

    python3 groundtruth/collect_pp_fake.py OUT.jsonl DP TP PP RANK [filter] [--lp 0] [--trace DIR]
    python3 groundtruth/collect_pp_fake.py --all OUT.jsonl [--trace DIR]   # the planned runs, < 8 minutes
    python3 groundtruth/collect_pp_fake.py --smoke OUT.jsonl               # one tiny case on 2 stages + a trace

`--all` runs each planned rank in its own process (a process has one fake rank) one after the other; a rank that
fails or passes its time prints why and the others still run. A case that fails writes its error line and the
next case runs. The env line is written only to an empty OUT. `--smoke` writes OUT's hf_configs/pp-smoke.json so
that `vramplan validate` finds the tiny model.
"""
import inspect, json, os, subprocess, sys, time, traceback

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import collect_more as M  # noqa: E402
import collect_dist_more as D  # noqa: E402
import collect_tp_fake as TPF  # noqa: E402
G = M.G
BF = torch.bfloat16
STEPS = 3

# the smoke test's model: llama-1b's family, small enough to build and step in a second
SMOKE = ("llama-1b", dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                          num_key_value_heads=2, vocab_size=1024, max_position_embeddings=256))


def stage_layers(layers, pp, stage):
    """torchtitan generate_llm_fqn_per_model_part (input_weight = output_weight = 1): the stage's layer count."""
    eff = layers + 2
    per, extra = divmod(eff, pp)
    if per < 1:
        raise ValueError(f"{pp} stages of {layers} layers leave a stage empty")
    return per + (stage < extra) - (stage == 0) - (stage == pp - 1)


def model_config(name, over):
    """collect_more.hf_config's config of `name`, with `over` (config kwargs) applied at construction."""
    import transformers as T
    if name == "pp-smoke":
        name, over = SMOKE[0], dict(SMOKE[1], **over)
    if name in M.FAMILIES:
        mt, kw, _, attn = M.FAMILIES[name]
        return T.AutoConfig.for_model(mt, **dict(kw, **over)), mt, attn
    fam, kw, _ = G.MODELS[name]
    return G.hf_causal(fam, **dict(kw, **over)), fam, "sdpa"


def save_config(name, outdir):
    """OUTDIR/hf_configs/NAME.json: the whole model's config.json, for validate."""
    cfg, _, _ = model_config(name, {})
    cfg.architectures = ["LlamaForCausalLM" if cfg.model_type == "llama" else "MistralForCausalLM"]
    d = os.path.join(outdir, "hf_configs")
    tmp = os.path.join(d, "_tmp")
    cfg.save_pretrained(tmp)  # as collect_more.build_hf writes its configs
    os.replace(os.path.join(tmp, "config.json"), os.path.join(d, name + ".json"))
    os.rmdir(tmp)


class Stage(nn.Module):
    """torchtitan's model part as PipelineStage runs it: one tensor in, one tensor out."""

    def __init__(self, m, first, last, seq):
        super().__init__()
        self.m, self.first, self.last, self.seq = m, first, last, seq
        self.placements = None  # the last stage's logits DTensor placements and mesh (loss_parallel)

    def forward(self, x):
        pos = torch.arange(self.seq, device=x.device).unsqueeze(0).expand(x.shape[0], self.seq)
        kw = dict(input_ids=x) if self.first else dict(inputs_embeds=x)
        h = self.m.model(position_ids=pos, use_cache=False, **kw).last_hidden_state
        if not self.last:
            return h
        logits = self.m.lm_head(h[:, slice(0, None), :])  # LlamaForCausalLM.forward's logits_to_keep=0 slice
        if hasattr(logits, "to_local"):
            self.placements = (logits.device_mesh, logits.placements)
            return logits.to_local()
        return logits


def build(c, rank, mesh, lp):
    """The stage's module, TP-parallelized and fully_shard-ed; (root, inner HF model, stage index, layers)."""
    import transformers as T
    from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
    dp, tp, pp = c["dp"], c["tp"], c["pp"]
    st = rank // (dp * tp)
    first, last = st == 0, st == pp - 1
    total = model_config(c["model"], {})[0].num_hidden_layers
    n = stage_layers(total, pp, st)
    cfg, fam, attn = model_config(c["model"], dict(num_hidden_layers=n))
    with torch.device("cuda"):
        m = M.from_config(T.AutoModelForCausalLM, cfg, attn, None)
    nparam = sum(p.numel() for p in m.parameters())
    if c.get("ckpt"):
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    m.train()
    if not first:
        m.model.embed_tokens = None
    if not last:
        m.model.norm, m.lm_head = None, None
    peak = torch.cuda.max_memory_allocated()
    G.cleanup()  # the other stages' parts: their segments released
    TPF.apply_tp(m, mesh["tp"], lp)  # parallelize_module skips the plan's paths that are None here
    root = Stage(m, first, last, c["seq"])
    pol = MixedPrecisionPolicy(param_dtype=BF, reduce_dtype=torch.float32)
    for layer in m.model.layers:
        fully_shard(layer, mesh=mesh["dp"], mp_policy=pol, reshard_after_forward=False)
    fully_shard(root, mesh=mesh["dp"], mp_policy=pol, reshard_after_forward=False)
    if not last:
        m.model.norm = nn.Identity()  # HF's LlamaModel.forward applies it; torchtitan's norm is None
    return root, m, st, n, nparam, max(peak, torch.cuda.max_memory_allocated()), fam


class Phases:
    """The largest allocated bytes of each phase: the peak is reset at every phase entry."""

    def __init__(self, base):
        self.base, self.cur, self.peak = base, None, {}

    def enter(self, name):
        if self.cur:
            p = torch.cuda.max_memory_allocated() - self.base
            self.peak[self.cur] = max(self.peak.get(self.cur, 0), p)
        torch.cuda.reset_peak_memory_stats()
        self.cur = name


def pipeline(root, m, st, c, mesh, lp, ph):
    """PipelineStage with explicit shapes and Schedule1F1B, the stage's chunk calls marking the phases."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B
    from torch.distributed.tensor import DTensor
    pp, n, seq = c["pp"], c["microbatches"], c["seq"]
    mb, V, H = c["batch"] // n, m.config.vocab_size, m.config.hidden_size
    first, last = st == 0, st == pp - 1
    hid = torch.empty(mb, seq // c["tp"], H, dtype=BF, device="meta")
    inp = torch.empty(mb, seq, dtype=torch.long, device="meta") if first else hid
    out = torch.empty(mb, seq, V // c["tp"] if lp else V, dtype=BF, device="meta") if last else hid
    stage = PipelineStage(root, st, pp, torch.device("cuda", torch.cuda.current_device()), input_args=inp,
                          output_args=out, group=mesh["pp"].get_group())
    if last:  # the last stage's outputs meta only validates its outputs (nothing is sent or sized from it)
        stage._validate_fwd_outputs = lambda outputs: None
    f, b = stage.forward_one_chunk, stage.backward_one_chunk

    def fwd(*a, **k):
        ph.enter("fwd_peak")
        return f(*a, **k)

    def bwd(*a, **k):
        ph.enter("bwd_peak")
        return b(*a, **k)

    stage.forward_one_chunk, stage.backward_one_chunk = fwd, bwd

    def loss_fn(logits, labels):
        if root.placements is not None:
            mesh_tp, placements = root.placements
            logits = DTensor.from_local(logits, mesh_tp, placements, run_check=False)
        return m.loss_function(logits=logits, labels=labels, vocab_size=V)

    sched = Schedule1F1B(stage, n_microbatches=n, loss_fn=loss_fn)
    ret = "return_outputs" in inspect.signature(sched.step).parameters
    return stage, sched, ret


def run_case(c, rank, mesh, lp):
    from torch.distributed.tensor.parallel import loss_parallel
    import contextlib
    torch.manual_seed(0)
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    root, m, st, n_layers, nparam, build_peak, fam = build(c, rank, mesh, lp)
    first, last = st == 0, st == c["pp"] - 1
    G.cleanup()
    opt = torch.optim.AdamW(root.parameters(), lr=1e-4)
    world = mesh.size()
    r = dict(c, fam=fam, params=nparam, world=world, rank=rank, local_world=world, pg="fake", stage=st,
             stage_layers=n_layers, prec="fsdp-mp-bf16", build_peak_alloc=build_peak - base,
             after_model=torch.cuda.memory_allocated() - base)
    ph = Phases(base)
    stage, sched, ret = pipeline(root, m, st, c, mesh, lp, ph)
    r["return_outputs"] = not ret  # False: step(return_outputs=False) was available and used
    vocab, seq, steps_out = m.config.vocab_size, c["seq"], []
    for s in range(c.get("steps", STEPS)):
        args = (torch.randint(0, vocab, (c["batch"], seq), device="cuda"),) if first else ()
        kw = dict(target=torch.randint(0, vocab, (c["batch"], seq), device="cuda"), losses=[]) if last else {}
        if ret:
            kw["return_outputs"] = False
        torch.cuda.synchronize()
        ph.peak = {}
        rec = {"start": torch.cuda.memory_allocated() - base}
        ph.enter("fwd_peak")
        with loss_parallel() if lp else contextlib.nullcontext():
            sched.step(*args, **kw)
        ph.enter("opt_peak")
        rec["after_bwd"] = torch.cuda.memory_allocated() - base
        opt.step()
        ph.enter(None)
        opt.zero_grad(set_to_none=True)
        del args, kw
        torch.cuda.synchronize()
        rec.update(ph.peak, end=torch.cuda.memory_allocated() - base, reserved=torch.cuda.memory_reserved())
        steps_out.append(rec)
    sm = torch.cuda.memory_stats()
    keys = ("fwd_peak", "bwd_peak", "opt_peak")
    r.update(steps=steps_out, peak_alloc=max(max(p.get(k, 0) for k in keys) for p in steps_out),
             peak_alloc_steady=max(steps_out[-1].get(k, 0) for k in keys),
             peak_reserved=sm["reserved_bytes.all.peak"], num_alloc_retries=sm["num_alloc_retries"])
    del stage, sched, root, m, opt
    return r


def trace_case(c, rank, mesh, lp, tracedir):
    """trace_more.traced over 2 steps of the case (its format; the head's case carries `stage`)."""
    import trace_more as T
    os.makedirs(tracedir, exist_ok=True)
    path = os.path.join(tracedir, f"{c['id']}-w{mesh.size()}-r{rank}.trace.jsonl.gz")
    st = rank // (c["dp"] * c["tp"])
    T.traced(lambda case, _: run_case(case, rank, mesh, lp), dict(c, steps=2, stage=st), path)


CASES = []


def add(model, batch, micro, seq, ckpt=False):
    CASES.append(dict(model=model, batch=batch, microbatches=micro, seq=seq, strategy="fsdp2", fsdp_version=2,
                      opt="adamw", attn="sdpa", ckpt=ckpt, mixed_precision=True, param_dtype="bf16",
                      reduce_dtype="fp32", reshard_after_forward=False, sequence_parallel=True, schedule="1f1b"))


add("llama-1b", 8, 8, 2048)              # micro-batches of 1, twice the stages
add("llama-1b", 8, 8, 2048, ckpt=True)
add("mistral-2b", 8, 4, 2048, ckpt=True)  # micro-batches of 2, as many as the stages
add("mistral-2b", 4, 4, 2048)
SMOKE_CASE = dict(CASES[0], model="pp-smoke", batch=4, microbatches=2, seq=256)

# --all: (dp, tp, pp) and the ranks of stages 0, 1 (the middle stage with the most micro-batches in flight) and last
PLAN = (2, 2, 4)
TRACE = ("llama-1b-fsdp2tppp-dp2tp2pp4-bf16-b8-mb8", 4)


def case_id(c, dp, tp, pp, lp):
    return (f"{c['model']}-fsdp2tppp-dp{dp}tp{tp}pp{pp}-bf16-b{c['batch']}-mb{c['microbatches']}"
            + ("-ckpt" if c["ckpt"] else "") + ("" if lp else "-nolp"))


def one_rank(out, dp, tp, pp, rank, filt, lp, tracedir, cases):
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torch.distributed.device_mesh import init_device_mesh
    world = dp * tp * pp
    torch.cuda.set_device(0)
    dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
    mesh = init_device_mesh("cuda", (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))
    D.warmup(world)
    import transformers
    free, total = torch.cuda.mem_get_info()
    env = dict(torch=torch.__version__, gpu=torch.cuda.get_device_name(), cuda=torch.version.cuda, total=total,
               transformers=transformers.__version__, world_size=world, pg="fake", rank=rank,
               context_used_after_init=total - free - torch.cuda.memory_reserved())
    if not os.path.exists(out) or os.path.getsize(out) == 0:
        with open(out, "a") as f:
            f.write(json.dumps(dict(env=env)) + "\n")
    for c in cases:
        c = dict(c, tp=tp, dp=dp, pp=pp, loss_parallel=lp)
        c["id"] = case_id(c, dp, tp, pp, lp)
        if filt and filt not in c["id"]:
            continue
        t0 = time.time()
        if tracedir:  # the first case that matches only
            try:
                trace_case(c, rank, mesh, lp, tracedir)
                print("traced", c["id"], "rank", rank, round(time.time() - t0, 1), flush=True)
            except Exception:
                print("trace failed", c["id"], "rank", rank, traceback.format_exc()[-2500:], flush=True)
                G.cleanup()
            break
        try:
            r = run_case(c, rank, mesh, lp)
        except torch.OutOfMemoryError:
            r = dict(c, rank=rank, world=world, pg="fake", error="oom")
        except Exception as e:
            r = dict(c, rank=rank, world=world, pg="fake", error=repr(e)[:300], tb=traceback.format_exc()[-2500:])
            print(r["tb"], flush=True)
        G.cleanup()
        r["wall_s"] = round(time.time() - t0, 2)
        with open(out, "a") as f:
            f.write(json.dumps(r) + "\n")
        print(c["id"], "rank", rank, "stage", r.get("stage"),
              r.get("error", "%.3f GiB" % (r.get("peak_alloc", 0) / 2**30)), r["wall_s"], flush=True)
    dist.destroy_process_group()


def spawn(argv, limit):
    """One rank in its own process; its failure or overrun is printed, never raised."""
    t0 = time.time()
    try:
        p = subprocess.run([sys.executable, os.path.abspath(__file__)] + argv, timeout=limit)
        ok = p.returncode == 0
        print("rank run", " ".join(argv), "exit", p.returncode, round(time.time() - t0, 1), "s", flush=True)
    except subprocess.TimeoutExpired:
        ok = False
        print("rank run", " ".join(argv), "passed its", limit, "s and was stopped", flush=True)
    return ok


def run_all(out, tracedir, budget=450):
    dp, tp, pp = PLAN
    t0 = time.time()
    for st in (0, 1, pp - 1):
        left = budget - (time.time() - t0)
        if left < 30:
            print("time budget spent: stage", st, "not run", flush=True)
            continue
        spawn([out, str(dp), str(tp), str(pp), str(st * dp * tp)], min(150, left))
    left = budget - (time.time() - t0)
    if tracedir and left >= 30:
        spawn([out, str(dp), str(tp), str(pp), str(TRACE[1]), TRACE[0], "--trace", tracedir], min(120, left))


def run_smoke(out):
    outdir = os.path.dirname(os.path.abspath(out))
    save_config("pp-smoke", outdir)
    for rank in (0, 2):  # dp 1 x tp 2 x pp 2: stage 0 and stage 1 (the last)
        spawn([out, "1", "2", "2", str(rank), "--smoke-case"], 120)
    spawn([out, "1", "2", "2", "2", "--smoke-case", "--trace", os.path.join(outdir, "pp-smoke-traces")], 120)


def main():
    args = list(sys.argv[1:])
    opts = {}
    for flag, has_value in (("--trace", True), ("--lp", True), ("--all", False), ("--smoke", False),
                            ("--smoke-case", False)):
        if flag in args:
            i = args.index(flag)
            opts[flag] = args[i + 1] if has_value else True
            del args[i:i + (2 if has_value else 1)]
    if args:
        os.makedirs(os.path.dirname(os.path.abspath(args[0])), exist_ok=True)
    if "--all" in opts:
        return run_all(args[0], opts.get("--trace", ""))
    if "--smoke" in opts:
        return run_smoke(args[0])
    out, dp, tp, pp, rank = args[0], int(args[1]), int(args[2]), int(args[3]), int(args[4])
    filt = args[5] if len(args) > 5 else ""
    cases = [SMOKE_CASE] if "--smoke-case" in opts else CASES
    one_rank(out, dp, tp, pp, rank, filt, opts.get("--lp", "1") != "0", opts.get("--trace", ""), cases)


if __name__ == "__main__":
    main()
