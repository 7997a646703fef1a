/* Tests of encoder-decoder models (the transformer form's type
 * encoder-decoder and Hugging Face t5/mt5 config.json, graph_encdec.c,
 * hf_t5.c) and of the graph form's ops for U-Nets and conditioning
 * (conv_transpose2d, upsample, cross_attention, the `context` input).
 * Every expected shape and count is derived in the comments from the
 * architecture; parameter counts of the measured models are those of
 * groundtruth/h200-torch2.11-families.jsonl (sum(p.numel()), transformers
 * 5.17). Run from the repository root. */
#include <criterion/criterion.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vramplan/vramplan.h"

static vp_model *parse(const char *text)
{
    vp_error err;
    memset(&err, 0, sizeof err);
    vp_model *m = vp_model_parse_buf(text, strlen(text), "inline.yaml", 0,
                                     &err);
    cr_assert_not_null(m, "%s:%u:%u: %s", err.path, err.line, err.col,
                       err.msg);
    return m;
}

static vp_model *load(const char *path)
{
    vp_error err;
    memset(&err, 0, sizeof err);
    vp_model *m = vp_model_load(path, &err);
    cr_assert_not_null(m, "%s: %s", path, err.msg);
    return m;
}

static vp_graph *build(const vp_model *m, uint64_t b, uint64_t s, uint64_t t)
{
    vp_error err;
    memset(&err, 0, sizeof err);
    vp_graph *g = vp_graph_build_target(m, b, s, t, &err);
    cr_assert_not_null(g, "%s:%u:%u: %s", err.path, err.line, err.col,
                       err.msg);
    return g;
}

static const vp_op *find(const vp_graph *g, const char *name)
{
    for (size_t i = 0; i < vp_graph_op_count(g); i++)
        if (!strcmp(vp_graph_op(g, i)->name, name))
            return vp_graph_op(g, i);
    cr_assert_fail("no op %s", name);
    return NULL;
}

static size_t index_of(const vp_graph *g, const vp_op *o)
{
    for (size_t i = 0; i < vp_graph_op_count(g); i++)
        if (vp_graph_op(g, i) == o)
            return i;
    return SIZE_MAX;
}

static uint64_t params_of(const vp_graph *g)
{
    uint64_t n = 0;
    vp_error err;
    cr_assert_eq(vp_graph_num_params(g, &n, &err), VP_OK);
    return n;
}

/* ---- the graph form's new ops ------------------------------------------- */

static const char UNET_OPS[] =
    "name: ops\n"
    "seq: 5\n"
    "graph:\n"
    "  input: [batch, 8, image, image]\n"
    "  context: [batch, 7, 32]\n"
    "  blocks:\n"
    "    down:\n"
    "      ops:\n"
    "        - {name: conv, op: conv2d, out: 8, kernel: 3, padding: 1}\n"
    "  ops:\n"
    "    - {name: d, block: down}\n"
    "    - {name: up, op: conv_transpose2d, out: 16, kernel: 4, stride: 2,"
    " padding: 1}\n"
    "    - {name: near, op: upsample, input: d, scale: 3}\n"
    "    - {name: bil, op: upsample, input: d, mode: bilinear}\n"
    "    - {name: cat, op: concat, inputs: [bil, d], dim: 1}\n"
    "    - {name: tok, op: reshape, input: up, shape: [batch, 100, 16]}\n"
    "    - {name: x, op: cross_attention, inputs: [tok, $context],"
    " heads: 4, bias: false}\n"
    "    - {op: mse_loss}\n";

/* ConvTranspose2d: (H - 1) s - 2p + k = 4 * 2 - 2 + 4 = 10 */
Test(graph_unet_ops, conv_transpose2d_output_side)
{
    vp_model *m = parse(UNET_OPS);
    vp_graph *g = build(m, 2, 0, 0);
    const vp_op *o = find(g, "up");
    cr_expect_eq(o->kind, VP_OP_CONV_TRANSPOSE2D);
    cr_expect_eq(o->shape[1], 16);
    cr_expect_eq(o->shape[2], 10);
    cr_expect_eq(o->shape[3], 10);
    vp_graph_free(g);
    vp_model_free(m);
}

/* its weight is [in, out / groups, k, k] = 8 * 16 * 4 * 4, and a bias */
Test(graph_unet_ops, conv_transpose2d_parameters)
{
    vp_model *m = parse(UNET_OPS);
    vp_graph *g = build(m, 2, 0, 0);
    const vp_op *o = find(g, "up");
    cr_assert_eq(o->n_params, 2);
    cr_expect_eq(vp_graph_param(g, o->params[0])->numel, 8 * 16 * 4 * 4);
    cr_expect_eq(vp_graph_param(g, o->params[1])->numel, 16);
    vp_graph_free(g);
    vp_model_free(m);
}

Test(graph_unet_ops, upsample_scales_the_sides)
{
    vp_model *m = parse(UNET_OPS);
    vp_graph *g = build(m, 2, 0, 0);
    const vp_op *n = find(g, "near"), *b = find(g, "bil");
    cr_expect_eq(n->shape[2], 15);
    cr_expect_eq(n->shape[3], 15);
    cr_expect_eq(b->shape[2], 10); /* the default scale is 2 */
    cr_expect_eq(n->n_params, 0);
    vp_graph_free(g);
    vp_model_free(m);
}

Test(graph_unet_ops, concat_joins_a_skip_over_a_block)
{
    vp_model *m = parse(UNET_OPS);
    vp_graph *g = build(m, 2, 0, 0);
    const vp_op *c = find(g, "cat"), *d = find(g, "d.conv");
    cr_expect_eq(c->n_inputs, 2);
    cr_expect_eq(c->inputs[1], index_of(g, d));
    cr_expect_eq(c->shape[1], 16); /* 8 + 8 channels */
    vp_graph_free(g);
    vp_model_free(m);
}

Test(graph_unet_ops, context_is_a_second_input)
{
    vp_model *m = parse(UNET_OPS);
    vp_graph *g = build(m, 3, 0, 0);
    const vp_op *c = vp_graph_op(g, 1);
    cr_expect_eq(c->kind, VP_OP_INPUT);
    cr_expect_str_eq(c->name, "context");
    cr_expect_eq(c->shape[0], 3);
    cr_expect_eq(c->shape[1], 7);
    cr_expect_eq(c->shape[2], 32);
    vp_graph_free(g);
    vp_model_free(m);
}

/* queries of the tokens (100), keys and values of the context (7) */
Test(graph_unet_ops, cross_attention_core_lengths)
{
    vp_model *m = parse(UNET_OPS);
    vp_graph *g = build(m, 2, 0, 0);
    const vp_op *core = find(g, "x.core");
    cr_expect_eq(core->kind, VP_OP_ATTENTION);
    cr_expect_eq(core->q_len, 100);
    cr_expect_eq(core->kv_len, 7);
    cr_expect_eq(core->head_dim, 4); /* 16 / 4 heads */
    cr_expect_eq(core->n_inputs, 3);
    const vp_op *k = vp_graph_op(g, core->inputs[1]);
    cr_expect_str_eq(k->name, "x.to_k");
    cr_expect_eq(k->inputs[0], 1); /* the context */
    vp_graph_free(g);
    vp_model_free(m);
}

/* to_q 16 x 16, to_k and to_v 32 x 16, to_out 16 x 16, no biases */
Test(graph_unet_ops, cross_attention_parameters)
{
    vp_model *m = parse(UNET_OPS);
    vp_graph *g = build(m, 2, 0, 0);
    uint64_t n = 0;
    const char *names[] = {"x.to_q", "x.to_k", "x.to_v", "x.to_out"};
    for (int i = 0; i < 4; i++) {
        const vp_op *o = find(g, names[i]);
        cr_expect_eq(o->n_params, 1, "%s", names[i]);
        n += vp_graph_param(g, o->params[0])->numel;
    }
    cr_expect_eq(n, 16 * 16 + 2 * 32 * 16 + 16 * 16);
    vp_graph_free(g);
    vp_model_free(m);
}

Test(graph_unet_ops, context_reaches_into_blocks)
{
    vp_model *m = parse("name: c\n"
                        "seq: 6\n"
                        "graph:\n"
                        "  input: [batch, seq, 16]\n"
                        "  context: [batch, 3, 8]\n"
                        "  blocks:\n"
                        "    b:\n"
                        "      ops:\n"
                        "        - {name: x, op: cross_attention,"
                        " inputs: [$input, $context], heads: 2}\n"
                        "  ops:\n"
                        "    - {name: l, block: b, repeat: 2}\n"
                        "    - {op: mse_loss}\n");
    vp_graph *g = build(m, 1, 0, 0);
    cr_expect_eq(find(g, "l.0.x.to_k")->inputs[0], 1);
    cr_expect_eq(find(g, "l.1.x.to_v")->inputs[0], 1);
    vp_graph_free(g);
    vp_model_free(m);
}

/* ---- encoder-decoder ------------------------------------------------------ */

static const char T5_TINY[] = "name: t5-tiny\n"
                              "seq: 32\n"
                              "transformer:\n"
                              "  type: encoder-decoder\n"
                              "  hidden: 64\n"
                              "  layers: 2\n"
                              "  heads: 4\n"
                              "  ffn: 256\n"
                              "  vocab: 100\n"
                              "  norm: rmsnorm\n"
                              "  activation: relu\n"
                              "  bias: false\n"
                              "  tied_embeddings: true\n"
                              "  encoder_decoder: {decoder_layers: 3}\n";

Test(encdec_graph, decoder_reads_target_tokens)
{
    vp_model *m = parse(T5_TINY);
    vp_graph *g = build(m, 2, 0, 12);
    cr_expect_eq(vp_graph_target(g), 12);
    const vp_op *d = find(g, "decoder_input_ids");
    cr_expect_eq(d->shape[1], 12);
    cr_expect_eq(find(g, "input_ids")->shape[1], 32);
    vp_graph_free(g);
    vp_model_free(m);
}

Test(encdec_graph, target_defaults_to_seq)
{
    vp_model *m = parse(T5_TINY);
    vp_graph *g = build(m, 2, 20, 0);
    cr_expect_eq(vp_graph_target(g), 20);
    vp_graph_free(g);
    vp_model_free(m);
}

Test(encdec_graph, other_models_have_no_target)
{
    vp_model *m = load("models/gpt2-small.yaml");
    vp_graph *g = build(m, 1, 64, 16);
    cr_expect_eq(vp_graph_target(g), 0);
    vp_graph_free(g);
    vp_model_free(m);
}

/* 2 encoder and 3 decoder blocks, each a checkpoint unit */
Test(encdec_graph, blocks_are_the_segments)
{
    vp_model *m = parse(T5_TINY);
    vp_graph *g = build(m, 1, 0, 8);
    cr_assert_eq(vp_graph_segment_count(g), 5);
    cr_expect_str_eq(vp_graph_segment(g, 1)->name, "encoder.block.1");
    cr_expect_str_eq(vp_graph_segment(g, 4)->name, "decoder.block.2");
    vp_graph_free(g);
    vp_model_free(m);
}

/* cross-attention: queries of the decoder (8), keys of the encoder (32) */
Test(encdec_graph, cross_attention_spans_the_two_lengths)
{
    vp_model *m = parse(T5_TINY);
    vp_graph *g = build(m, 1, 0, 8);
    const vp_op *c = find(g, "decoder.block.1.cross_attn.core");
    cr_expect_eq(c->q_len, 8);
    cr_expect_eq(c->kv_len, 32);
    cr_expect(!c->causal);
    cr_expect(find(g, "decoder.block.1.self_attn.core")->causal);
    cr_expect(!find(g, "encoder.block.1.self_attn.core")->causal);
    vp_graph_free(g);
    vp_model_free(m);
}

/* the shared embedding 100 x 64 (tied to both stacks and the head); per
 * encoder block q, k, v, o 4 x 64 x 64, wi and wo 2 x 64 x 256, two norms
 * 2 x 64; per decoder block also a cross-attention 4 x 64 x 64 and a third
 * norm; the relative position bias 32 x 4 in each stack's first block;
 * two final norms */
Test(encdec_graph, parameters_of_the_tiny_t5)
{
    vp_model *m = parse(T5_TINY);
    vp_graph *g = build(m, 1, 0, 8);
    uint64_t att = 4 * 64 * 64, ff = 2 * 64 * 256;
    uint64_t enc = att + ff + 2 * 64, dec = 2 * att + ff + 3 * 64;
    cr_expect_eq(params_of(g),
                 100 * 64 + 2 * enc + 3 * dec + 2 * 32 * 4 + 2 * 64);
    vp_graph_free(g);
    vp_model_free(m);
}

/* T5ForConditionalGeneration scales the decoder's output before the tied
 * head; MT5ForConditionalGeneration does not */
Test(encdec_graph, t5_scales_the_tied_head_input)
{
    vp_model *m = load("groundtruth/hf_configs/t5-base.json");
    vp_graph *g = build(m, 1, 16, 8);
    cr_expect_eq(find(g, "scale")->kind, VP_OP_SCALE);
    vp_graph_free(g);
    vp_model_free(m);
}

Test(encdec_graph, mt5_has_no_scale)
{
    vp_model *m = load("tests/data/hf/mt5-small.json");
    vp_graph *g = build(m, 1, 16, 8);
    for (size_t i = 0; i < vp_graph_op_count(g); i++)
        cr_expect_neq(vp_graph_op(g, i)->kind, VP_OP_SCALE);
    vp_graph_free(g);
    vp_model_free(m);
}

/* mT5's gated-gelu MLP: wi_0 and wi_1 */
Test(encdec_graph, mt5_gated_feed_forward)
{
    vp_model *m = load("tests/data/hf/mt5-small.json");
    vp_graph *g = build(m, 1, 16, 8);
    cr_expect_eq(find(g, "encoder.block.0.ff.wi_1")->out_features, 1024);
    cr_expect_eq(find(g, "encoder.block.0.ff.act")->kind, VP_OP_GELU_TANH);
    vp_graph_free(g);
    vp_model_free(m);
}

/* ---- parameter counts of the measured models ----------------------------- */

static uint64_t params_of_file(const char *path)
{
    vp_model *m = load(path);
    vp_graph *g = build(m, 1, 0, 0);
    uint64_t n = params_of(g);
    vp_graph_free(g);
    vp_model_free(m);
    return n;
}

Test(encdec_params, t5_base_config_json) /* measured 222903552 */
{
    cr_expect_eq(params_of_file("tests/data/hf/t5-base.json"), 222903552ULL);
}

Test(encdec_params, t5_base_yaml) /* the same model in the YAML form */
{
    cr_expect_eq(params_of_file("models/t5-base.yaml"), 222903552ULL);
}

Test(encdec_params, mt5_small_config_json) /* measured 172119424 */
{
    cr_expect_eq(params_of_file("tests/data/hf/mt5-small.json"),
                 172119424ULL);
}

/* use_cache: the decoder's attentions copy k and v into the cache; the
 * encoder's stack is built with use_cache = False */
Test(encdec_graph, only_the_decoder_caches_keys_and_values)
{
    vp_model *m = parse(T5_TINY);
    vp_graph *g = build(m, 1, 0, 8);
    cr_expect(!(find(g, "encoder.block.0.self_attn.core")->flags &
                VP_OPF_KV_COPY));
    cr_expect(find(g, "decoder.block.0.self_attn.core")->flags &
              VP_OPF_KV_COPY);
    cr_expect(find(g, "decoder.block.0.cross_attn.core")->flags &
              VP_OPF_KV_COPY);
    vp_graph_free(g);
    vp_model_free(m);
}

/* ---- the math kernel in a checkpointed forward ------------------------- */

/* Bytes the encoder's first self-attention core holds (its own
 * allocations) when it allocates the probabilities' cast back to bf16:
 * step 1's forward. */
typedef struct {
    const char *core;
    uint64_t cast_bytes, live, at_cast;
    uint64_t handles[64], sizes[64];
    size_t n;
    bool seen;
} core_watch;

static void watch_core(const vp_sim_event *ev, void *ud)
{
    core_watch *w = ud;
    if (ev->step != 1 || ev->phase != VP_PHASE_FORWARD || w->seen ||
        !ev->op || strcmp(ev->op, w->core))
        return;
    if (ev->is_free) {
        for (size_t i = 0; i < w->n; i++)
            if (w->handles[i] == ev->tensor) {
                w->live -= w->sizes[i];
                w->handles[i] = UINT64_MAX;
            }
        return;
    }
    cr_assert_lt(w->n, 64);
    w->handles[w->n] = ev->tensor;
    w->sizes[w->n++] = ev->bytes;
    w->live += ev->bytes;
    if (ev->bytes == w->cast_bytes) {
        w->at_cast = w->live;
        w->seen = true;
    }
}

/* Under checkpointing nothing is saved (non-reentrant checkpoint's
 * saved-tensor hooks keep none), so what only autograd would hold dies
 * with its last C++ reference (attention.cpp _scaled_dot_product_
 * attention_math): matmul's contiguous copies of q and k with the
 * matmul, the softmax output when `attn = at::dropout(attn, ...)`
 * replaces it, the dropout mask with native_dropout's tuple. At the
 * cast the core holds its locals only: q, k, v upcast to fp32 and q
 * scaled (4 x B·H·S·D x 4 B), the dropout output (B·H·S·S x 4 B) and
 * the cast (B·H·S·S x 2 B). Measured: ho-flan-t5-base-bf16-b16-ckpt's
 * step-1 forward peak, 1238646272 B, predicted 1238662656 B. */
Test(encdec_ckpt, math_attention_keeps_only_its_locals)
{
    vp_model *m = load("models/t5-base.yaml");
    const uint64_t B = 2, S = 256, H = 12, D = 64; /* S != 2D: sizes differ */
    vp_graph *g = build(m, B, S, 32);
    vp_setup s;
    vp_setup_init(&s);
    s.batch = B;
    s.seq = S;
    s.target = 32;
    s.precision = VP_PREC_BF16;
    s.optimizer = VP_OPT_NONE;
    s.attn = VP_ATTN_SDPA;
    s.attn_set = true;
    bool *ck = calloc(vp_graph_segment_count(g), sizeof *ck);
    cr_assert_not_null(ck);
    vp_graph_default_checkpoint(g, ck);
    s.checkpoint = ck;
    s.n_checkpoint = vp_graph_segment_count(g);
    core_watch w;
    memset(&w, 0, sizeof w);
    w.core = find(g, "encoder.block.0.self_attn.core")->name;
    uint64_t P = B * H * S * S;
    w.cast_bytes = 2 * P;
    vp_estimate e;
    vp_error err;
    cr_assert_eq(vp_simulate(g, &s, &e, watch_core, &w, &err), VP_OK, "%s",
                 err.msg);
    cr_assert(w.seen);
    cr_assert_eq(w.at_cast, 4 * (B * H * S * D * 4) + 4 * P + 2 * P,
                 "%llu", (unsigned long long)w.at_cast);
    free(ck);
    vp_graph_free(g);
    vp_model_free(m);
}
