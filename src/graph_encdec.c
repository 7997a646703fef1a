/* Expansion of an encoder-decoder transformer (VP_TF_ENCDEC: Hugging Face
 * T5 and mT5, transformers 5.x modeling_t5.py / modeling_mt5.py) into
 * primitive ops, in the order T5ForConditionalGeneration.forward runs
 * them: the encoder T5Stack (embed_tokens, dropout, T5Blocks of
 * T5LayerSelfAttention and T5LayerFF, final_layer_norm, dropout), the
 * decoder T5Stack on the labels shifted right (_shift_right), whose blocks
 * add T5LayerCrossAttention over the encoder's output, then the LM head
 * (the decoder's output scaled by d_model^-0.5 when tied) and
 * CrossEntropyLoss on the labels as they are. The first layer of each
 * stack computes the relative position bias (T5Attention.compute_bias)
 * that every layer of the stack adds to its scores; the decoder's first
 * cross-attention makes the zero bias the others share. Python variable
 * lifetimes (hold_until) follow the traces groundtruth/traces/t5-base-*
 * and mt5-small-* (docs/SIMULATION_NOTES.md §13). */
#include <stdio.h>
#include <string.h>

#include "graph_tf.h"

typedef struct {
    vp__tb c;
    uint32_t shared;   /* the shared embedding's parameter               */
    uint32_t enc_out;  /* the encoder's output (decoder: cross-attention) */
    uint32_t bias;     /* the stack's position bias (NONE before layer 0) */
    uint32_t xbias;    /* the decoder's cross-attention zero bias          */
} ed;

#define NO_OP UINT32_MAX

static void op_init(vp_op *o, vp_op_kind k)
{
    memset(o, 0, sizeof *o);
    o->kind = k;
    o->value = VP_VAL_FLOAT;
}

/* A Python variable keeps op i's output until op `until` has run. */
static void hold(ed *e, uint32_t i, uint32_t until)
{
    if (until > i && until > e->c.g->ops[i].hold_until)
        e->c.g->ops[i].hold_until = until;
}

static vp_status norm(ed *e, uint32_t x, const char *leaf, uint32_t *out)
{
    VP_TRY(vp__tb_norm(&e->c, x, leaf, false, out));
    if (e->c.t->norm == VP_NORM_RMSNORM)
        e->c.g->ops[*out].flags |= VP_OPF_T5_NORM | VP_OPF_PY_RMSNORM;
    return VP_OK;
}

/* T5Attention.compute_bias: the relative positions' buckets looked up in
 * relative_attention_bias ([buckets, heads]) and permuted to [1, heads,
 * q, k]; or (learned false) the decoder cross-attention's zeros of that
 * shape in the scores' dtype. */
static vp_status position_bias(ed *e, bool learned, bool causal, uint64_t q,
                               uint64_t k, uint32_t *out)
{
    const vp_tf *t = e->c.t;
    vp_op o;
    op_init(&o, VP_OP_POSITION_BIAS);
    o.ndim = 4;
    o.shape[0] = 1;
    o.shape[1] = t->heads;
    o.shape[2] = q;
    o.shape[3] = k;
    o.heads = t->heads;
    o.q_len = q;
    o.kv_len = k;
    o.causal = causal;
    o.classes = learned ? t->rel_buckets : 0;
    o.rows = learned ? t->rel_max_distance : 0;
    if (learned) {
        uint64_t n;
        if (!vp_mul_u64(t->rel_buckets, t->heads, &n))
            return vp_error_at(e->c.err, VP_EOVERFLOW, e->c.path, t->line,
                               t->col, 1, "the position bias overflows");
        VP_TRY(vp__tb_weight(&e->c, &o, "relative_attention_bias", n, true));
    }
    return vp__tb_push(&e->c, &o, learned ? "relative_attention_bias"
                                          : "cross_bias", out);
}

/* The core between q (rows of length q_len) and k, v (kv_len), with the
 * additive bias `bias`. The decoder's copy k and v into the cache
 * (use_cache; off under checkpointing); the encoder's do not:
 * T5ForConditionalGeneration.__init__ builds the encoder's T5Stack with
 * encoder_config.use_cache = False. */
static vp_status core(ed *e, uint32_t q, uint32_t k, uint32_t v,
                      uint32_t bias, bool causal, uint64_t kv_len,
                      const char *leaf, uint32_t *out)
{
    const vp_tf *t = e->c.t;
    const vp_op *qo = &e->c.g->ops[q];
    vp_op o;
    op_init(&o, VP_OP_ATTENTION);
    o.n_inputs = 4;
    o.inputs[0] = q;
    o.inputs[1] = k;
    o.inputs[2] = v;
    o.inputs[3] = bias;
    o.ndim = 3;
    o.shape[0] = qo->shape[0];
    o.shape[1] = qo->shape[1];
    o.shape[2] = t->heads * t->head_dim;
    o.heads = t->heads;
    o.kv_heads = t->heads;
    o.head_dim = t->head_dim;
    o.q_len = qo->shape[1];
    o.kv_len = kv_len;
    o.causal = causal;
    o.attn_impl = t->attn;
    o.dropout = t->p_attn;
    o.flags = e->enc_out != NO_OP ? VP_OPF_KV_COPY : 0;
    return vp__tb_push(&e->c, &o, leaf, out);
}

/* T5Attention: q from x, k and v from x or (cross) the encoder's output;
 * the bias (the first layer makes it); o. q, k, v are locals of the
 * attention's forward until it returns. */
static vp_status attention(ed *e, uint32_t x, bool cross, bool first,
                           const char *pre, uint32_t *out)
{
    const vp_tf *t = e->c.t;
    uint64_t inner = t->heads * t->head_dim;
    uint32_t kv = cross ? e->enc_out : x;
    char n[4][48];
    static const char *const leaf[] = {"q", "k", "v", "o"};
    for (int i = 0; i < 4; i++)
        snprintf(n[i], sizeof n[i], "%s.%s", pre, leaf[i]);
    uint32_t q, k, v, a;
    VP_TRY(vp__tb_linear(&e->c, x, n[0], inner, false, &q));
    VP_TRY(vp__tb_linear(&e->c, kv, n[1], inner, false, &k));
    VP_TRY(vp__tb_linear(&e->c, kv, n[2], inner, false, &v));
    bool dec = e->enc_out != NO_OP;
    uint64_t Lq = e->c.g->ops[x].shape[1], Lk = e->c.g->ops[kv].shape[1];
    uint32_t *bias = cross ? &e->xbias : &e->bias;
    if (first) {
        bool learned = !cross && t->rel_buckets;
        VP_TRY(position_bias(e, learned, dec && !cross, Lq, Lk, bias));
    }
    snprintf(n[3], sizeof n[3], "%s.core", pre);
    VP_TRY(core(e, q, k, v, *bias, dec && !cross, Lk, n[3], &a));
    snprintf(n[3], sizeof n[3], "%s.o", pre);
    VP_TRY(vp__tb_linear(&e->c, a, n[3], t->hidden, false, out));
    hold(e, q, *out);
    hold(e, k, *out);
    hold(e, v, *out);
    return VP_OK;
}

/* T5DenseActDense (act(wi x)) or T5DenseGatedActDense (act(wi_0 x) *
 * wi_1 x); dropout; the hidden state cast to wo's dtype; wo. */
static vp_status feed_forward(ed *e, uint32_t x, uint32_t *out)
{
    const vp_tf *t = e->c.t;
    vp_op_kind act = t->act == VP_ACT_RELU        ? VP_OP_RELU
                     : t->act == VP_ACT_GELU_TANH ? VP_OP_GELU_TANH
                     : t->act == VP_ACT_SILU      ? VP_OP_SILU
                                                  : VP_OP_GELU;
    uint32_t h, g;
    if (t->gated_ffn) {
        VP_TRY(vp__tb_linear(&e->c, x, "ff.wi_0", t->ffn, t->bias, &h));
        VP_TRY(vp__tb_unary(&e->c, act, h, "ff.act", &h));
        VP_TRY(vp__tb_linear(&e->c, x, "ff.wi_1", t->ffn, t->bias, &g));
        VP_TRY(vp__tb_binary(&e->c, VP_OP_MUL, h, g, "ff.gate", &h));
    } else {
        VP_TRY(vp__tb_linear(&e->c, x, "ff.wi", t->ffn, t->bias, &h));
        VP_TRY(vp__tb_unary(&e->c, act, h, "ff.act", &h));
    }
    VP_TRY(vp__tb_dropout(&e->c, h, "ff.dropout", t->p_resid, &h));
    if (t->t5_ff_cast)
        VP_TRY(vp__tb_unary(&e->c, VP_OP_CAST, h, "ff.cast", &h));
    return vp__tb_linear(&e->c, h, "ff.wo", t->hidden, t->bias, out);
}

/* x + dropout(sub(norm(x))): T5LayerSelfAttention, T5LayerCrossAttention
 * (sub 1, 2) and T5LayerFF (0); the normed states are the sub-layer's
 * argument until the residual add. */
static vp_status sublayer(ed *e, uint32_t x, int sub, bool first,
                          const char *pre, uint32_t *out)
{
    char nn[48], dn[48], an[48];
    snprintf(nn, sizeof nn, "%s.norm", pre);
    snprintf(dn, sizeof dn, "%s.dropout", pre);
    snprintf(an, sizeof an, "%s.residual", pre);
    uint32_t h, y;
    VP_TRY(norm(e, x, nn, &h));
    if (sub)
        VP_TRY(attention(e, h, sub == 2, first, pre, &y));
    else
        VP_TRY(feed_forward(e, h, &y));
    VP_TRY(vp__tb_dropout(&e->c, y, dn, e->c.t->p_resid, &y));
    VP_TRY(vp__tb_binary(&e->c, VP_OP_ADD, x, y, an, out));
    hold(e, h, *out);
    return VP_OK;
}

/* A T5Stack on token ids `ids`: embed_tokens (the shared weight, built
 * with its own and tied later), dropout, the blocks (checkpoint units),
 * final_layer_norm, dropout. The embedding's output and the position bias
 * are locals of the stack's forward until it returns. */
static vp_status stack(ed *e, uint32_t ids, bool dec, uint32_t *out)
{
    vp_graph *g = e->c.g;
    const vp_tf *t = e->c.t;
    const char *sn = dec ? "decoder" : "encoder";
    uint64_t layers = dec ? t->dec_layers : t->layers;
    snprintf(e->c.scope, sizeof e->c.scope, "%s", sn);
    vp_op o;
    op_init(&o, VP_OP_EMBEDDING);
    o.n_inputs = 1;
    o.inputs[0] = ids;
    o.ndim = 3;
    o.shape[0] = g->ops[ids].shape[0];
    o.shape[1] = g->ops[ids].shape[1];
    o.shape[2] = t->hidden;
    o.classes = t->vocab;
    o.flags = VP_OPF_TIED_LATE;
    if (e->shared == NO_OP) {
        VP_TRY(vp__tb_weight(&e->c, &o, "embed_tokens", t->vocab * t->hidden,
                            true));
        e->shared = o.params[0];
    } else {
        o.params[o.n_params++] = e->shared;
    }
    uint32_t emb, x;
    VP_TRY(vp__tb_push(&e->c, &o, "embed_tokens", &emb));
    VP_TRY(vp__tb_dropout(&e->c, emb, "dropout", t->p_embd, &x));
    e->bias = e->xbias = NO_OP;
    for (uint64_t l = 0; l < layers; l++) {
        snprintf(e->c.scope, sizeof e->c.scope, "%s.block.%llu", sn,
                 (unsigned long long)l);
        uint32_t first = (uint32_t)g->n_ops;
        VP_TRY(sublayer(e, x, 1, l == 0, "self_attn", &x));
        if (dec)
            VP_TRY(sublayer(e, x, 2, l == 0, "cross_attn", &x));
        VP_TRY(sublayer(e, x, 0, false, "ff", &x));
        VP_TRY(vp__graph_add_segment(g, e->c.scope, first,
                                     (uint32_t)g->n_ops - 1, true, e->c.err));
    }
    snprintf(e->c.scope, sizeof e->c.scope, "%s", sn);
    VP_TRY(norm(e, x, "final_layer_norm", &x));
    VP_TRY(vp__tb_dropout(&e->c, x, "final_dropout", t->p_resid, out));
    hold(e, emb, *out);
    if (e->bias != NO_OP)
        hold(e, e->bias, *out);
    if (e->xbias != NO_OP)
        hold(e, e->xbias, *out);
    /* the stack's output lives in the model's output until the forward
     * returns */
    g->ops[*out].flags |= VP_OPF_HOLD_OUT;
    return VP_OK;
}

/* The LM head (tied: the shared weight, the decoder's output scaled
 * first) and CrossEntropyLoss(ignore_index=-100) on the logits as they
 * are, against the labels (the targets made with the batch). */
static vp_status lm_head(ed *e, uint32_t x)
{
    vp_graph *g = e->c.g;
    const vp_tf *t = e->c.t;
    e->c.scope[0] = '\0';
    if (t->scale_out)
        VP_TRY(vp__tb_unary(&e->c, VP_OP_SCALE, x, "scale", &x));
    uint32_t logits, l;
    VP_TRY(vp__tb_linear_tied(&e->c, x, "lm_head", t->vocab, false,
                         t->tied ? (int64_t)e->shared : -1, &logits));
    if (t->tied)
        g->ops[logits].flags |= VP_OPF_TIED_LATE;
    vp_op o;
    op_init(&o, VP_OP_CROSS_ENTROPY);
    o.n_inputs = 1;
    o.inputs[0] = logits;
    o.rows = g->ops[logits].numel / t->vocab;
    o.classes = t->vocab;
    return vp__tb_push(&e->c, &o, "loss", &l);
}

/* Every activation is batch x length x max(width) elements and every score
 * matrix batch x heads x length^2: check they fit 64 bits (with room for
 * 8-byte elements). */
static vp_status check_sizes(const ed *e, uint64_t B, uint64_t S, uint64_t T)
{
    const vp_tf *t = e->c.t;
    uint64_t L = S > T ? S : T, w = t->hidden, tmp, sc;
    uint64_t cands[] = {t->ffn, t->vocab, t->heads * t->head_dim};
    for (size_t i = 0; i < 3; i++)
        if (cands[i] > w)
            w = cands[i];
    if (!vp_mul_u64(t->heads, t->head_dim, &tmp) ||
        !vp_mul_u64(t->rel_buckets, t->heads, &tmp) ||
        !vp_mul_u64(t->vocab, t->hidden, &tmp) || !vp_mul_u64(B, L, &tmp) ||
        !vp_mul_u64(tmp, w, &tmp) || !vp_mul_u64(tmp, 8, &tmp) ||
        !vp_mul_u64(B, t->heads, &sc) || !vp_mul_u64(sc, L, &sc) ||
        !vp_mul_u64(sc, L, &sc) || !vp_mul_u64(sc, 8, &sc))
        return vp_error_at(e->c.err, VP_EOVERFLOW, e->c.path, t->line,
                           t->col, 1,
                           "batch %llu x lengths %llu, %llu make tensors "
                           "larger than 2^64 bytes",
                           (unsigned long long)B, (unsigned long long)S,
                           (unsigned long long)T);
    return VP_OK;
}

vp_status vp__build_encdec(vp_graph *g, const vp_tf *t, const char *path,
                           vp_error *err)
{
    ed e;
    memset(&e, 0, sizeof e);
    e.c = (vp__tb){g, t, err, "", path, 0, false, 0, 0, false};
    e.shared = e.enc_out = e.bias = e.xbias = NO_OP;
    uint64_t B = g->batch, S = g->seq, T = g->target;
    VP_TRY(check_sizes(&e, B, S, T));
    vp_op o;
    uint32_t ids, dids, dec;
    op_init(&o, VP_OP_INPUT);
    o.value = VP_VAL_INDEX;
    o.ndim = 2;
    o.shape[0] = B;
    o.shape[1] = S;
    VP_TRY(vp__tb_push(&e.c, &o, "input_ids", &ids));
    /* _shift_right(labels): the decoder's ids, made with the batch here */
    o.shape[1] = T;
    o.name = NULL; /* named by the push */
    VP_TRY(vp__tb_push(&e.c, &o, "decoder_input_ids", &dids));
    VP_TRY(stack(&e, ids, false, &e.enc_out));
    VP_TRY(stack(&e, dids, true, &dec));
    if (t->head == VP_HEAD_NONE)
        return VP_OK;
    return lm_head(&e, dec);
}
