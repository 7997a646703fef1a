/* Tests of fine-tuning setups (finetune.h, docs/FINETUNING.md): the LoRA
 * spec parser, trainable parameter counts as peft prints them
 * (print_trainable_parameters), what freezing takes away (gradients,
 * optimizer state, saved inputs), the quantized base's bytes, the load
 * modes' setup peak, and the errors of setups that do not go together.
 *
 * The small cases use tests/data/good/mlp-sim.yaml at batch 1024 in fp32
 * (see test_sim.c): two linear layers 4096 -> 4096 without bias (layers.0.fc,
 * layers.1.fc), GELUs, a head 4096 -> 2560, cross-entropy. Every tensor
 * below is a multiple of 512 B. Run from the repository root. */
#define _POSIX_C_SOURCE 200809L

#include <criterion/criterion.h>

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "vramplan/vramplan.h"

#define MIB ((uint64_t)1 << 20)
#define W 4096ULL                    /* the MLP's width                */
#define CLASSES 2560ULL
#define P_ELEMS (2 * W * W + W * CLASSES)

/* ---- helpers ------------------------------------------------------------ */

static vp_status run(const char *path, uint64_t batch, uint64_t seq,
                     const vp_setup *s, vp_estimate *e, vp_error *err)
{
    memset(err, 0, sizeof *err);
    vp_model *m = vp_model_load(path, err);
    cr_assert_not_null(m, "%s: %s", path, err->msg);
    vp_graph *g = vp_graph_build(m, batch, seq, err);
    cr_assert_not_null(g, "%s: %s", path, err->msg);
    vp_status st = vp_simulate(g, s, e, NULL, NULL, err);
    vp_graph_free(g);
    vp_model_free(m);
    return st;
}

static vp_estimate run_ok(const char *path, uint64_t batch, uint64_t seq,
                          const vp_setup *s)
{
    vp_estimate e;
    vp_error err;
    vp_status st = run(path, batch, seq, s, &e, &err);
    cr_assert_eq(st, VP_OK, "%s: %s (%s)", path, err.msg, vp_err_name(st));
    return e;
}

static void mlp_setup(vp_setup *s)
{
    vp_setup_init(s);
    s->batch = 1024;
    s->fresh_process = false;
    s->steps = 2;
}

static vp_estimate mlp(const vp_setup *s)
{
    return run_ok("tests/data/good/mlp-sim.yaml", 1024, 0, s);
}

static void lora(vp_setup *s, const char *spec)
{
    vp_error err;
    cr_assert_eq(vp_lora_parse(spec, &s->ft.lora, &err), VP_OK, "%s: %s",
                 spec, err.msg);
}

/* A 7B llama at a short sequence: only the parameters matter. */
static vp_estimate llama7b(const char *spec)
{
    vp_setup s;
    vp_setup_init(&s);
    s.precision = VP_PREC_AMP_BF16;
    s.ft.base_dtype = VP_BASE_BF16;
    s.steps = 1;
    lora(&s, spec);
    return run_ok("models/llama-2-7b.yaml", 1, 16, &s);
}

/* ---- the LoRA spec ------------------------------------------------------- */

Test(lora_spec, reads_every_key)
{
    vp_lora l;
    vp_error err;
    cr_assert_eq(vp_lora_parse("r=16,alpha=32,targets=q_proj,v_proj,"
                               "dropout=0.05,dora,rslora,adapter_dtype=base",
                               &l, &err),
                 VP_OK, "%s", err.msg);
    cr_expect_eq(l.r, 16);
    cr_expect_eq(l.alpha, 32.0);
    cr_expect_eq(l.dropout, 0.05);
    cr_expect_str_eq(l.targets, "q_proj,v_proj");
    cr_expect(l.dora && l.rslora && l.adapters_in_base_dtype);
}

Test(lora_spec, unknown_key_is_named)
{
    vp_lora l;
    vp_error err;
    cr_assert_eq(vp_lora_parse("r=8,rank=4,targets=q_proj", &l, &err),
                 VP_EARG);
    cr_expect(strstr(err.msg, "'rank'") != NULL, "%s", err.msg);
}

Test(lora_spec, rank_and_targets_are_required)
{
    vp_lora l;
    vp_error err;
    cr_expect_eq(vp_lora_parse("alpha=16,targets=q_proj", &l, &err), VP_EARG);
    cr_expect_eq(vp_lora_parse("r=8,alpha=16", &l, &err), VP_EARG);
    cr_expect_eq(vp_lora_parse("r=0,targets=q_proj", &l, &err), VP_EARG);
}

Test(lora_spec, dropout_below_one)
{
    vp_lora l;
    vp_error err;
    cr_expect_eq(vp_lora_parse("r=8,targets=q_proj,dropout=1", &l, &err),
                 VP_EARG);
    cr_expect_eq(vp_lora_parse("r=8,targets=q_proj,dropout=-0.1", &l, &err),
                 VP_EARG);
}

/* ---- trainable parameters as peft counts them ----------------------------- */

/* LoraConfig(r=8, target_modules=["q_proj", "v_proj"]) on Llama-2-7b: two
 * 4096 x 4096 projections in 32 layers, r * (4096 + 4096) each */
Test(lora_params, llama7b_qv_r8)
{
    vp_estimate e = llama7b("r=8,alpha=16,targets=q_proj,v_proj");
    cr_expect_eq(e.params, 32ULL * 2 * 8 * (4096 + 4096));
    cr_expect_eq(e.params, 4194304ULL);
}

/* all-linear: q, k, v, o (4096 x 4096) and gate, up, down (4096 x 11008)
 * in 32 layers, not lm_head: 39,976,960 as peft prints it */
Test(lora_params, llama7b_all_linear_r16)
{
    vp_estimate e = llama7b("r=16,alpha=32,targets=all-linear");
    uint64_t per_layer = 4 * 16 * (4096 + 4096) + 3 * 16 * (4096 + 11008);
    cr_expect_eq(e.params, 32 * per_layer);
    cr_expect_eq(e.params, 39976960ULL);
    /* the base's 6,738,415,616 parameters and the adapters */
    cr_expect_eq(e.total_params, 6738415616ULL + 39976960ULL);
}

/* DoRA adds a magnitude vector of out_features per adapted layer */
Test(lora_params, dora_adds_the_magnitude)
{
    vp_estimate e = llama7b("r=8,alpha=16,targets=q_proj,v_proj,dora");
    cr_expect_eq(e.params, 4194304ULL + 32 * 2 * 4096);
}

/* ---- freezing ------------------------------------------------------------ */

/* A frozen layer has no gradient and no AdamW state: what is left is the
 * other layer and the head, with two fp32 moments each */
Test(freeze, no_gradient_no_optimizer_state)
{
    vp_setup s;
    vp_error err;
    mlp_setup(&s);
    cr_assert_eq(vp_freeze_parse("layers.0", &s.ft, &err), VP_OK);
    vp_estimate e = mlp(&s);
    uint64_t trainable = W * W + W * CLASSES;
    cr_expect_eq(e.params, trainable);
    cr_expect_eq(e.total_params, P_ELEMS);
    cr_expect_eq(e.grad_bytes, trainable * 4);
    cr_expect_eq(e.optim_bytes, 2 * trainable * 4);
}

/* layers.0 sees the batch, which needs no grad, and its weight is frozen:
 * its linear saves nothing, its output needs no grad, so its GELU is not
 * recorded either; the layer holds no activations at the peak */
Test(freeze, a_frozen_first_layer_saves_nothing)
{
    vp_setup s;
    vp_error err;
    mlp_setup(&s);
    cr_assert_eq(vp_freeze_parse("layers.0", &s.ft, &err), VP_OK);
    vp_estimate e = mlp(&s);
    for (uint32_t i = 0; i < e.n_top_layers && i < VP_TOP_LAYERS; i++)
        cr_expect(strcmp(e.top_layers[i].name, "layers.0") != 0 ||
                      e.top_layers[i].bytes == 0,
                  "layers.0 holds %llu bytes",
                  (unsigned long long)e.top_layers[i].bytes);
    vp_setup full;
    mlp_setup(&full);
    vp_estimate f = mlp(&full);
    cr_expect_lt(e.peak_alloc, f.peak_alloc);
}

Test(freeze, a_pattern_that_names_nothing_is_an_error)
{
    vp_setup s;
    vp_error err;
    vp_estimate e;
    mlp_setup(&s);
    cr_assert_eq(vp_freeze_parse("layers.7", &s.ft, &err), VP_OK);
    cr_expect_neq(run("tests/data/good/mlp-sim.yaml", 1024, 0, &s, &e, &err),
                  VP_OK);
    cr_expect(strstr(err.msg, "layers.7") != NULL, "%s", err.msg);
}

Test(freeze, everything_frozen_is_nothing_to_train)
{
    vp_setup s;
    vp_error err;
    vp_estimate e;
    mlp_setup(&s);
    cr_assert_eq(vp_freeze_parse("layers,head", &s.ft, &err), VP_OK);
    cr_expect_eq(run("tests/data/good/mlp-sim.yaml", 1024, 0, &s, &e, &err),
                 VP_EARG);
    cr_expect(strstr(err.msg, "nothing to train") != NULL, "%s", err.msg);
}

/* ---- LoRA on the MLP ----------------------------------------------------- */

/* r 16 on both fc layers: A [16, 4096] and B [4096, 16] each, in fp32;
 * only they have gradients and AdamW moments */
Test(lora_mlp, adapters_alone_are_trained)
{
    vp_setup s;
    mlp_setup(&s);
    lora(&s, "r=16,alpha=32,targets=fc");
    vp_estimate e = mlp(&s);
    uint64_t adapters = 2 * 16 * (W + W);
    cr_expect_eq(e.params, adapters);
    cr_expect_eq(e.total_params, P_ELEMS + adapters);
    cr_expect_eq(e.grad_bytes, adapters * 4);
    cr_expect_eq(e.optim_bytes, 2 * adapters * 4);
}

Test(lora_mlp, a_target_that_matches_nothing_is_an_error)
{
    vp_setup s;
    vp_error err;
    vp_estimate e;
    mlp_setup(&s);
    lora(&s, "r=16,targets=q_proj");
    cr_expect_eq(run("tests/data/good/mlp-sim.yaml", 1024, 0, &s, &e, &err),
                 VP_EARG);
    cr_expect(strstr(err.msg, "q_proj") != NULL, "%s", err.msg);
}

/* dropout > 0 keeps the dropped input for lora_A's weight gradient and
 * the dropout mask: more than without */
Test(lora_mlp, dropout_keeps_more)
{
    vp_setup s;
    mlp_setup(&s);
    lora(&s, "r=16,targets=fc");
    vp_estimate plain = mlp(&s);
    lora(&s, "r=16,targets=fc,dropout=0.1");
    vp_estimate drop = mlp(&s);
    cr_expect_gt(drop.peak_alloc, plain.peak_alloc);
}

/* ---- a quantized base ---------------------------------------------------- */

/* NF4 (bitsandbytes quantize_4bit): the 4-bit values two a byte, an fp32
 * absmax per 64 values and the 16-value code; double quantization stores
 * the absmax as uint8 with an fp32 absmax per 256 of them, the 256-value
 * code and the offset. The head (the output layer) stays as it is. */
static uint64_t nf4_bytes(uint64_t n, bool nested)
{
    uint64_t b = n / 64;
    return nested ? n / 2 + 64 + b + (b / 256) * 4 + 1024 + 4
                  : n / 2 + 64 + b * 4;
}

Test(quant, nf4_weight_bytes)
{
    vp_setup s;
    mlp_setup(&s);
    lora(&s, "r=16,targets=fc");
    vp_estimate full = mlp(&s);
    s.ft.quant = VP_QUANT_NF4;
    vp_estimate q = mlp(&s);
    s.ft.double_quant = true;
    vp_estimate dq = mlp(&s);
    /* two fc weights of W x W fp32 become NF4 */
    cr_expect_eq(full.param_bytes - q.param_bytes,
                 2 * (W * W * 4 - nf4_bytes(W * W, false)));
    cr_expect_eq(full.param_bytes - dq.param_bytes,
                 2 * (W * W * 4 - nf4_bytes(W * W, true)));
}

Test(quant, double_quant_needs_four_bits)
{
    vp_setup s;
    vp_error err;
    vp_estimate e;
    mlp_setup(&s);
    lora(&s, "r=16,targets=fc");
    s.ft.quant = VP_QUANT_INT8;
    s.ft.double_quant = true;
    cr_expect_eq(run("tests/data/good/mlp-sim.yaml", 1024, 0, &s, &e, &err),
                 VP_EARG);
}

Test(quant, is_not_cast_from_fp32)
{
    vp_setup s;
    vp_error err;
    vp_estimate e;
    mlp_setup(&s);
    lora(&s, "r=16,targets=fc");
    s.ft.quant = VP_QUANT_NF4;
    s.ft.load = VP_LOAD_FP32_CAST;
    cr_expect_eq(run("tests/data/good/mlp-sim.yaml", 1024, 0, &s, &e, &err),
                 VP_EARG);
}

/* ---- loading ------------------------------------------------------------- */

/* bf16 weights loaded in their dtype peak at the bf16 model; built in
 * fp32 and cast, the fp32 model exists first and the peak is above
 * twice the bf16 model */
Test(load, dtype_never_holds_the_fp32_model)
{
    vp_setup s;
    mlp_setup(&s);
    s.precision = VP_PREC_BF16;
    vp_estimate d = mlp(&s);
    s.ft.load = VP_LOAD_FP32_CAST;
    vp_estimate c = mlp(&s);
    cr_expect_eq(d.setup_peak, P_ELEMS * 2);
    cr_expect_geq(c.setup_peak, P_ELEMS * 4);
    cr_expect_geq(c.peak_alloc, c.setup_peak);
}

Test(load, base_dtype_must_fit_the_precision)
{
    vp_setup s;
    vp_error err;
    vp_estimate e;
    mlp_setup(&s);
    s.ft.base_dtype = VP_BASE_BF16; /* under fp32 training */
    cr_expect_eq(run("tests/data/good/mlp-sim.yaml", 1024, 0, &s, &e, &err),
                 VP_EARG);
    cr_expect(strstr(err.msg, "bf16") != NULL, "%s", err.msg);
}

/* ---- paged 8-bit AdamW --------------------------------------------------- */

/* r 32 on both fc layers: four adapters of 32 x 4096 = 131072 values, over
 * bitsandbytes' 1e5 paging threshold: their uint8 moments (2 x 131072 B
 * each) are paged, outside the allocator, and counted in device_used; the
 * fp32 absmax per 2048 values (64 x 4 B, two per adapter) and the two
 * 1 KiB quantization maps stay in the allocator (blocks of 512 B) */
Test(paged_adamw, moments_outside_the_allocator)
{
    vp_setup s;
    mlp_setup(&s);
    lora(&s, "r=32,targets=fc");
    s.optimizer = VP_OPT_PAGED_ADAMW_8BIT;
    vp_estimate e = mlp(&s);
    cr_expect_eq(e.paged_bytes, 4 * 2 * 131072ULL);
    cr_expect_eq(e.device_used,
                 e.peak_reserved + s.context_bytes + e.paged_bytes);
    /* the allocator rounds each 256 B absmax to a 512 B block */
    cr_expect_eq(e.optim_bytes, 4 * 2 * 512 + 2 * 1024ULL, "%llu",
                 (unsigned long long)e.optim_bytes);
}

/* below 1e5 values the state is torch.zeros_like, in the allocator */
Test(paged_adamw, small_states_are_not_paged)
{
    vp_setup s;
    mlp_setup(&s);
    lora(&s, "r=16,targets=fc");
    s.optimizer = VP_OPT_PAGED_ADAMW_8BIT;
    vp_estimate e = mlp(&s);
    cr_expect_eq(e.paged_bytes, 0);
    /* 2 x 65536 B of moments, 2 absmax of 32 x 4 B (512 B blocks) */
    cr_expect_eq(e.optim_bytes, 4 * (2 * 65536 + 2 * 512) + 2 * 1024ULL);
}

Test(lora_spec, a_key_given_twice_is_an_error)
{
    vp_lora l;
    vp_error err;
    cr_assert_eq(vp_lora_parse("r=16,r=8,targets=q_proj", &l, &err), VP_EARG);
    cr_expect(strstr(err.msg, "'r' is given twice") != NULL, "%s", err.msg);
}

Test(freeze, a_bad_range_is_an_error)
{
    vp_finetune f;
    vp_error err;
    vp_finetune_init(&f);
    cr_expect_eq(vp_freeze_parse("layers.5-2", &f, &err), VP_EARG);
    cr_expect(strstr(err.msg, "'5-2'") != NULL, "%s", err.msg);
    cr_expect_eq(vp_freeze_parse("layers.0-99999999999999999999", &f, &err),
                 VP_EARG);
    cr_expect_eq(vp_freeze_parse("embed,layers.0-15", &f, &err), VP_OK);
}

/* layers.0-0 is layer 0 only: the same as layers.0 */
Test(freeze, a_range_of_one_layer)
{
    vp_setup s, t;
    vp_error err;
    mlp_setup(&s);
    mlp_setup(&t);
    cr_assert_eq(vp_freeze_parse("layers.0-0", &s.ft, &err), VP_OK);
    cr_assert_eq(vp_freeze_parse("layers.0", &t.ft, &err), VP_OK);
    cr_expect_eq(mlp(&s).params, mlp(&t).params);
    cr_expect_eq(mlp(&s).params, W * W + W * CLASSES);
}

/* ---- the attention of a LoRA model under autocast ----------------------- */

/* phi3-mini-16l (the held-out LoRA case's model: one packed qkv_proj of
 * 3 x 3072 outputs, 32 heads of 96) at batch 1, seq 64, LoRA r8 on
 * qkv_proj and o_proj, bf16 AMP. */
#define PHI3 "groundtruth/heldout/hf_configs/phi3-mini-16l.json"
#define PHI3_Q (64ULL * 3072)      /* elements of q (and of k, v)     */

typedef struct {
    uint64_t rope_q_out;        /* bytes of layers.1's rope_q output   */
    uint64_t qkv_id, qkv_bytes; /* the adapted qkv_proj's output       */
    bool qkv_live;
    vp_phase qkv_freed;         /* when it was freed                   */
    bool qkv_seen_free;
} attn_probe;

static void probe_event(const vp_sim_event *ev, void *ud)
{
    attn_probe *p = ud;
    if (ev->step != 1)
        return;
    if (!ev->is_free && ev->phase == VP_PHASE_FORWARD &&
        ev->category == VP_CAT_ACT &&
        strcmp(ev->op, "layers.1.attn.rope_q") == 0)
        p->rope_q_out = ev->bytes;
    /* the last allocation of the adapted projection that is still live
     * when the projection is done: the sum base + lora_B(...) * scaling */
    if (strcmp(ev->op, "layers.1.attn.qkv_proj.lora") == 0 &&
        ev->bytes == p->qkv_bytes && ev->phase == VP_PHASE_FORWARD) {
        if (!ev->is_free) {
            p->qkv_id = ev->tensor;
            p->qkv_live = true;
        } else if (ev->tensor == p->qkv_id) {
            p->qkv_live = false;
        }
        return;
    }
    if (ev->is_free && p->qkv_live && ev->tensor == p->qkv_id &&
        !p->qkv_seen_free) {
        p->qkv_seen_free = true;
        p->qkv_freed = ev->phase;
    }
}

static attn_probe phi3_lora(vp_base_dtype base)
{
    vp_setup s;
    vp_error err;
    vp_setup_init(&s);
    s.precision = VP_PREC_AMP_BF16;
    s.ft.base_dtype = base;
    s.steps = 1;
    lora(&s, "r=8,alpha=16,targets=qkv_proj,o_proj");
    attn_probe p;
    memset(&p, 0, sizeof p);
    p.qkv_bytes = 3 * PHI3_Q * 2;
    memset(&err, 0, sizeof err);
    vp_model *m = vp_model_load(PHI3, &err);
    cr_assert_not_null(m, "%s", err.msg);
    vp_graph *g = vp_graph_build(m, 1, 64, &err);
    cr_assert_not_null(g, "%s", err.msg);
    vp_estimate e;
    cr_assert_eq(vp_simulate(g, &s, &e, probe_event, &p, &err), VP_OK, "%s",
                 err.msg);
    vp_graph_free(g);
    vp_model_free(m);
    return p;
}

/* transformers' rotary embedding returns cos.to(x.dtype), x the embedding's
 * output: over a bf16 base under autocast q * cos + rotate_half(q) * sin
 * stays bf16 (the held-out phi3 LoRA trace: 25165824 B at batch 2, seq
 * 2048); over an fp32 base it is promoted to fp32 */
Test(lora_attention, rotary_output_in_the_embedding_dtype)
{
    cr_expect_eq(phi3_lora(VP_BASE_BF16).rope_q_out, PHI3_Q * 2);
    cr_expect_eq(phi3_lora(VP_BASE_FP32).rope_q_out, PHI3_Q * 4);
}

/* HF's DynamicCache copies k and v in a peft model too (cache_utils.py,
 * DynamicLayer.update; the held-out trace shows the copies), so the
 * attention saves the copy of v, not a view of the packed qkv output: the
 * adapted qkv_proj's output is freed in the layer's forward, not kept for
 * backward */
Test(lora_attention, the_packed_qkv_is_not_kept)
{
    attn_probe p = phi3_lora(VP_BASE_BF16);
    cr_expect(p.qkv_seen_free, "the qkv output is never freed");
    cr_expect_eq(p.qkv_freed, VP_PHASE_FORWARD);
}
