"""Ground truth for vramplan's graph-form U-Nets (models/unet-sd-like.yaml, models/unet-seg.yaml) and the
checkpointed ViT-B/16, on one H200.

The protocol is shared/groundtruth/collect.py's (imported: its ViT builder, batches and step loop for the ViT case;
the same loop written out for the U-Net, whose forward takes latents and a text context): random init on the GPU,
4 training steps, peaks reset before forward, backward and optimizer step, every case in one process after a
warm-up.

    python3 groundtruth/collect_encdec.py OUTDIR            # the cases
    python3 groundtruth/collect_encdec.py OUTDIR trace      # the allocator trace of a checkpointed ViT-B/16

writes OUTDIR/encdec.jsonl (the first line the environment), or with `trace`
OUTDIR/vit-b16-amp-bf16-b32-ckpt.trace.jsonl.gz (shared trace.py's format: 2 steps, the first line the case). The U-Net is written out by hand to mirror
models/unet-sd-like.yaml op for op (diffusers is not installed): ResnetBlock2D, Transformer2DModel with a packed
self-attention (one q/k/v projection, as the graph form's `attention` op), a cross-attention with separate
projections (the graph form's `cross_attention`), a GEGLU feed-forward of two projections; nearest x2 upsampling
then a 3x3 conv; skips concatenated along the channels. Checkpointed cases wrap every module the YAML's
`checkpoint` patterns name (down_*, mid_*, up_*_resnets_*, up_*_attentions_*) in a non-reentrant checkpoint.
"""
import json, os, sys, time, traceback

HERE = os.path.dirname(os.path.abspath(__file__))
for p in (os.path.join(HERE, "..", ".shared"), os.path.join(HERE, "..", "..", "shared", "groundtruth")):
    if os.path.exists(os.path.join(p, "collect.py")):
        sys.path.insert(0, p)
        break
import torch
import torch.nn as nn
import torch.nn.functional as F
import collect as G

DEV = "cuda"
CH = [320, 640, 1280]
HEADS = 8


class Resnet(nn.Module):
    def __init__(self, cin, c):
        super().__init__()
        self.norm1, self.conv1 = nn.GroupNorm(32, cin), nn.Conv2d(cin, c, 3, padding=1)
        self.norm2, self.conv2 = nn.GroupNorm(32, c), nn.Conv2d(c, c, 3, padding=1)
        self.conv_shortcut = nn.Conv2d(cin, c, 1) if cin != c else None

    def forward(self, x):
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        return (self.conv_shortcut(x) if self.conv_shortcut is not None else x) + h


def heads(t, B, L):
    return t.view(B, L, HEADS, -1).transpose(1, 2)


class SelfAttn(nn.Module):  # the graph form's `attention`, layout packed, bias false
    def __init__(self, c):
        super().__init__()
        self.in_proj, self.out_proj = nn.Linear(c, 3 * c, bias=False), nn.Linear(c, c, bias=False)

    def forward(self, x):
        B, L, C = x.shape
        q, k, v = self.in_proj(x).split(C, dim=2)
        o = F.scaled_dot_product_attention(heads(q, B, L), heads(k, B, L), heads(v, B, L))
        return self.out_proj(o.transpose(1, 2).contiguous().reshape(B, L, C))


class CrossAttn(nn.Module):  # the graph form's `cross_attention`, bias false
    def __init__(self, c, cd):
        super().__init__()
        self.to_q, self.to_k, self.to_v = nn.Linear(c, c, bias=False), nn.Linear(cd, c, bias=False), nn.Linear(cd, c, bias=False)
        self.to_out = nn.Linear(c, c, bias=False)

    def forward(self, x, ctx):
        B, L, C = x.shape
        q, k, v = self.to_q(x), self.to_k(ctx), self.to_v(ctx)
        o = F.scaled_dot_product_attention(heads(q, B, L), heads(k, B, ctx.shape[1]), heads(v, B, ctx.shape[1]))
        return self.to_out(o.transpose(1, 2).contiguous().reshape(B, L, C))


class GEGLU(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.hidden, self.gate, self.out = nn.Linear(c, 4 * c), nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

    def forward(self, x):
        return self.out(self.hidden(x) * F.gelu(self.gate(x)))


class Transformer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.norm, self.proj_in, self.proj_out = nn.GroupNorm(32, c), nn.Conv2d(c, c, 1), nn.Conv2d(c, c, 1)
        self.norm1, self.attn1 = nn.LayerNorm(c), SelfAttn(c)
        self.norm2, self.attn2 = nn.LayerNorm(c), CrossAttn(c, 768)
        self.norm3, self.ff = nn.LayerNorm(c), GEGLU(c)

    def forward(self, x, ctx):
        B, C, H, W = x.shape
        h = self.proj_in(self.norm(x)).reshape(B, C, H * W).permute(0, 2, 1)
        h = self.attn1(self.norm1(h)) + h
        h = self.attn2(self.norm2(h), ctx) + h
        h = self.ff(self.norm3(h)) + h
        return self.proj_out(h.permute(0, 2, 1).reshape(B, C, H, W)) + x


class Ck(nn.Module):
    def __init__(self, m, on):
        super().__init__(); self.m, self.on = m, on

    def forward(self, *a):
        if self.on:
            return torch.utils.checkpoint.checkpoint(self.m, *a, use_reentrant=False)
        return self.m(*a)


class UNet(nn.Module):
    def __init__(self, ckpt):
        super().__init__()
        self.conv_in = nn.Conv2d(4, CH[0], 3, padding=1)
        self.down, cin, skc = nn.ModuleList(), CH[0], [CH[0]]
        for lv, c in enumerate(CH):
            for r in range(2):
                self.down.append(Ck(Resnet(cin, c), ckpt)); self.down.append(Ck(Transformer(c), ckpt))
                cin = c; skc.append(c)
            if lv < len(CH) - 1:
                self.down.append(Ck(nn.Conv2d(c, c, 3, stride=2, padding=1), ckpt)); skc.append(c)
        self.mid = nn.ModuleList([Ck(Resnet(cin, cin), ckpt), Ck(Transformer(cin), ckpt), Ck(Resnet(cin, cin), ckpt)])
        self.up = nn.ModuleList()
        for ul, c in enumerate(reversed(CH)):
            for r in range(3):
                self.up.append(Ck(Resnet(cin + skc.pop(), c), ckpt)); self.up.append(Ck(Transformer(c), ckpt))
                cin = c
            if ul < len(CH) - 1:
                self.up.append(nn.Conv2d(c, c, 3, padding=1))  # after the x2 upsample, not checkpointed
        self.norm_out, self.conv_out = nn.GroupNorm(32, CH[0]), nn.Conv2d(CH[0], 4, 3, padding=1)

    def forward(self, x, ctx):
        x = self.conv_in(x)
        skips = [x]
        for m in self.down:
            x = m(x, ctx) if isinstance(m.m, Transformer) else m(x)
            if not isinstance(m.m, Resnet):
                skips.append(x)
        x = self.mid[2](self.mid[1](self.mid[0](x), ctx))
        for m in self.up:
            if isinstance(m, nn.Conv2d):
                x = m(F.interpolate(x, scale_factor=2, mode="nearest"))
            elif isinstance(m.m, Resnet):
                x = m(torch.cat([x, skips.pop()], dim=1))
            else:
                x = m(x, ctx)
        return self.conv_out(F.silu(self.norm_out(x)))


class DoubleConv(nn.Sequential):  # milesial/Pytorch-UNet unet_parts.DoubleConv
    def __init__(self, i, o):
        super().__init__(nn.Conv2d(i, o, 3, padding=1, bias=False), nn.BatchNorm2d(o), nn.ReLU(inplace=True),
                         nn.Conv2d(o, o, 3, padding=1, bias=False), nn.BatchNorm2d(o), nn.ReLU(inplace=True))


class UNetSeg(nn.Module):  # models/unet-seg.yaml: UNet(n_channels=3, n_classes=2, bilinear=False)
    def __init__(self, ckpt):
        super().__init__()
        ch = [64, 128, 256, 512, 1024]
        self.inc = Ck(DoubleConv(3, 64), ckpt)
        self.down = nn.ModuleList([Ck(nn.Sequential(nn.MaxPool2d(2), DoubleConv(ch[i], ch[i + 1])), ckpt)
                                   for i in range(4)])
        self.ups = nn.ModuleList([nn.ConvTranspose2d(ch[i + 1], ch[i], 2, stride=2) for i in reversed(range(4))])
        self.convs = nn.ModuleList([Ck(DoubleConv(ch[i + 1], ch[i]), ckpt) for i in reversed(range(4))])
        self.outc = nn.Conv2d(64, 2, 1)

    def forward(self, x):
        xs = [self.inc(x)]
        for d in self.down:
            xs.append(d(xs[-1]))
        x = xs.pop()
        for up, conv in zip(self.ups, self.convs):
            x = conv(torch.cat([xs.pop(), up(x)], dim=1))
        return self.outc(x)


def run_unet(c):
    b, prec, ckpt, side = c["batch"], c["prec"], c.get("ckpt", False), c.get("seq", 64)
    torch.manual_seed(0)
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    seg = c["model"] == "unet-seg"
    m = (UNetSeg(ckpt) if seg else UNet(ckpt)).to(DEV)
    if prec == "bf16":
        m = m.to(torch.bfloat16)
    m.train()
    r = dict(c, fam="graph", seq=side, params=sum(p.numel() for p in m.parameters()),
             after_model=torch.cuda.memory_allocated() - base)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    ac = torch.bfloat16 if prec == "amp-bf16" else None
    dt = torch.bfloat16 if prec == "bf16" else torch.float32
    out, times = [], []
    for s in range(4):
        x = torch.randn(b, 3 if seg else 4, side, side, device=DEV, dtype=dt)
        ctx = torch.randn(b, 77, 768, device=DEV, dtype=dt)
        noise = (torch.randint(0, 2, (b * side * side,), device=DEV) if seg
                 else torch.randn(b, 4, side, side, device=DEV, dtype=dt))
        torch.cuda.synchronize(); t0 = time.perf_counter()
        torch.cuda.reset_peak_memory_stats()
        ph = {"start": torch.cuda.memory_allocated() - base}
        with torch.autocast("cuda", dtype=ac, enabled=ac is not None):
            if seg:  # the YAML's permute then per-pixel cross-entropy over the classes
                loss = F.cross_entropy(m(x).permute(0, 2, 3, 1).reshape(-1, 2), noise)
            else:
                loss = F.mse_loss(m(x, ctx), noise)
        ph["fwd_peak"] = torch.cuda.max_memory_allocated() - base
        ph["after_fwd"] = torch.cuda.memory_allocated() - base
        torch.cuda.reset_peak_memory_stats()
        loss.backward()
        ph["bwd_peak"] = torch.cuda.max_memory_allocated() - base
        ph["after_bwd"] = torch.cuda.memory_allocated() - base
        torch.cuda.reset_peak_memory_stats()
        opt.step()
        ph["opt_peak"] = torch.cuda.max_memory_allocated() - base
        opt.zero_grad(set_to_none=True)
        del loss, x, ctx, noise
        torch.cuda.synchronize(); times.append(time.perf_counter() - t0)
        ph["end"] = torch.cuda.memory_allocated() - base
        ph["reserved"] = torch.cuda.memory_reserved()
        out.append(ph)
    st = torch.cuda.memory_stats()
    free, total = torch.cuda.mem_get_info()
    keys = ("fwd_peak", "bwd_peak", "opt_peak")
    r.update(steps=out, peak_alloc=max(max(p[k] for k in keys) for p in out),
             peak_alloc_steady=max(out[-1][k] for k in keys), peak_reserved=st["reserved_bytes.all.peak"],
             num_alloc_retries=st["num_alloc_retries"], device_used=total - free,
             step_ms=sorted(times[1:])[len(times[1:]) // 2] * 1e3)
    del m, opt
    return r


CASES = [
    (run_unet, dict(id="unet-sd-like-amp-bf16-b8", model="unet-sd-like", batch=8, prec="amp-bf16")),
    (run_unet, dict(id="unet-sd-like-amp-bf16-b16-ckpt", model="unet-sd-like", batch=16, prec="amp-bf16", ckpt=True)),
    (run_unet, dict(id="unet-sd-like-fp32-b4", model="unet-sd-like", batch=4, prec="fp32")),
    (run_unet, dict(id="unet-seg-amp-bf16-b16", model="unet-seg", batch=16, prec="amp-bf16", seq=256)),
    (run_unet, dict(id="unet-seg-fp32-b8-ckpt", model="unet-seg", batch=8, prec="fp32", seq=256, ckpt=True)),
    (G.run_case, dict(id="vit-b16-amp-bf16-b128-ckpt", model="vit-b16", batch=128, prec="amp-bf16", ckpt=True)),
    (G.run_case, dict(id="vit-b16-amp-bf16-b64-ckpt", model="vit-b16", batch=64, prec="amp-bf16", ckpt=True)),
]


def main():
    outdir = sys.argv[1]
    os.makedirs(outdir, exist_ok=True)
    if sys.argv[2:] == ["trace"]:
        import trace as T  # shared/groundtruth/trace.py
        torch.ones(1, device=DEV) @ torch.ones(1, 1, device=DEV)
        c = dict(id="vit-b16-amp-bf16-b32-ckpt", model="vit-b16", batch=32, prec="amp-bf16", ckpt=True)
        T.trace(c, os.path.join(outdir, c["id"] + ".trace.jsonl.gz"))
        return
    torch.ones(1, device=DEV) @ torch.ones(1, 1, device=DEV)
    w = nn.Linear(64, 64).to(DEV)
    x = torch.randn(32, 64, device=DEV, requires_grad=True)
    torch.utils.checkpoint.checkpoint(w, x, use_reentrant=False).sum().backward()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        w(x).sum().backward()
    del w, x
    G.cleanup()
    with open(os.path.join(outdir, "encdec.jsonl"), "w") as f:
        f.write(json.dumps(dict(env=dict(torch=torch.__version__, gpu=torch.cuda.get_device_name(),
                                         cuda=torch.version.cuda, total=torch.cuda.mem_get_info()[1]))) + "\n")
        for fn, c in CASES:
            t0 = time.time()
            try:
                r = fn(dict(c))
            except torch.OutOfMemoryError:
                r = dict(c, error="oom")
            except Exception as e:
                r = dict(c, error=repr(e)[:300], tb=traceback.format_exc()[-1500:])
            G.cleanup()
            r["wall_s"] = round(time.time() - t0, 2)
            f.write(json.dumps(r) + "\n"); f.flush()
            print(r["id"], r.get("error", ""), r.get("params"), r.get("peak_alloc"), r["wall_s"], flush=True)


if __name__ == "__main__":
    main()
