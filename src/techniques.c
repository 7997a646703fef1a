/* What each technique buys: the user's setup, changed one way at a time. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

typedef struct {
    vp_setup s;
    const char *ckpt;   /* checkpoint spec, or "auto"                  */
    char name[48], change[96], note[128];
    bool applicable;
} variant;

static vp_status eval_variant(const vp_model *m, const variant *v,
                              const vp_hw *hw, vp_technique_result *r,
                              vp_error *err)
{
    memset(r, 0, sizeof *r);
    snprintf(r->name, sizeof r->name, "%s", v->name);
    snprintf(r->change, sizeof r->change, "%s", v->change);
    snprintf(r->note, sizeof r->note, "%s", v->note);
    r->applicable = v->applicable;
    if (!v->applicable)
        return VP_OK;
    vp_graph *g = vp_graph_build_target(m, v->s.batch, v->s.seq, v->s.target,
                                        err);
    if (!g) {
        if (err && err->code == VP_EOVERFLOW) {
            vp_error_clear(err);
            snprintf(r->note, sizeof r->note, "tensors overflow 64 bits");
            return VP_OK;
        }
        return err ? err->code : VP_ESCHEMA;
    }
    if (vp__graph_search_check(g, err) != VP_OK) {
        vp_graph_free(g);
        return VP_ELIMIT;
    }
    size_t ns = vp_graph_segment_count(g);
    bool *mask = calloc(ns ? ns : 1, sizeof *mask);
    vp_status st = VP_OK;
    if (!mask) {
        st = vp_error_set(err, VP_ENOMEM, "out of memory");
        goto done;
    }
    vp_setup s = v->s;
    const char *spec = v->ckpt;
    if (spec && !strcmp(spec, "auto")) {
        vp_ckpt_plan cp;
        st = vp_checkpoint_auto(m, &s, mask, ns, &cp, err);
        if (st == VP_EOOM) {
            vp_error_clear(err);
            snprintf(r->note, sizeof r->note,
                     "no checkpoint placement fits the budget");
            for (size_t i = 0; i < ns; i++)
                mask[i] = true;
            st = VP_OK;
        } else if (st != VP_OK) {
            goto done;
        } else {
            snprintf(r->note, sizeof r->note,
                     "%zu of %zu segments, recompute %.1f%% of the FLOPs",
                     cp.n_checkpointed, cp.n_segments,
                     cp.step_flops > 0
                         ? 100.0 * cp.recompute_flops / cp.step_flops
                         : 0.0);
        }
        spec = NULL;
    } else if ((st = vp_graph_checkpoint_select(g, spec, mask, err)) !=
               VP_OK) {
        goto done;
    }
    s.checkpoint = mask;
    s.n_checkpoint = ns;
    /* peak without a limit, then whether it fits under the budget */
    s.skip_breakdown = true;
    vp_setup free_s = s;
    free_s.alloc.limit = 0;
    free_s.alloc.device_total = 0; /* the GPU's size caps reserved too */
    vp_estimate e;
    st = vp_simulate(g, &free_s, &e, NULL, NULL, err);
    if (st == VP_EARG && vp_finetune_active(&s.ft)) {
        /* a model with no linear layer to adapt */
        snprintf(r->note, sizeof r->note, "%.127s", err ? err->msg : "");
        vp_error_clear(err);
        r->applicable = false;
        st = VP_OK;
        goto done;
    }
    if (st == VP_EOVERFLOW) {
        vp_error_clear(err);
        snprintf(r->note, sizeof r->note, "sizes overflow 64 bits");
        st = VP_OK;
        goto done;
    }
    if (st != VP_OK)
        goto done;
    r->peak_alloc = e.peak_alloc;
    r->peak_reserved = e.peak_reserved;
    st = vp_simulate(g, &s, &e, NULL, NULL, err);
    r->fits = st == VP_OK;
    if (st == VP_EOOM) {
        vp_error_clear(err);
        st = VP_OK;
    }
    if (st != VP_OK)
        goto done;
    /* the largest micro-batch with this technique */
    vp_maxbatch_result mb;
    vp_setup ms = s;
    ms.steps = VP_STEADY_STEPS;
    ms.checkpoint = NULL;
    ms.n_checkpoint = 0;
    const char *mspec = v->ckpt && !strcmp(v->ckpt, "auto") ? "all" : v->ckpt;
    st = vp_maxbatch(m, &ms, mspec, (uint64_t)1 << 20, &mb, err);
    if (st != VP_OK)
        goto done;
    r->max_batch = mb.max_batch;
    if (hw && r->fits) {
        vp_step_time t;
        st = vp_step_time_estimate(g, &s, hw, &t, err);
        if (st != VP_OK)
            goto done;
        r->step_s = t.total;
        uint32_t accum = s.inference ? 1 : s.accum;
        if (t.total > 0)
            r->samples_per_s = (double)(s.batch * accum) / t.total;
    }
done:
    free(mask);
    vp_graph_free(g);
    return st;
}

static variant *add(variant *v, size_t *n, size_t cap, const vp_setup *base,
                    const char *base_ckpt, const char *name,
                    const char *change)
{
    if (*n >= cap)
        return NULL;
    variant *x = &v[(*n)++];
    memset(x, 0, sizeof *x);
    x->s = *base;
    x->ckpt = base_ckpt;
    x->applicable = true;
    snprintf(x->name, sizeof x->name, "%s", name);
    snprintf(x->change, sizeof x->change, "%s", change);
    return x;
}

/* LoRA and QLoRA as the peft and bitsandbytes recipes set them up: r 16,
 * alpha 32, dropout 0.05 on every linear layer but the head; a half base
 * under autocast (LoRA), an NF4 base with double quantization, paged 8-bit
 * AdamW and checkpointing (QLoRA). docs/FINETUNING.md. */
static void add_finetuning(variant *v, size_t *nv, size_t C,
                           const vp_setup *base, const char *base_ckpt,
                           const vp_hw *hw)
{
    bool bf = !hw || vp_hw_matmul_rate(hw, VP_PREC_AMP_BF16) > 0;
    static const struct {
        const char *name, *change, *ckpt;
        bool quant;
    } rows[] = {
        {"LoRA r16", "peft LoRA r16 on all linear layers, frozen half "
         "base, autocast", NULL, false},
        {"LoRA r16 + checkpoint", "LoRA r16, every segment checkpointed",
         "all", false},
        {"QLoRA r16 (NF4)", "NF4 base (double quant), LoRA r16, paged "
         "8-bit AdamW, checkpoint", "all", true},
    };

    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        variant *x = add(v, nv, C, base, rows[i].ckpt ? rows[i].ckpt
                                                      : base_ckpt,
                         rows[i].name, rows[i].change);
        if (x == NULL)
            return;
        x->s.precision = bf ? VP_PREC_AMP_BF16 : VP_PREC_AMP_FP16;
        x->s.ft.base_dtype = bf ? VP_BASE_BF16 : VP_BASE_FP16;
        x->s.ft.lora.r = 16;
        x->s.ft.lora.alpha = 32;
        x->s.ft.lora.dropout = 0.05;
        snprintf(x->s.ft.lora.targets, sizeof x->s.ft.lora.targets,
                 "all-linear");
        x->s.weight_bits = 0;
        if (rows[i].quant) {
            x->s.ft.quant = VP_QUANT_NF4;
            x->s.ft.double_quant = true;
            x->s.optimizer = VP_OPT_PAGED_ADAMW_8BIT;
            if (x->s.ft.load == VP_LOAD_FP32_CAST)
                x->s.ft.load = VP_LOAD_DTYPE;
        }
    }
}

vp_status vp_techniques(const vp_model *m, const vp_setup *base,
                        const char *base_ckpt, const vp_hw *hw,
                        vp_technique_result *out, size_t cap, size_t *n,
                        vp_error *err)
{
    *n = 0;
    vp_error_clear(err);
    if (base->alloc.limit == 0)
        return vp_error_set(err, VP_EARG, "techniques needs a budget");
    variant v[VP_TECHNIQUES_MAX];
    size_t nv = 0;
    const size_t C = VP_TECHNIQUES_MAX;
    variant *x;
    bool training = !base->inference;
    add(v, &nv, C, base, base_ckpt, "baseline", "your setup");
    if (training) {
        x = add(v, &nv, C, base, base_ckpt,
                base->set_to_none ? "set_to_none=False" : "set_to_none=True",
                base->set_to_none
                    ? "zero_grad(set_to_none=False): grads kept allocated"
                    : "zero_grad(set_to_none=True): grads freed each step");
        x->s.set_to_none = !base->set_to_none;
        x = add(v, &nv, C, base, base_ckpt, "no_grad inference",
                "forward only under torch.no_grad()");
        x->s.inference = true;
    }
    static const struct {
        vp_precision p;
        const char *name, *change;
    } precs[] = {
        {VP_PREC_AMP_FP16, "amp-fp16", "autocast fp16 with GradScaler"},
        {VP_PREC_AMP_BF16, "amp-bf16", "autocast bf16"},
        {VP_PREC_BF16, "pure bf16", "model and optimizer in bf16"},
    };
    for (size_t i = 0; i < 3; i++) {
        if (precs[i].p == base->precision)
            continue;
        x = add(v, &nv, C, base, base_ckpt, precs[i].name, precs[i].change);
        x->s.precision = precs[i].p;
        if (hw && vp_hw_matmul_rate(hw, precs[i].p) <= 0) {
            x->applicable = false;
            snprintf(x->note, sizeof x->note, "the GPU has no %s rate",
                     precs[i].name);
        }
    }
    if (training) {
        x = add(v, &nv, C, base, "all", "checkpoint every layer",
                "activation checkpointing of every segment");
        x = add(v, &nv, C, base, "auto", "checkpoint optimal",
                "least recomputation that fits the budget (exact DP)");
        for (uint32_t k = 2; k <= 4; k *= 2) {
            char nm[48], ch[96];
            snprintf(nm, sizeof nm, "accumulation x%u", k);
            snprintf(ch, sizeof ch,
                     "micro-batch %llu x %u steps (same global batch)",
                     (unsigned long long)(base->batch / k), k * base->accum);
            x = add(v, &nv, C, base, base_ckpt, nm, ch);
            if (base->batch % k) {
                x->applicable = false;
                snprintf(x->note, sizeof x->note,
                         "batch %llu is not a multiple of %u",
                         (unsigned long long)base->batch, k);
            } else {
                x->s.batch = base->batch / k;
                x->s.accum = base->accum * k;
            }
        }
        if (base->optimizer == VP_OPT_ADAMW ||
            base->optimizer == VP_OPT_ADAMW_FORLOOP) {
            x = add(v, &nv, C, base, base_ckpt, "fused AdamW",
                    "AdamW(fused=True): no foreach temporaries");
            x->s.optimizer = VP_OPT_ADAMW_FUSED;
        }
        if (base->optimizer != VP_OPT_ADAMW_8BIT) {
            x = add(v, &nv, C, base, base_ckpt, "8-bit AdamW",
                    "bitsandbytes AdamW8bit: 1-byte moments");
            x->s.optimizer = VP_OPT_ADAMW_8BIT;
        }
        if (!base->offload_optimizer) {
            x = add(v, &nv, C, base, base_ckpt, "optimizer offload",
                    "optimizer state on the host (CPU Adam)");
            x->s.offload_optimizer = true;
        }
        if (!base->offload_activations) {
            x = add(v, &nv, C, base, base_ckpt, "activation offload",
                    "saved activations on the host (save_on_cpu)");
            x->s.offload_activations = true;
        }
        for (uint32_t bits = 8; bits >= 2; bits /= 2) {
            char nm[48], ch[96];
            snprintf(nm, sizeof nm, "ActNN %u-bit", bits);
            snprintf(ch, sizeof ch,
                     "saved activations compressed to %u bits", bits);
            x = add(v, &nv, C, base, base_ckpt, nm, ch);
            x->s.act_bits = bits;
        }
        /* combinations */
        /* on GPUs without bf16 the combinations use fp16 */
        bool bf = !hw || vp_hw_matmul_rate(hw, VP_PREC_AMP_BF16) > 0;
        x = add(v, &nv, C, base, "all",
                bf ? "amp-bf16 + checkpoint" : "amp-fp16 + checkpoint",
                bf ? "autocast bf16, every segment checkpointed"
                   : "autocast fp16, every segment checkpointed");
        x->s.precision = bf ? VP_PREC_AMP_BF16 : VP_PREC_AMP_FP16;
        x = add(v, &nv, C, base, "all",
                bf ? "bf16 + checkpoint + 8-bit" : "fp16 + checkpoint + 8-bit",
                bf ? "pure bf16, every segment checkpointed, 8-bit AdamW"
                   : "pure fp16, every segment checkpointed, 8-bit AdamW");
        x->s.precision = bf ? VP_PREC_BF16 : VP_PREC_FP16;
        x->s.optimizer = VP_OPT_ADAMW_8BIT;
    }
    if (training && base->ft.lora.r == 0 && base->ft.quant == VP_QUANT_NONE)
        add_finetuning(v, &nv, C, base, base_ckpt, hw);
    /* INT8 weights freeze the linear layers: an inference figure */
    x = add(v, &nv, C, base, NULL, "INT8 weights (inference)",
            "bitsandbytes int8 linear weights, forward under no_grad");
    if (x) {
        x->s.inference = true;
        x->s.weight_bits = 8;
        x->s.offload_optimizer = false;
        x->s.offload_activations = false;
        x->s.act_bits = 0;
    }
    for (size_t i = 0; i < nv && *n < cap; i++) {
        vp_status st = eval_variant(m, &v[i], hw, &out[*n], err);
        if (st != VP_OK)
            return st;
        (*n)++;
    }
    return VP_OK;
}
