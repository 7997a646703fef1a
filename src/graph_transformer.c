/* Expansion of the transformer form (and of Hugging Face configs) into
 * primitive ops, following the execution order of the Hugging Face
 * implementations (GPT-2, Llama/Mistral/Qwen2/Mixtral, BERT; Qwen3, Gemma
 * 1-3, Phi-3; the MoE layers and latent attention are built in
 * graph_moe.c and graph_mla.c). */
#include <stdio.h>
#include <string.h>

#include "graph_tf.h"

typedef vp__tb tb;

static void op_init(vp_op *o, vp_op_kind k)
{
    memset(o, 0, sizeof *o);
    o->kind = k;
    o->value = VP_VAL_FLOAT;
}

static void set_shape(vp_op *o, uint32_t nd, uint64_t a, uint64_t b,
                      uint64_t c, uint64_t d)
{
    o->ndim = nd;
    o->shape[0] = a;
    o->shape[1] = b;
    o->shape[2] = c;
    o->shape[3] = d;
}

/* The sequence-parallel degree (1: none). */
static uint64_t sp_of(const vp_tf *t) { return t->sp > 1 ? t->sp : 1; }

static void same_shape(const tb *c, vp_op *o, uint32_t in)
{
    const vp_op *s = &c->g->ops[in];
    o->ndim = s->ndim;
    memcpy(o->shape, s->shape, sizeof o->shape);
}

static vp_status add_param(tb *c, vp_op *o, const char *leaf, uint64_t numel,
                           bool trainable)
{
    char name[192];
    snprintf(name, sizeof name, "%s.%s", o->name, leaf);
    uint32_t idx;
    VP_TRY(vp__graph_add_param(c->g, name, numel, (uint32_t)c->g->n_ops,
                               trainable, &idx, c->err));
    o->params[o->n_params++] = idx;
    return VP_OK;
}

static vp_status push(tb *c, vp_op *o, const char *leaf, uint32_t *idx)
{
    /* o->name already set by named() when params were added */
    if (!o->name) {
        o->name = c->scope[0]
                      ? vp__arena_printf(&c->g->arena, "%s.%s", c->scope, leaf)
                      : vp__arena_strdup(&c->g->arena, leaf);
        if (!o->name)
            return vp_error_set(c->err, VP_ENOMEM, "out of memory");
    }
    vp_status st = vp__graph_add_op(c->g, o, idx, c->err);
    if (st == VP_EOVERFLOW)
        return vp_error_at(c->err, VP_EOVERFLOW, c->path, c->t->line,
                           c->t->col, 1,
                           "the output of %s has more than 2^64 elements",
                           o->name);
    if (st == VP_ELIMIT) /* the layers times the experts */
        return vp_error_at(c->err, VP_ELIMIT, c->path, c->t->line,
                           c->t->col, 1,
                           "the model expands to more than %u ops (%s)",
                           VP_MAX_OPS, o->name);
    return st;
}

static vp_status named(tb *c, vp_op *o, const char *leaf)
{
    o->name = c->scope[0]
                  ? vp__arena_printf(&c->g->arena, "%s.%s", c->scope, leaf)
                  : vp__arena_strdup(&c->g->arena, leaf);
    return o->name ? VP_OK : vp_error_set(c->err, VP_ENOMEM, "out of memory");
}

/* Sequence parallelism (tf.sp > 1, megatron/core/tensor_parallel/
 * layers.py): a linear on the residual stream's S/sp tokens is column-
 * parallel, its input gathered to the whole sequence; one from the whole
 * sequence back to the hidden width is row-parallel, its output
 * reduce-scattered to S/sp tokens (mappings.py, reduce_scatter_to_
 * sequence_parallel_region). Shapes [B, S, features]. */
static void sp_linear(const tb *c, vp_op *o)
{
    uint32_t sp = c->t->sp;
    uint64_t S = c->g->seq;
    if (sp <= 1 || o->ndim != 3 || c->local || c->duplicated)
        return;
    if (o->shape[1] == S / sp) {
        o->shape[1] = S;
        o->flags |= VP_OPF_SP_GATHER;
    } else if (o->shape[1] == S && o->out_features == c->t->hidden) {
        o->shape[1] = S / sp;
        o->flags |= VP_OPF_SP_SCATTER;
    }
}

/* PyTorch's tensor parallelism (vp_tf.dtensor; torchtitan's
 * parallelize.py apply_tp, torch/distributed/tensor/parallel/style.py):
 * an op that redistributes in's sequence dim to rows_s tokens
 * (ops/redistribute.c), named leaf. */
static vp_status redistribute_dim(tb *c, uint32_t in, uint32_t dim,
                                  uint64_t size, uint32_t flags,
                                  const char *leaf, uint32_t *idx)
{
    vp_op o;
    op_init(&o, VP_OP_REDISTRIBUTE);
    o.n_inputs = 1;
    o.inputs[0] = in;
    same_shape(c, &o, in);
    o.shape[dim] = size;
    o.flags |= flags;
    return push(c, &o, leaf, idx);
}

static vp_status redistribute(tb *c, uint32_t in, uint64_t rows_s,
                              const char *leaf, uint32_t *idx)
{
    return redistribute_dim(c, in, 1, rows_s, 0, leaf, idx);
}

/* A column-parallel linear's input on S/sp tokens: PrepareModuleInput
 * (input_layouts Shard(1), desired_input_layouts Replicate()) all-gathers
 * it once for the module, and its linears (q, k and v; w1 and w3) take
 * and save the one gathered tensor. *in becomes the gathered op. */
static vp_status dtensor_gather(tb *c, uint32_t *in)
{
    const vp_op *x = &c->g->ops[*in];
    uint64_t S = c->g->seq;
    if (!c->t->dtensor || sp_of(c->t) <= 1 || c->local || x->ndim != 3 ||
        x->shape[1] != S / sp_of(c->t))
        return VP_OK;
    if (!c->gdst || c->gsrc != *in) {
        c->gsrc = *in;
        VP_TRY(redistribute(c, *in, S, "all_gather", &c->gdst));
    }
    *in = c->gdst;
    return VP_OK;
}

/* A row-parallel linear (RowwiseParallel, output_layouts Shard(1)): one
 * back to the hidden width from a local whole-sequence activation (not a
 * gathered input: those are column-parallel), its output reduce-
 * scattered to S/sp tokens; *idx becomes the scattered op. */
static vp_status dtensor_scatter(tb *c, uint32_t *idx)
{
    const vp_op *y = &c->g->ops[*idx];
    uint64_t S = c->g->seq;
    if (!c->t->dtensor || sp_of(c->t) <= 1 || c->local || y->ndim != 3 ||
        y->shape[1] != S || y->out_features != c->t->hidden ||
        c->g->ops[y->inputs[0]].kind == VP_OP_REDISTRIBUTE)
        return VP_OK;
    return redistribute(c, *idx, S / sp_of(c->t), "reduce_scatter", idx);
}

/* The placements apply_tp gives linear op lin's parameters
 * (style.py): ColwiseParallel, on a gathered input, Shard(0) weight and
 * bias; RowwiseParallel, its output reduce-scattered, Shard(1) weight
 * (a bias is replicated). */
static void tp_placement(tb *c, uint32_t lin, bool rowwise)
{
    const vp_op *o = &c->g->ops[lin];
    if (!c->t->dtensor || sp_of(c->t) <= 1 || c->local)
        return;
    bool colwise = c->g->ops[o->inputs[0]].kind == VP_OP_REDISTRIBUTE;
    for (uint32_t k = 0; k < o->n_params && (colwise || rowwise); k++)
        c->g->params[o->params[k]].tp_dim = colwise ? 1 : k == 0 ? 2 : 0;
}

static vp_status linear(tb *c, uint32_t in, const char *leaf, uint64_t out_f,
                        bool bias, int64_t tied_weight, uint32_t *idx)
{
    VP_TRY(dtensor_gather(c, &in));
    vp_op o;
    op_init(&o, VP_OP_LINEAR);
    o.n_inputs = 1;
    o.inputs[0] = in;
    same_shape(c, &o, in);
    o.in_features = o.shape[o.ndim - 1];
    o.out_features = out_f;
    o.shape[o.ndim - 1] = out_f;
    if (!c->t->dtensor)
        sp_linear(c, &o);
    if (c->t->megatron && c->t->fp8 && c->scope[0] && !c->local)
        o.flags |= VP_OPF_FP8;
    VP_TRY(named(c, &o, leaf));
    uint64_t wn;
    if (!vp_mul_u64(o.in_features, out_f, &wn))
        return vp_error_at(c->err, VP_EOVERFLOW, c->path, c->t->line, c->t->col, 1,
                            "weight of %s overflows 64 bits", o.name);
    if (tied_weight >= 0)
        o.params[o.n_params++] = (uint32_t)tied_weight;
    else
        VP_TRY(add_param(c, &o, "weight", wn, true));
    if (bias)
        VP_TRY(add_param(c, &o, "bias", out_f, true));
    VP_TRY(push(c, &o, leaf, idx));
    uint32_t lin = *idx;
    VP_TRY(dtensor_scatter(c, idx));
    tp_placement(c, lin, *idx != lin);
    return VP_OK;
}

static vp_status norm(tb *c, uint32_t in, const char *leaf, uint32_t *idx)
{
    vp_op o;
    op_init(&o, c->t->norm == VP_NORM_RMSNORM ? VP_OP_RMSNORM
                                              : VP_OP_LAYERNORM);
    if (c->t->x.norm_offset)
        o.flags |= VP_OPF_NORM_OFFSET;
    if (c->t->megatron)
        o.flags |= VP_OPF_MEGATRON;
    o.n_inputs = 1;
    o.inputs[0] = in;
    same_shape(c, &o, in);
    uint64_t d = o.shape[o.ndim - 1];
    o.rows = 1;
    for (uint32_t i = 0; i + 1 < o.ndim; i++)
        o.rows *= o.shape[i]; /* bounded: numel already checked */
    VP_TRY(named(c, &o, leaf));
    VP_TRY(add_param(c, &o, "weight", d, true));
    if (c->t->norm_bias)
        VP_TRY(add_param(c, &o, "bias", d, true));
    return push(c, &o, leaf, idx);
}

static vp_status unary(tb *c, vp_op_kind k, uint32_t in, const char *leaf,
                       uint32_t *idx)
{
    vp_op o;
    op_init(&o, k);
    o.n_inputs = 1;
    o.inputs[0] = in;
    same_shape(c, &o, in);
    return push(c, &o, leaf, idx);
}

static vp_status dropout(tb *c, uint32_t in, const char *leaf, double p,
                         uint32_t *idx)
{
    if (p <= 0.0) {
        *idx = in;
        return VP_OK;
    }
    vp_op o;
    op_init(&o, VP_OP_DROPOUT);
    o.n_inputs = 1;
    o.inputs[0] = in;
    o.dropout = p;
    same_shape(c, &o, in);
    return push(c, &o, leaf, idx);
}

static vp_status binary(tb *c, vp_op_kind k, uint32_t a, uint32_t b,
                        const char *leaf, uint32_t *idx)
{
    vp_op o;
    op_init(&o, k);
    o.n_inputs = 2;
    o.inputs[0] = a;
    o.inputs[1] = b;
    /* broadcast: the larger operand gives the shape */
    same_shape(c, &o, c->g->ops[a].numel >= c->g->ops[b].numel ? a : b);
    return push(c, &o, leaf, idx);
}

static vp_status embedding(tb *c, uint32_t in, const char *leaf,
                           uint64_t vocab, uint64_t rows_b, uint64_t rows_s,
                           uint32_t *idx)
{
    vp_op o;
    op_init(&o, VP_OP_EMBEDDING);
    o.n_inputs = 1;
    o.inputs[0] = in;
    set_shape(&o, 3, rows_b, rows_s, c->t->hidden, 0);
    o.classes = vocab;
    VP_TRY(named(c, &o, leaf));
    uint64_t wn;
    if (!vp_mul_u64(vocab, c->t->hidden, &wn))
        return vp_error_at(c->err, VP_EOVERFLOW, c->path, c->t->line, c->t->col, 1,
                            "embedding %s overflows 64 bits", o.name);
    VP_TRY(add_param(c, &o, "weight", wn, true));
    return push(c, &o, leaf, idx);
}

/* A view of part of in's last dim (a slice, a chunk): out_f wide. Its
 * gradient is a zero-filled tensor like in's with the slice copied in. */
static vp_status slice(tb *c, uint32_t in, const char *leaf, uint64_t out_f,
                       uint32_t *idx)
{
    vp_op o;
    op_init(&o, VP_OP_SELECT);
    o.n_inputs = 1;
    o.inputs[0] = in;
    same_shape(c, &o, in);
    o.shape[o.ndim - 1] = out_f;
    return push(c, &o, leaf, idx);
}

/* Phi-3's MLP: gate_up_proj, chunk, up * act(gate), down_proj
 * (modeling_phi3.py, Phi3MLP). */
static vp_status mlp_fused(tb *c, uint32_t x, uint64_t f, const char *pre,
                           uint32_t *out)
{
    const vp_tf *t = c->t;
    char n1[64], n2[64], n3[64], n4[64], n5[64], n6[64];
    snprintf(n1, sizeof n1, "%sgate_up_proj", pre);
    snprintf(n2, sizeof n2, "%sgate", pre);
    snprintf(n3, sizeof n3, "%sup", pre);
    snprintf(n4, sizeof n4, "%sact", pre);
    snprintf(n5, sizeof n5, "%smul", pre);
    snprintf(n6, sizeof n6, "%sdown_proj", pre);
    uint64_t f2;
    uint32_t gu, gate, up, a, h;
    if (!vp_mul_u64(f, 2, &f2))
        return vp__tb_overflow(c, "the gate_up projection");
    VP_TRY(linear(c, x, n1, f2, t->bias, -1, &gu));
    VP_TRY(slice(c, gu, n2, f, &gate));
    VP_TRY(slice(c, gu, n3, f, &up));
    VP_TRY(unary(c, t->act == VP_ACT_SWIGLU ? VP_OP_SILU : VP_OP_GELU, gate,
                 n4, &a));
    VP_TRY(binary(c, VP_OP_MUL, up, a, n5, &h));
    return linear(c, h, n6, t->hidden, t->bias, -1, out);
}

/* Megatron's gated MLP (megatron/core/transformer/mlp.py, MLP.forward
 * with gated_linear_unit): linear_fc1 makes the gate and up halves in one
 * [.., 2f] output; the fused bias_swiglu_impl (fusions/fused_bias_swiglu.
 * py, SwiGLUFunction; bias_geglu_impl for GEGLU) saves that input alone
 * and returns act(gate) * up, [.., f]; linear_fc2 saves its input. */
static vp_status mlp_megatron(tb *c, uint32_t x, uint64_t f, const char *pre,
                              uint32_t *out)
{
    const vp_tf *t = c->t;
    char n1[64], n2[64], n3[64];
    snprintf(n1, sizeof n1, "%slinear_fc1", pre);
    snprintf(n2, sizeof n2, "%sact", pre);
    snprintf(n3, sizeof n3, "%slinear_fc2", pre);
    uint64_t f2;
    uint32_t fc1, h;
    if (!vp_mul_u64(f, 2, &f2))
        return vp__tb_overflow(c, "linear_fc1");
    VP_TRY(linear(c, x, n1, f2, t->bias, -1, &fc1));
    vp_op o;
    op_init(&o, t->act == VP_ACT_SWIGLU ? VP_OP_SILU : VP_OP_GELU);
    o.n_inputs = 1;
    o.inputs[0] = fc1;
    same_shape(c, &o, fc1);
    o.shape[o.ndim - 1] = f;
    VP_TRY(push(c, &o, n2, &h));
    return linear(c, h, n3, t->hidden, t->bias, -1, out);
}

/* The MLP (or gated MLP) of inner size f on input x. */
static vp_status mlp(tb *c, uint32_t x, uint64_t f, const char *pre,
                     uint32_t *out)
{
    const vp_tf *t = c->t;
    char n1[64], n2[64], n3[64], n4[64], n5[64];
    snprintf(n1, sizeof n1, "%sgate_proj", pre);
    snprintf(n2, sizeof n2, "%sup_proj", pre);
    snprintf(n3, sizeof n3, "%sact", pre);
    snprintf(n4, sizeof n4, "%smul", pre);
    snprintf(n5, sizeof n5, "%sdown_proj", pre);
    uint32_t a, b, h;
    bool gated = t->act == VP_ACT_SWIGLU || t->act == VP_ACT_GEGLU;
    if (t->megatron && gated)
        return mlp_megatron(c, x, f, pre, out);
    if (t->x.fused_gate_up)
        return mlp_fused(c, x, f, pre, out);
    if (t->act == VP_ACT_SWIGLU || t->act == VP_ACT_GEGLU) {
        VP_TRY(linear(c, x, n1, f, t->bias, -1, &a));
        VP_TRY(unary(c, t->act == VP_ACT_SWIGLU ? VP_OP_SILU : VP_OP_GELU, a,
                     n3, &a));
        VP_TRY(linear(c, x, n2, f, t->bias, -1, &b));
        VP_TRY(binary(c, VP_OP_MUL, a, b, n4, &h));
    } else {
        snprintf(n1, sizeof n1, "%sfc", pre);
        VP_TRY(linear(c, x, n1, f, t->bias, -1, &a));
        /* Megatron's fused bias_gelu_impl (the tanh approximation)
         * saves its input as GELU does */
        vp_op_kind k = t->act == VP_ACT_RELU ? VP_OP_RELU
                       : t->act == VP_ACT_GELU_TANH && !t->megatron
                           ? VP_OP_GELU_TANH
                       : t->act == VP_ACT_SILU      ? VP_OP_SILU
                                                    : VP_OP_GELU;
        VP_TRY(unary(c, k, a, n3, &h));
        snprintf(n5, sizeof n5, "%sproj", pre);
    }
    return linear(c, h, n5, t->hidden, t->bias, -1, out);
}

/* RMSNorm over each head of a projection's output (Qwen3 q_norm, k_norm):
 * rows of head_dim, a head_dim weight. */
static vp_status head_norm(tb *c, uint32_t in, uint64_t heads,
                           const char *leaf, uint32_t *idx)
{
    const vp_tf *t = c->t;
    const vp_op *io = &c->g->ops[in];
    vp_op o;
    op_init(&o, VP_OP_RMSNORM);
    if (t->x.norm_offset)
        o.flags |= VP_OPF_NORM_OFFSET;
    o.n_inputs = 1;
    o.inputs[0] = in;
    set_shape(&o, 4, io->shape[0], io->shape[1], heads, t->head_dim);
    o.rows = io->shape[0] * io->shape[1] * heads; /* = numel / head_dim */
    VP_TRY(named(c, &o, leaf));
    VP_TRY(add_param(c, &o, "weight", t->head_dim, true));
    return push(c, &o, leaf, idx);
}

/* q, k and v: three projections (or Phi-3's one qkv_proj, sliced), the
 * per-head norms, the rotary embedding. */
static vp_status qkv(tb *c, uint32_t x, uint32_t *q, uint32_t *k,
                     uint32_t *v)
{
    const vp_tf *t = c->t;
    uint64_t qd = t->heads * t->head_dim, kvd = t->kv_heads * t->head_dim;
    if (t->x.packed_qkv) {
        uint32_t p;
        VP_TRY(linear(c, x, "attn.qkv_proj", qd + 2 * kvd, t->qkv_bias, -1,
                      &p));
        VP_TRY(slice(c, p, "attn.q", qd, q));
        VP_TRY(slice(c, p, "attn.k", kvd, k));
        VP_TRY(slice(c, p, "attn.v", kvd, v));
    } else {
        VP_TRY(linear(c, x, "attn.q_proj", qd, t->qkv_bias, -1, q));
        if (t->x.qk_norm)
            VP_TRY(head_norm(c, *q, t->heads, "attn.q_norm", q));
        VP_TRY(linear(c, x, "attn.k_proj", kvd, t->qkv_bias, -1, k));
        if (t->x.qk_norm)
            VP_TRY(head_norm(c, *k, t->kv_heads, "attn.k_norm", k));
        VP_TRY(linear(c, x, "attn.v_proj", kvd, t->qkv_bias, -1, v));
    }
    if (t->rotary) {
        VP_TRY(unary(c, VP_OP_ROPE, *q, "attn.rope_q", q));
        VP_TRY(unary(c, VP_OP_ROPE, *k, "attn.rope_k", k));
    }
    return VP_OK;
}

/* The Megatron flavour runs Transformer Engine's fused attention for
 * an SDPA model (the scores never materialised). */
static bool fused_attn(const vp_tf *t)
{
    return t->megatron && t->attn == VP_ATTN_SDPA;
}

static vp_status attention(tb *c, uint32_t x, uint64_t S, uint32_t *out)
{
    const vp_tf *t = c->t;
    if (t->x.mla.kv_lora)
        return vp__tb_mla(c, x, S, out);
    uint64_t qd = t->heads * t->head_dim, kvd = t->kv_heads * t->head_dim;
    vp_op o;
    op_init(&o, VP_OP_ATTENTION);
    /* Megatron's linear_qkv under Transformer Engine's attention: its
     * q, k, v views, all saved by the kernel, keep the bytes of three
     * projections (HF GPT-2's packed path is its own) */
    bool packed = t->fused_qkv && !(t->megatron && fused_attn(t));
    if (packed) {
        uint32_t qkv_out;
        VP_TRY(linear(c, x, "attn.qkv", qd + 2 * kvd, t->qkv_bias, -1,
                      &qkv_out));
        /* HF GPT-2: Conv1D = addmm(b, x, W); q, k, v are views of its
         * output, locals of the attention forward until it returns */
        c->g->ops[qkv_out].flags |= VP_OPF_ADDMM | VP_OPF_HOLD_MODULE;
        o.n_inputs = 1;
        o.inputs[0] = qkv_out;
    } else {
        uint32_t q, k, v;
        VP_TRY(qkv(c, x, &q, &k, &v));
        o.n_inputs = 3;
        o.inputs[0] = q;
        o.inputs[1] = k;
        o.inputs[2] = v;
    }
    const vp_op *xo = &c->g->ops[x];
    set_shape(&o, 3, xo->shape[0], S, qd, 0);
    o.heads = (uint32_t)t->heads;
    o.kv_heads = (uint32_t)t->kv_heads;
    o.head_dim = (uint32_t)t->head_dim;
    o.q_len = o.kv_len = S;
    o.causal = t->type == VP_TF_DECODER;
    o.attn_impl = t->attn;
    if (fused_attn(t))
        o.attn_impl = VP_ATTN_FLASH;
    o.cp = t->cp;
    o.dropout = t->p_attn;
    o.window = vp__tf_layer_window(t, c->layer);
    o.softcap = t->x.attn_softcap;
    /* HF's DynamicCache copies (not Megatron's: its fused attention
     * saves the projections' k and v; the eager scores path keeps the
     * copies, which stand for the contiguous k and v it saves) */
    if (t->type == VP_TF_DECODER && !fused_attn(t))
        o.flags |= VP_OPF_KV_COPY;
    if (!t->rotary) /* GPT-2 and BERT: softmax in the scores' dtype */
        o.flags |= VP_OPF_SOFTMAX_NATIVE;
    uint32_t a;
    VP_TRY(push(c, &o, "attn.core", &a));
    VP_TRY(linear(c, a, "attn.o_proj", t->hidden, t->bias, -1, out));
    if (packed)
        c->g->ops[*out].flags |= VP_OPF_ADDMM;
    return VP_OK;
}

/* Mark the ops of [first, end) that are HF Conv1D linears (GPT-2). */
static void mark_addmm(tb *c, uint32_t first)
{
    for (size_t i = first; i < c->g->n_ops; i++)
        if (c->g->ops[i].kind == VP_OP_LINEAR)
            c->g->ops[i].flags |= VP_OPF_ADDMM;
}

/* One layer, with the lifetimes that the Hugging Face forward's Python
 * variables give its tensors (read from the allocator traces, see
 * docs/SIMULATION_NOTES.md §3.2, §5.2): the layer's input is the caller's
 * loop variable (it lives until the layer returns); a sub-module's
 * argument lives until the sub-module returns. */
static vp_status layer(tb *c, uint32_t x, uint64_t S, uint32_t *out)
{
    const vp_tf *t = c->t;
    uint32_t h, a, r;
    c->g->ops[x].flags |= VP_OPF_HOLD_SEG;
    if (t->type == VP_TF_DECODER) { /* pre-norm */
        /* GPT-2 (fused Conv1D c_attn): `hidden_states = self.ln_1(...)`
         * lives until the residual add reassigns it; the attention and
         * MLP outputs are locals until the block returns. Llama and the
         * like: the norm output is the sub-module's argument. */
        bool gpt2 = t->fused_qkv;
        uint32_t hold = gpt2 ? VP_OPF_HOLD_ADD : VP_OPF_HOLD_MODULE;
        uint32_t branch = gpt2 ? VP_OPF_HOLD_LAYER : 0;
        VP_TRY(norm(c, x, "input_norm", &h));
        c->g->ops[h].flags |= hold;
        VP_TRY(attention(c, h, S, &a));
        /* the attention module returns here, before the layer's residual
         * dropout (Phi-3's resid_attn_dropout); GPT-2's resid_dropout is
         * inside GPT2Attention, which returns after it */
        if (!gpt2)
            c->g->ops[a].flags |= VP_OPF_MODULE_RET;
        /* Gemma 2, 3: post_attention_layernorm on the attention output,
         * pre_feedforward_layernorm, post_feedforward_layernorm */
        if (t->x.post_norms)
            VP_TRY(norm(c, a, "attn.post_norm", &a));
        VP_TRY(dropout(c, a, "attn.dropout", t->p_resid, &a));
        c->g->ops[a].flags |= VP_OPF_MODULE_RET | branch;
        VP_TRY(binary(c, VP_OP_ADD, x, a, "attn.residual", &r));
        VP_TRY(norm(c, r, "post_attention_norm", &h));
        c->g->ops[h].flags |= hold;
        uint32_t first = (uint32_t)c->g->n_ops;
        if (t->experts && vp__tf_layer_moe(t, c->layer))
            VP_TRY(vp__tb_moe(c, h, &a));
        else
            VP_TRY(mlp(c, h, t->ffn, "mlp.", &a));
        if (gpt2)
            mark_addmm(c, first);
        if (!gpt2) /* GPT2MLP's dropout is its own */
            c->g->ops[a].flags |= VP_OPF_MODULE_RET;
        if (t->x.post_norms)
            VP_TRY(norm(c, a, "mlp.post_norm", &a));
        VP_TRY(dropout(c, a, "mlp.dropout", t->p_resid, &a));
        c->g->ops[a].flags |= VP_OPF_MODULE_RET | branch;
        return binary(c, VP_OP_ADD, r, a, "mlp.residual", out);
    }
    /* post-norm encoder (BERT). BertSelfOutput / BertOutput:
     * `LayerNorm(dropout(dense(h)) + input_tensor)`: the dropout output
     * lives until the LayerNorm returns; the attention output is the
     * argument of the intermediate and output modules. */
    VP_TRY(attention(c, x, S, &a));
    VP_TRY(dropout(c, a, "attn.dropout", t->p_resid, &a));
    c->g->ops[a].flags |= VP_OPF_HOLD_MODULE;
    VP_TRY(binary(c, VP_OP_ADD, a, x, "attn.residual", &r));
    VP_TRY(norm(c, r, "attn.norm", &h));
    c->g->ops[h].flags |= VP_OPF_MODULE_RET | VP_OPF_HOLD_MODULE;
    VP_TRY(mlp(c, h, t->ffn, "mlp.", &a));
    VP_TRY(dropout(c, a, "mlp.dropout", t->p_resid, &a));
    c->g->ops[a].flags |= VP_OPF_HOLD_MODULE;
    VP_TRY(binary(c, VP_OP_ADD, a, h, "mlp.residual", &r));
    VP_TRY(norm(c, r, "mlp.norm", out));
    c->g->ops[*out].flags |= VP_OPF_MODULE_RET;
    return VP_OK;
}

static vp_status loss(tb *c, uint32_t logits, uint64_t rows, bool upcast,
                      uint32_t *out)
{
    vp_op o;
    op_init(&o, VP_OP_CROSS_ENTROPY);
    o.n_inputs = 1;
    o.inputs[0] = logits;
    set_shape(&o, 0, 0, 0, 0, 0);
    o.rows = rows;
    /* Megatron: vocab_parallel_cross_entropy on the data loader's
     * shifted labels */
    if (c->t->megatron)
        o.flags |= VP_OPF_MEGATRON;
    else if (c->t->head == VP_HEAD_CAUSAL_LM)
        o.flags |= VP_OPF_SHIFT_LABELS;
    const vp_op *lo = &c->g->ops[logits];
    o.classes = lo->shape[lo->ndim - 1];
    o.upcast_logits = upcast;
    return push(c, &o, "loss", out);
}

/* Every activation is B*S*max(width) elements, every score matrix
 * B*heads*S*S: check they fit 64 bits (with room for 8-byte elements). */
static vp_status check_sizes(const tb *c, uint64_t B, uint64_t S)
{
    const vp_tf *t = c->t;
    if (!t->rotary && S > t->max_positions)
        return vp_error_at(c->err, VP_ERANGE, c->path, t->line, t->col, 1,
                           "sequence length %llu is longer than the model's "
                           "%llu learned positions",
                           (unsigned long long)S,
                           (unsigned long long)t->max_positions);
    if (S % sp_of(t))
        return vp_error_at(c->err, VP_EARG, c->path, t->line, t->col, 1,
                           "sequence parallelism over %u ranks needs the "
                           "sequence length (%llu) divisible by them",
                           t->sp, (unsigned long long)S);
    uint64_t widest = t->hidden, tmp;
    uint64_t qkv = (t->heads + 2 * t->kv_heads) * t->head_dim;
    /* the experts' rows are tokens x top_k (top_k <= 4096 experts, the
     * widths <= VP_MAX_DIM: no overflow here); MLA's k, v per head */
    const vp_tf_mla *a = &t->x.mla;
    uint64_t ex = t->top_k * 2 * (t->expert_ffn > t->hidden ? t->expert_ffn
                                                            : t->hidden);
    uint64_t mla = t->heads * (a->qk_nope + (a->v_dim > a->qk_rope
                                                 ? a->v_dim
                                                 : a->qk_rope));
    uint64_t cands[] = {t->ffn, t->vocab, qkv, ex, 2 * t->x.shared_ffn,
                        mla, a->kv_lora + a->qk_rope, a->q_lora};
    for (size_t i = 0; i < sizeof cands / sizeof cands[0]; i++)
        if (cands[i] > widest)
            widest = cands[i];
    uint64_t scores;
    if (!vp_mul_u64(B, S, &tmp) || !vp_mul_u64(tmp, widest, &tmp) ||
        !vp_mul_u64(tmp, 8, &tmp) || !vp_mul_u64(B, S, &scores) ||
        !vp_mul_u64(scores, t->heads, &scores) ||
        !vp_mul_u64(scores, S, &scores) || !vp_mul_u64(scores, 8, &scores))
        return vp_error_at(c->err, VP_EOVERFLOW, c->path, t->line, t->col, 1,
                           "batch %llu x sequence %llu makes tensors larger "
                           "than 2^64 bytes",
                           (unsigned long long)B, (unsigned long long)S);
    return VP_OK;
}

/* The embeddings (HF GPT2Model / LlamaModel / BertEmbeddings): tokens,
 * token types, learned positions or the rotary buffer, the embedding norm
 * and dropout. *x the embeddings' output, *wte the token embedding's
 * weight (for a tied head). */
static vp_status embeddings(tb *c, uint64_t B, uint64_t S, uint32_t *x,
                            uint32_t *wte)
{
    vp_graph *g = c->g;
    const vp_tf *t = c->t;
    vp_op o;
    uint32_t ids, e;
    op_init(&o, VP_OP_INPUT);
    o.value = VP_VAL_INDEX;
    set_shape(&o, 2, B, S, 0, 0);
    VP_TRY(push(c, &o, "input_ids", &ids));
    /* sequence parallelism: the vocab-parallel embedding's output
     * reduce-scattered to S/sp tokens (VocabParallelEmbedding,
     * reduce_scatter_embeddings) */
    uint64_t Sl = S / sp_of(t);
    /* PyTorch's (vp_tf.dtensor): RowwiseParallel(input_layouts=
     * Replicate(), output_layouts=Shard(1)) on tok_embeddings, the whole
     * sequence's partial sums reduce-scattered */
    VP_TRY(embedding(c, ids, "embed_tokens", t->vocab, B,
                     t->dtensor ? S : Sl, x));
    *wte = g->ops[*x].params[0];
    if (t->dtensor && sp_of(t) > 1) {
        g->params[*wte].tp_dim = 1; /* RowwiseParallel's embedding */
        VP_TRY(redistribute(c, *x, Sl, "embed_tokens.reduce_scatter", x));
    }
    /* Gemma: the scaled embedding module returns embedding * sqrt(hidden)
     * (in the embedding's dtype), which HF keeps as inputs_embeds */
    if (t->x.embed_scale)
        VP_TRY(unary(c, VP_OP_SCALE, *x, "embed_scale", x));
    if (t->type == VP_TF_DECODER)
        g->ops[*x].flags |= VP_OPF_HOLD_FWD; /* HF keeps inputs_embeds */
    if (t->type == VP_TF_ENCODER) /* BertEmbeddings' locals */
        g->ops[*x].flags |= VP_OPF_HOLD_MODULE;
    if (t->type_vocab) {
        VP_TRY(embedding(c, ids, "token_type_embeddings", t->type_vocab, B,
                         Sl, &e));
        if (t->type == VP_TF_ENCODER)
            g->ops[e].flags |= VP_OPF_HOLD_MODULE;
        VP_TRY(binary(c, VP_OP_ADD, *x, e, "embed_add_types", x));
    }
    if (!t->rotary) {
        VP_TRY(embedding(c, ids, "embed_positions", t->max_positions, 1, Sl,
                         &e));
        if (t->type == VP_TF_DECODER)
            g->ops[e].flags |= VP_OPF_HOLD_FWD;
        else
            g->ops[e].flags |= VP_OPF_HOLD_MODULE;
        VP_TRY(binary(c, VP_OP_ADD, *x, e, "embed_add_positions", x));
    } else {
        uint32_t bidx;
        /* the rotary inv_freq buffer lives in the model (fp32) */
        VP_TRY(vp__graph_add_param(g, "rotary_emb.inv_freq", t->head_dim / 2,
                                   (uint32_t)g->n_ops, false, &bidx, c->err));
        g->params[bidx].fp32_buffer = true;
    }
    if (t->embedding_norm)
        VP_TRY(norm(c, *x, "embed_norm", x));
    if (t->type == VP_TF_ENCODER && t->type_vocab) {
        /* BertEmbeddings' int64 buffers position_ids and token_type_ids
         * (max_positions each), registered after its LayerNorm */
        static const char *const bufs[] = {"embed.position_ids",
                                           "embed.token_type_ids"};
        for (int k = 0; k < 2; k++) {
            uint32_t bidx;
            VP_TRY(vp__graph_add_param(g, bufs[k], t->max_positions,
                                       (uint32_t)g->n_ops, false, &bidx,
                                       c->err));
            g->params[bidx].elem_bytes_override = 8;
        }
    }
    VP_TRY(dropout(c, *x, "embed_dropout", t->p_embd, x));
    g->ops[*x].flags |= VP_OPF_MODULE_RET;
    if (t->type == VP_TF_ENCODER)
        g->ops[*x].flags |= VP_OPF_HOLD_FWD; /* BertModel's embedding_output */
    return VP_OK;
}

/* A pipeline stage's input (tf.stage_in): the hidden states the
 * previous stage sends, [B, S, hidden] in the activations' dtype. */
static vp_status stage_input(tb *c, uint64_t B, uint64_t S, uint32_t *x)
{
    vp_op o;
    op_init(&o, VP_OP_INPUT);
    o.value = VP_VAL_FLOAT;
    set_shape(&o, 3, B, S / sp_of(c->t), c->t->hidden, 0);
    return push(c, &o, "pipe_recv", x);
}

/* A sequence-classification head: BERT's pooler on the first token, or
 * the score of the last token (HF ...ForSequenceClassification). */
static vp_status classifier(tb *c, uint32_t x, uint64_t B, uint32_t *logits)
{
    const vp_tf *t = c->t;
    vp_op o;
    if (t->type == VP_TF_ENCODER) {
        op_init(&o, VP_OP_SELECT);
        o.n_inputs = 1;
        o.inputs[0] = x;
        set_shape(&o, 2, B, t->hidden, 0, 0);
        VP_TRY(push(c, &o, "pooler.select", &x));
        VP_TRY(linear(c, x, "pooler.dense", t->hidden, true, -1, &x));
        VP_TRY(unary(c, VP_OP_TANH, x, "pooler.act", &x));
        VP_TRY(dropout(c, x, "classifier_dropout", t->p_resid, &x));
        return linear(c, x, "classifier", t->num_labels, true, -1, logits);
    }
    VP_TRY(linear(c, x, "score", t->num_labels, false, -1, &x));
    op_init(&o, VP_OP_SELECT);
    o.n_inputs = 1;
    o.inputs[0] = x;
    set_shape(&o, 2, B, t->num_labels, 0, 0);
    return push(c, &o, "pool_last", logits);
}

/* A causal LM's loss; under PyTorch's tensor parallelism (vp_tf.dtensor)
 * the head's vocab/tp logits either go to loss_parallel()'s cross entropy
 * or are all-gathered to the whole vocabulary first (replicate_logits:
 * ColwiseParallel output_layouts Replicate(), use_local_output). */
static vp_status dtensor_loss(tb *c, uint32_t logits, uint64_t rows,
                              uint32_t *out)
{
    const vp_tf *t = c->t;
    bool tp = t->dtensor && sp_of(t) > 1 && !c->local;
    if (tp && t->replicate_logits) {
        const vp_op *o = &c->g->ops[logits];
        uint64_t v; /* the padded shards gathered, then unpadded */
        if (!vp_mul_u64(o->shape[o->ndim - 1], sp_of(t), &v))
            return vp_error_at(c->err, VP_EOVERFLOW, c->path, t->line,
                               t->col, 1, "the gathered logits overflow");
        VP_TRY(redistribute_dim(c, logits, o->ndim - 1, v,
                                VP_OPF_GATHER_LAST, "lm_head.all_gather",
                                &logits));
    }
    VP_TRY(loss(c, logits, rows, true, out));
    if (tp && !t->replicate_logits)
        c->g->ops[*out].flags |= VP_OPF_LOSS_PARALLEL;
    return VP_OK;
}

/* The head on the final hidden states x and its loss. */
static vp_status head(tb *c, uint32_t x, uint64_t B, uint64_t S,
                      uint32_t wte)
{
    vp_graph *g = c->g;
    const vp_tf *t = c->t;
    uint32_t logits, l;
    switch (t->head) {
    case VP_HEAD_CAUSAL_LM:
        VP_TRY(linear(c, x, "lm_head", t->vocab, false,
                      t->tied ? (int64_t)wte : -1, &logits));
        if (t->tied)
            g->ops[logits].flags |= VP_OPF_TIED_INIT;
        if (t->x.logit_softcap > 0) { /* Gemma 2: final_logit_softcapping */
            VP_TRY(unary(c, VP_OP_SOFTCAP, logits, "logit_softcap",
                         &logits));
            g->ops[logits].softcap = t->x.logit_softcap;
        }
        return dtensor_loss(c, logits, B * S, &l);
    case VP_HEAD_MASKED_LM:
        VP_TRY(linear(c, x, "mlm.transform", t->hidden, true, -1, &x));
        VP_TRY(unary(c, t->act == VP_ACT_RELU ? VP_OP_RELU
                        : t->act == VP_ACT_GELU_TANH ? VP_OP_GELU_TANH
                                                     : VP_OP_GELU,
                     x, "mlm.act", &x));
        VP_TRY(norm(c, x, "mlm.norm", &x));
        VP_TRY(linear(c, x, "mlm.decoder", t->vocab, true,
                      t->tied ? (int64_t)wte : -1, &logits));
        if (t->tied)
            g->ops[logits].flags |= VP_OPF_TIED_INIT;
        /* BertForMaskedLM: CrossEntropyLoss on the logits as they are */
        return loss(c, logits, B * S, false, &l);
    case VP_HEAD_CLASSIFICATION:
        VP_TRY(classifier(c, x, B, &logits));
        return loss(c, logits, B, false, &l);
    case VP_HEAD_NONE:
        break;
    }
    return VP_OK;
}

vp_status vp__build_transformer(vp_graph *g, const vp_tf *t, const char *path,
                                vp_error *err)
{
    if (t->type == VP_TF_ENCDEC)
        return vp__build_encdec(g, t, path, err);
    tb c = {g, t, err, "", path, 0, false, 0, 0, false};
    uint64_t B = g->batch, S = g->seq;
    VP_TRY(check_sizes(&c, B, S));
    uint32_t x, wte = 0;
    /* an interleaved pipeline rank's model chunks (tf.chunks > 1,
     * megatron.c): each its own input (the previous virtual stage's
     * hidden states; the embeddings for the first rank's first chunk),
     * its share of the layers (as even as can be, the remainder on the
     * first chunks), its output sent */
    uint64_t nch = t->chunks > 1 ? t->chunks : 1, l = 0;
    for (uint64_t ch = 0; ch < nch; ch++) {
        if (t->stage_in || ch > 0)
            VP_TRY(stage_input(&c, B, S, &x));
        else
            VP_TRY(embeddings(&c, B, S, &x, &wte));
        uint64_t end = l + t->layers / nch + (ch < t->layers % nch);
        for (; l < end; l++) {
            c.layer = l;
            snprintf(c.scope, sizeof c.scope, "layers.%llu",
                     (unsigned long long)l);
            uint32_t first = (uint32_t)g->n_ops;
            VP_TRY(layer(&c, x, S, &x));
            VP_TRY(vp__graph_add_segment(g, c.scope, first,
                                         (uint32_t)g->n_ops - 1, true, err));
        }
    }
    c.scope[0] = '\0';
    if (t->stage_out) {
        /* the stage's forward returns after its last layer: what the
         * model keeps until its forward returns (HOLD_FWD) is dropped
         * with the output sent, no later */
        for (size_t i = 0; i < g->n_ops; i++)
            g->ops[i].flags &= ~VP_OPF_HOLD_FWD;
        return VP_OK;
    }
    if (t->final_norm)
        VP_TRY(norm(&c, x, "final_norm", &x));
    size_t head_first = g->n_ops;
    /* `hidden_states = outputs[0]` in the head model's forward */
    g->ops[x].flags |= VP_OPF_HOLD_OUT;
    if (t->norm == VP_NORM_RMSNORM)
        for (size_t i = 0; i < g->n_ops; i++)
            if (g->ops[i].kind == VP_OP_RMSNORM)
                g->ops[i].flags |= VP_OPF_PY_RMSNORM;
    VP_TRY(head(&c, x, B, S, wte));
    if (head_first < g->n_ops)
        g->ops[head_first].flags |= VP_OPF_MODEL_END;
    return VP_OK;
}

/* ---- the primitives, for the blocks built apart (graph_tf.h) ------------ */

void vp__tb_op(vp_op *o, vp_op_kind k) { op_init(o, k); }

void vp__tb_shape(vp_op *o, uint32_t nd, uint64_t a, uint64_t b, uint64_t c,
                  uint64_t d)
{
    set_shape(o, nd, a, b, c, d);
}

vp_status vp__tb_push(tb *c, vp_op *o, const char *leaf, uint32_t *idx)
{
    return push(c, o, leaf, idx);
}

vp_status vp__tb_named(tb *c, vp_op *o, const char *leaf)
{
    return named(c, o, leaf);
}

vp_status vp__tb_param(tb *c, vp_op *o, const char *leaf, uint64_t numel)
{
    return add_param(c, o, leaf, numel, true);
}

vp_status vp__tb_linear(tb *c, uint32_t in, const char *leaf, uint64_t out_f,
                        bool bias, uint32_t *idx)
{
    return linear(c, in, leaf, out_f, bias, -1, idx);
}

vp_status vp__tb_linear_tied(tb *c, uint32_t in, const char *leaf,
                             uint64_t out_f, bool bias, int64_t tied_weight,
                             uint32_t *idx)
{
    return linear(c, in, leaf, out_f, bias, tied_weight, idx);
}

vp_status vp__tb_norm(tb *c, uint32_t in, const char *leaf, bool rms,
                      uint32_t *idx)
{
    vp_tf t = *c->t;
    if (rms) {
        t.norm = VP_NORM_RMSNORM;
        t.norm_bias = false;
    }
    tb c2 = *c;
    c2.t = &t;
    return norm(&c2, in, leaf, idx);
}

vp_status vp__tb_unary(tb *c, vp_op_kind k, uint32_t in, const char *leaf,
                       uint32_t *idx)
{
    return unary(c, k, in, leaf, idx);
}

vp_status vp__tb_dropout(tb *c, uint32_t in, const char *leaf, double p,
                         uint32_t *idx)
{
    return dropout(c, in, leaf, p, idx);
}

vp_status vp__tb_binary(tb *c, vp_op_kind k, uint32_t a, uint32_t b,
                        const char *leaf, uint32_t *idx)
{
    return binary(c, k, a, b, leaf, idx);
}

vp_status vp__tb_weight(tb *c, vp_op *o, const char *leaf, uint64_t numel,
                        bool trainable)
{
    VP_TRY(named(c, o, leaf));
    return add_param(c, o, "weight", numel, trainable);
}

vp_status vp__tb_mlp(tb *c, uint32_t x, uint64_t f, const char *pre,
                     uint32_t *out)
{
    return mlp(c, x, f, pre, out);
}

vp_status vp__tb_overflow(tb *c, const char *what)
{
    return vp_error_at(c->err, VP_EOVERFLOW, c->path, c->t->line, c->t->col,
                       1, "the size of %s overflows 64 bits", what);
}

uint64_t vp__tf_layer_window(const vp_tf *t, uint64_t l)
{
    const vp_tf_ext *x = &t->x;
    if (!x->window || l < x->window_from)
        return 0;
    if (x->full_every && (l - x->window_from + 1) % x->full_every == 0)
        return 0;
    return x->window;
}
