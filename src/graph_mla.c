/* Multi-head latent attention (DeepSeek-V2/V3) as transformers 5.x runs it
 * (modeling_deepseek_v3.py, DeepseekV3Attention; read off the allocator
 * trace groundtruth/traces/deepseek-v3-small-amp-bf16-b1-s512): q through
 * q_a_proj, q_a_layernorm and q_b_proj (or one q_proj without a q rank);
 * kv_a_proj_with_mqa gives the latent (normed by kv_a_layernorm) and one
 * rotary key per token; the rotary embedding on the rotary parts; q the
 * concatenation of its parts; kv_b_proj expands the latent to each head's
 * k part and v; k the concatenation of its part and the shared rotary
 * key; SDPA with v narrower than q and k; o_proj. The Megatron flavour
 * (tf.megatron: a simulated Megatron-LM rank, megatron.c) builds
 * Megatron-Core's MLASelfAttention instead (meg_mla). */
#include <stdio.h>

#include "graph_tf.h"

/* A view of width w of the last dim of in (graph_transformer.c's slice,
 * through the primitives). */
static vp_status part(vp__tb *c, uint32_t in, const char *leaf, uint64_t w,
                      uint32_t *idx)
{
    const vp_op *io = &c->g->ops[in];
    vp_op o;
    vp__tb_op(&o, VP_OP_SELECT);
    o.n_inputs = 1;
    o.inputs[0] = in;
    o.ndim = io->ndim;
    for (uint32_t i = 0; i < io->ndim; i++)
        o.shape[i] = io->shape[i];
    o.shape[o.ndim - 1] = w;
    return vp__tb_push(c, &o, leaf, idx);
}

/* An MLA concatenation (VP_OP_MLA_Q or VP_OP_MLA_K) of a, b: [B, S,
 * heads x width]. */
static vp_status mla_cat(vp__tb *c, vp_op_kind k, uint32_t a, uint32_t b,
                         uint64_t width, const char *leaf, uint32_t *idx)
{
    const vp_tf *t = c->t;
    const vp_op *ao = &c->g->ops[a];
    vp_op o;
    vp__tb_op(&o, k);
    o.n_inputs = 2;
    o.inputs[0] = a;
    o.inputs[1] = b;
    vp__tb_shape(&o, 3, ao->shape[0], ao->shape[1], t->heads * width, 0);
    o.heads = t->heads;
    o.head_dim = width;
    return vp__tb_push(c, &o, leaf, idx);
}

/* q: [B, S, heads x (nope + rope)] and its rotary part, roped. */
static vp_status mla_q(vp__tb *c, uint32_t x, uint32_t *qb, uint32_t *qr)
{
    const vp_tf *t = c->t;
    const vp_tf_mla *m = &t->x.mla;
    uint64_t qk = m->qk_nope + m->qk_rope;
    if (m->q_lora) {
        uint32_t qa;
        VP_TRY(vp__tb_linear(c, x, "attn.q_a_proj", m->q_lora, false, &qa));
        VP_TRY(vp__tb_norm(c, qa, "attn.q_a_layernorm", true, &qa));
        VP_TRY(vp__tb_linear(c, qa, "attn.q_b_proj", t->heads * qk, false,
                             qb));
    } else {
        VP_TRY(vp__tb_linear(c, x, "attn.q_proj", t->heads * qk, false, qb));
    }
    VP_TRY(part(c, *qb, "attn.q_rot", t->heads * m->qk_rope, qr));
    return vp__tb_unary(c, VP_OP_ROPE, *qr, "attn.rope_q", qr);
}

/* The core attention on q, k, v: [B, S, heads x v_dim] out of q and k
 * of width qk and v of v_dim per head. */
static vp_status core(vp__tb *c, uint32_t x, uint64_t S, uint32_t q,
                      uint32_t k, uint32_t v, uint32_t *a)
{
    const vp_tf *t = c->t;
    const vp_tf_mla *m = &t->x.mla;
    const vp_op *xo = &c->g->ops[x];
    vp_op o;
    vp__tb_op(&o, VP_OP_ATTENTION);
    o.n_inputs = 3;
    o.inputs[0] = q;
    o.inputs[1] = k;
    o.inputs[2] = v;
    vp__tb_shape(&o, 3, xo->shape[0], S, t->heads * m->v_dim, 0);
    o.heads = t->heads;
    o.kv_heads = t->heads;
    o.head_dim = m->qk_nope + m->qk_rope;
    o.v_head_dim = m->v_dim;
    o.q_len = o.kv_len = S;
    o.causal = true;
    o.attn_impl = t->attn;
    o.dropout = t->p_attn;
    o.window = vp__tf_layer_window(t, c->layer);
    o.softcap = t->x.attn_softcap;
    if (t->megatron) {
        /* Transformer Engine's fused attention (TEDotProductAttention,
         * k_channels = qk_head_dim + qk_pos_emb_head_dim, v_channels =
         * v_head_dim: MultiLatentAttention.__init__) on the
         * contiguous q, k, v; its output [s, b, heads x v] is a view */
        o.attn_impl = VP_ATTN_FLASH;
        o.flags |= VP_OPF_MEGATRON;
    }
    return vp__tb_push(c, &o, "attn.core", a);
}

/* Megatron-Core's MLASelfAttention (megatron/core/transformer/
 * multi_latent_attention.py, get_query_key_value_tensors and
 * qkv_up_proj_and_rope_apply; the Transformer Engine layer spec of
 * models/gpt/gpt_layer_specs.py with qk_layernorm, DeepSeek-V3's):
 * linear_q_down_proj and linear_kv_down_proj are TELinear with
 * parallel_mode 'duplicated' (whole weights on every tensor-parallel
 * rank, on the rank's own s/t tokens under sequence parallelism);
 * linear_q_up_proj and linear_kv_up_proj are TELayerNormColumnParallel-
 * Linear (q_layernorm, kv_layernorm fused in: the norm saves its input
 * and rstd, the GEMM its sequence-parallel-sharded normed input, gathered
 * for the GEMM), heads / t each; the rotary key is gathered over the
 * sequence-parallel group (gather_from_sequence_parallel_region) and
 * roped; query = cat(q_no_pe, roped q_pos_emb), key = cat(k_no_pe, the
 * rotary key expanded over the heads), value = the split's .contiguous()
 * copy; the core attention saves q, k, v, its output and the logsumexp;
 * linear_proj is row-parallel (heads x v_head_dim / t inputs). */
static vp_status meg_mla(vp__tb *c, uint32_t x, uint64_t S, uint32_t *out)
{
    const vp_tf *t = c->t;
    const vp_tf_mla *m = &t->x.mla;
    uint64_t qk = m->qk_nope + m->qk_rope;
    uint32_t qa = x, qb, qr, q, kva, lat, kr, kvb, k, v, a;
    c->duplicated = true;
    vp_status st = VP_OK;
    if (m->q_lora)
        st = vp__tb_linear(c, x, "attn.linear_q_down_proj", m->q_lora,
                           false, &qa);
    if (st == VP_OK)
        st = vp__tb_linear(c, x, "attn.linear_kv_down_proj",
                           m->kv_lora + m->qk_rope, false, &kva);
    c->duplicated = false;
    VP_TRY(st);
    if (m->q_lora) {
        VP_TRY(vp__tb_norm(c, qa, "attn.q_layernorm", true, &qa));
        VP_TRY(vp__tb_linear(c, qa, "attn.linear_q_up_proj", t->heads * qk,
                             false, &qb));
    } else { /* linear_q_proj: column-parallel */
        VP_TRY(vp__tb_linear(c, x, "attn.linear_q_proj", t->heads * qk,
                             false, &qb));
    }
    VP_TRY(part(c, qb, "attn.q_pos_emb", t->heads * m->qk_rope, &qr));
    VP_TRY(vp__tb_unary(c, VP_OP_ROPE, qr, "attn.rope_q", &qr));
    VP_TRY(part(c, kva, "attn.kv_compressed", m->kv_lora, &lat));
    VP_TRY(part(c, kva, "attn.k_pos_emb", m->qk_rope, &kr));
    VP_TRY(vp__tb_norm(c, lat, "attn.kv_layernorm", true, &lat));
    VP_TRY(vp__tb_linear(c, lat, "attn.linear_kv_up_proj",
                         t->heads * (m->qk_nope + m->v_dim), false, &kvb));
    /* the rotary key gathered to the whole sequence, then roped */
    vp_op o;
    vp__tb_op(&o, VP_OP_ROPE);
    o.n_inputs = 1;
    o.inputs[0] = kr;
    vp__tb_shape(&o, 3, c->g->ops[x].shape[0], S, m->qk_rope, 0);
    VP_TRY(vp__tb_push(c, &o, "attn.rope_k", &kr));
    VP_TRY(mla_cat(c, VP_OP_MLA_Q, qb, qr, qk, "attn.query", &q));
    VP_TRY(mla_cat(c, VP_OP_MLA_K, kvb, kr, qk, "attn.key", &k));
    VP_TRY(part(c, kvb, "attn.v", t->heads * m->v_dim, &v));
    VP_TRY(vp__tb_unary(c, VP_OP_SCALE, v, "attn.value", &v));
    VP_TRY(core(c, x, S, q, k, v, &a));
    return vp__tb_linear(c, a, "attn.linear_proj", t->hidden, t->bias, out);
}

vp_status vp__tb_mla(vp__tb *c, uint32_t x, uint64_t S, uint32_t *out)
{
    const vp_tf *t = c->t;
    const vp_tf_mla *m = &t->x.mla;
    uint64_t qk = m->qk_nope + m->qk_rope;
    uint32_t qb, qr, q, kva, lat, kr, kvb, k, v, a;
    if (t->megatron)
        return meg_mla(c, x, S, out);
    VP_TRY(mla_q(c, x, &qb, &qr));
    VP_TRY(vp__tb_linear(c, x, "attn.kv_a_proj_with_mqa",
                         m->kv_lora + m->qk_rope, t->qkv_bias, &kva));
    VP_TRY(part(c, kva, "attn.k_pass", m->kv_lora, &lat));
    VP_TRY(part(c, kva, "attn.k_rot", m->qk_rope, &kr));
    VP_TRY(vp__tb_norm(c, lat, "attn.kv_a_layernorm", true, &lat));
    VP_TRY(vp__tb_unary(c, VP_OP_ROPE, kr, "attn.rope_k", &kr));
    /* the DynamicCache keeps copies of the latent and the rotary key,
     * which the attention then reads */
    VP_TRY(vp__tb_unary(c, VP_OP_SCALE, lat, "attn.cache_latent", &lat));
    c->g->ops[lat].flags |= VP_OPF_KV_COPY;
    VP_TRY(vp__tb_unary(c, VP_OP_SCALE, kr, "attn.cache_k_rot", &kr));
    c->g->ops[kr].flags |= VP_OPF_KV_COPY;
    VP_TRY(mla_cat(c, VP_OP_MLA_Q, qb, qr, qk, "attn.q_states", &q));
    VP_TRY(vp__tb_linear(c, lat, "attn.kv_b_proj",
                         t->heads * (m->qk_nope + m->v_dim), false, &kvb));
    VP_TRY(mla_cat(c, VP_OP_MLA_K, kvb, kr, qk, "attn.k_states", &k));
    VP_TRY(part(c, kvb, "attn.v", t->heads * m->v_dim, &v));
    VP_TRY(core(c, x, S, q, k, v, &a));
    return vp__tb_linear(c, a, "attn.o_proj", t->hidden, t->bias, out);
}
