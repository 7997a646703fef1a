/* Op rules: the attention core (softmax(q k^T / sqrt(d)) v) in its four
 * kernels: HF's eager_attention_forward (materialised scores), SDPA's math
 * fallback, and the fused flash and memory-efficient kernels; the packed
 * layout (q, k, v views of one projection) and torch.nn.MultiheadAttention.
 * docs/SIMULATION_NOTES.md §3.2, §3.5 and §11 (traced); PyTorch
 * aten/src/ATen/native/transformers/attention.cpp and sdp_utils.cpp
 * (compute_logsumexp), transformers modeling_gpt2.py
 * (eager_attention_forward) and masking_utils.py. */
#include "../sim_internal.h"

/* What an attention core saves. Eager and math: q (eager: its contiguous
 * copy), k, v, the softmax probabilities, the dropout mask and the dropped
 * probabilities; selective recomputation keeps the slots before
 * ATT_PROBS. Flash and efficient: q, k, v, the logsumexp, the output
 * (torch_mha) and the philox seed and offset. */
enum { ATT_Q, ATT_K, ATT_V, ATT_PROBS, ATT_MASK, ATT_DROPPED };
enum { ATT_LSE = ATT_V + 1, ATT_OUT, ATT_RNG_SEED, ATT_RNG_OFFSET, ATT_BIAS };

/* The efficient kernel pads the logsumexp's rows to this. */
#define EFFICIENT_LSE_ROWS 32u
/* The fused kernels' small scratch (forward), and their backward's
 * workspace beyond an fp32 q and the row sums. */
#define FUSED_SCRATCH 256u

vp_attn_impl vp__attention_impl(const sim *S, const vp_op *o, uint8_t ce)
{
    vp_attn_impl impl = S->s->attn_set ? S->s->attn : o->attn_impl;
    if (impl == VP_ATTN_SDPA)
        impl = ce == 2 ? VP_ATTN_FLASH : VP_ATTN_EFFICIENT;
    return impl;
}

/* HF masking_utils (eager attention): the model builds one 4-D float
 * causal mask [B, 1, Sq, Sk] in its dtype before the decoder layers and
 * keeps it until its forward returns (traced: 16,777,216 B for GPT-2
 * B=4, S=1024 fp32). */
void vp__attention_model_mask(sim *S)
{
    const vp_graph *g = S->g;
    for (uint32_t i = 0; i < g->n_ops; i++) {
        const vp_op *o = &g->ops[i];
        if (o->kind != VP_OP_ATTENTION || !o->causal)
            continue;
        vp_attn_impl impl = S->s->attn_set ? S->s->attn : o->attn_impl;
        if (impl != VP_ATTN_EAGER)
            return;
        uint64_t e = vp__mulc(S, vp__mulc(S, o->shape[0], o->q_len),
                              o->kv_len);
        uint32_t m = vp__talloc(S, vp__mulc(S, e, S->PE), VP_CAT_ACT);
        vp__hold(S, m);
        vp__tunref(S, m);
        return;
    }
}

/* The tensors of one attention forward. */
typedef struct {
    uint32_t q, k, v; /* owned references (k, v: NONE when packed)     */
    uint8_t ce;       /* compute bytes per element                     */
    uint64_t bh;      /* batch x heads                                 */
} att_in;

/* Save the materialised kernels' slots; selective recomputation keeps
 * q, k, v only. */
static void save_materialised(sim *S, const vp__fwd_op *f, uint32_t q,
                              uint32_t k, uint32_t v, uint32_t probs,
                              uint32_t mask, uint32_t dropped)
{
    const vp_op *o = f->o;
    if (o->segment >= 0 && S->sel[o->segment])
        S->recompute_slot = ATT_PROBS;
    vp__save(S, f->i, ATT_Q, q);
    vp__save(S, f->i, ATT_K, k);
    vp__save(S, f->i, ATT_V, v);
    vp__save(S, f->i, ATT_PROBS, probs);
    vp__save(S, f->i, ATT_MASK, mask);
    vp__save(S, f->i, ATT_DROPPED, dropped);
    S->recompute_slot = -1;
}

/* HF eager_attention_forward (transformers 5.x, traced on GPT-2): q made
 * contiguous for bmm (saved); q @ k^T; times the scale; plus the float
 * causal mask (the model's dtype, so fp32 under autocast); softmax (fp32
 * under autocast, saved); .type(v.dtype); dropout (mask and output
 * saved); probs @ v; transpose(1, 2).reshape() copies the output. */
static void eager_fwd(sim *S, vp__fwd_op *f, const att_in *a)
{
    const vp_op *o = f->o;
    uint8_t ce = a->ce;
    uint64_t sc = vp__mulc(S, vp__mulc(S, a->bh, o->q_len), o->kv_len);
    uint64_t qn = vp__mulc(S, vp__mulc(S, o->shape[0], o->q_len),
                           (uint64_t)o->heads * o->head_dim);
    uint8_t me = o->causal ? vp__promote(ce, S->PE) : ce;
    uint8_t se = S->amp ? 4 : me;
    uint32_t qc = vp__talloc(S, vp__mulc(S, qn, ce), VP_CAT_ACT);
    uint32_t s1 = vp__talloc(S, vp__mulc(S, sc, ce), VP_CAT_TEMP);
    uint32_t s2 = vp__talloc(S, vp__mulc(S, sc, ce), VP_CAT_TEMP);
    vp__tunref(S, s1);
    if (o->causal) {
        uint32_t s3 = vp__talloc(S, vp__mulc(S, sc, me), VP_CAT_TEMP);
        vp__tunref(S, s2);
        s2 = s3;
    }
    uint32_t sm = vp__talloc(S, vp__mulc(S, sc, se), VP_CAT_ACT);
    vp__tunref(S, s2);
    uint32_t pc = sm;
    if (se != ce)
        pc = vp__talloc(S, vp__mulc(S, sc, ce), VP_CAT_TEMP);
    else
        vp__tref(S, sm);
    uint32_t mask = NONE, dropped = pc;
    if (o->dropout > 0) {
        mask = vp__talloc(S, sc, VP_CAT_ACT);
        dropped = vp__talloc(S, vp__mulc(S, sc, ce), VP_CAT_ACT);
        vp__tunref(S, pc);
    }
    uint32_t o4 = vp__talloc(S, vp__mulc(S, qn, ce), VP_CAT_TEMP);
    f->out = vp__talloc(S, vp__mulc(S, f->n, f->oeb), VP_CAT_ACT);
    vp__tunref(S, o4);
    if (f->sv)
        save_materialised(S, f, qc, a->k != NONE ? a->k : a->q, a->v, sm,
                          mask, dropped);
    vp__tunref(S, qc);
    vp__tunref(S, sm);
    vp__tunref(S, mask);
    vp__tunref(S, dropped);
}

/* SDPA's math fallback: fp32 scores, their masked copy, the fp32
 * softmax; dropout follows the module's train mode, also under no_grad
 * (the ground truth's inference runs in train mode). */
static void math_fwd(sim *S, vp__fwd_op *f, const att_in *a)
{
    const vp_op *o = f->o;
    uint64_t sc = vp__mulc(S, vp__mulc(S, a->bh, o->q_len), o->kv_len);
    uint8_t pe = 4;
    uint32_t scores = vp__talloc(S, vp__mulc(S, sc, pe), VP_CAT_TEMP);
    if (o->causal)
        vp__transient(S, vp__mulc(S, sc, pe)); /* masked copy */
    uint32_t probs = vp__talloc(S, vp__mulc(S, sc, 4), VP_CAT_TEMP);
    vp__tunref(S, scores);
    uint32_t mask = NONE, dropped = NONE;
    if (o->dropout > 0) {
        mask = vp__talloc(S, sc, VP_CAT_ACT);
        dropped = vp__talloc(S, vp__mulc(S, sc, pe), VP_CAT_ACT);
    }
    f->out = vp__talloc(S, vp__mulc(S, f->n, f->oeb), VP_CAT_ACT);
    if (f->sv)
        save_materialised(S, f, a->q, a->k, a->v, probs, mask, dropped);
    vp__tunref(S, probs);
    vp__tunref(S, mask);
    vp__tunref(S, dropped);
}

/* The fused kernels (flash, memory-efficient): the philox seed and
 * offset when dropout may run, the output, the logsumexp. */
static void fused_fwd(sim *S, vp__fwd_op *f, const att_in *a,
                      vp_attn_impl impl)
{
    const vp_op *o = f->o;
    uint32_t i = f->i;
    bool mha = o->flags & VP_OPF_TORCH_MHA;
    uint32_t rng1 = NONE, rng2 = NONE, lse = NONE;
    /* torch_mha (traced): flash allocates the philox seed and offset in
     * grad mode also at p = 0 */
    if (o->dropout > 0 || (mha && impl == VP_ATTN_FLASH && S->training)) {
        rng1 = vp__talloc(S, 8, VP_CAT_ACT);
        rng2 = vp__talloc(S, 8, VP_CAT_ACT);
    }
    f->out = vp__talloc(S, vp__mulc(S, f->n, f->oeb), VP_CAT_ACT);
    uint64_t L = o->q_len;
    if (impl == VP_ATTN_EFFICIENT)
        L = (L + EFFICIENT_LSE_ROWS - 1) / EFFICIENT_LSE_ROWS *
            EFFICIENT_LSE_ROWS;
    /* logsumexp only when autograd may need it (grad mode on and an
     * input requiring grad: sdp_utils' compute_logsumexp) */
    if (S->training && o->needs_grad)
        lse = vp__talloc(S, vp__mulc(S, vp__mulc(S, a->bh, L), 4),
                         VP_CAT_ACT);
    /* torch_mha (traced): no scratch in the efficient kernel */
    if (!(mha && impl == VP_ATTN_EFFICIENT))
        vp__transient(S, FUSED_SCRATCH);
    if (f->sv) {
        vp__save(S, i, ATT_Q, a->q);
        vp__save(S, i, ATT_K, a->k);
        vp__save(S, i, ATT_V, a->v);
        vp__save(S, i, ATT_LSE, lse);
        /* the packed layout hands the output to out_proj, which saves
         * it; torch_mha's out_proj may save a copy */
        if (mha)
            vp__save(S, i, ATT_OUT, f->out);
        vp__save(S, i, ATT_RNG_SEED, rng1);
        vp__save(S, i, ATT_RNG_OFFSET, rng2);
    }
    vp__tunref(S, lse);
    vp__tunref(S, rng1);
    vp__tunref(S, rng2);
}

/* HF GPT-2 with use_cache (VP_OPF_KV_COPY; off under checkpointing). */
static bool kv_copy(const sim *S, const vp_op *o)
{
    return (o->flags & VP_OPF_KV_COPY) &&
           !(o->segment >= 0 && S->ckpt[o->segment]);
}

void vp__attention_fwd(sim *S, vp__fwd_op *f)
{
    const vp_op *o = f->o;
    att_in a;
    a.ce = S->amp ? 2 : f->eb0;
    a.q = vp__cast_input(S, f->in0, a.ce);
    a.k = a.v = NONE;
    if (o->n_inputs >= 3) {
        a.k = vp__cast_input(S, o->inputs[1], a.ce);
        a.v = vp__cast_input(S, o->inputs[2], a.ce);
    }
    a.bh = vp__mulc(S, o->shape[0], o->heads);
    uint64_t kvn = vp__mulc(S, vp__mulc(S, o->shape[0], o->kv_len),
                            (uint64_t)o->kv_heads * o->head_dim);
    bool copy = kv_copy(S, o) && f->mode == MODE_SAVE;
    if (copy) {
        /* HF DynamicCache (use_cache): the copies live in the cache
         * until the model's output is dropped; separate projections'
         * outputs die once copied (T5, traced) */
        uint32_t k = vp__talloc(S, vp__mulc(S, kvn, a.ce), VP_CAT_ACT);
        uint32_t v = vp__talloc(S, vp__mulc(S, kvn, a.ce), VP_CAT_ACT);
        vp__tunref(S, a.k);
        vp__tunref(S, a.v);
        a.k = k;
        a.v = v;
        vp__hold(S, a.k);
        vp__hold(S, a.v);
    }
    /* an additive bias (T5's position bias): attention_math.c */
    uint32_t mask = NONE, mcast = NONE, cond = NONE;
    if (o->n_inputs >= 4)
        vp__attention_bias_fwd(S, f, a.ce, &mask, &mcast, &cond);
    vp_attn_impl impl = vp__attention_core_impl(S, o, a.ce);
    bool mha = o->flags & VP_OPF_TORCH_MHA;
    f->oeb = a.ce;
    f->ol = 0;
    if (impl == VP_ATTN_EAGER)
        eager_fwd(S, f, &a);
    else if (impl == VP_ATTN_MATH && !mha)
        vp__attention_math_fwd(S, f, a.q, a.k != NONE ? a.k : a.q,
                               a.v != NONE ? a.v : a.q, copy, a.ce);
    else if (impl == VP_ATTN_MATH)
        math_fwd(S, f, &a);
    else
        fused_fwd(S, f, &a, impl);
    if (f->sv && mask != NONE && impl != VP_ATTN_MATH &&
        impl != VP_ATTN_EAGER)
        vp__save(S, f->i, ATT_BIAS, mcast != NONE ? mcast : mask);
    if (f->sv)
        vp__attention_bias_save(S, f->i, cond);
    vp__tunref(S, cond);
    vp__tunref(S, mcast);
    vp__tunref(S, mask);
    vp__tunref(S, a.q);
    vp__tunref(S, a.k);
    vp__tunref(S, a.v);
}

/* ---- backward ---------------------------------------------------------------- */

/* The sizes of one attention backward. */
typedef struct {
    uint8_t ce;
    vp_attn_impl impl;
    uint64_t bh, qn, kvn; /* batch x heads; elements of q, of k (or v)  */
    uint32_t dq, dk, dv;  /* the gradients made                          */
} att_grads;

/* The nodes of eager_attention_forward in reverse (traced): the output
 * copy's backward, bmm(probs, v), dropout, the ToCopy to fp32, softmax
 * (two buffers), the mask add (cast back), the scale, bmm(q, k^T). */
static void eager_bwd(sim *S, vp__bwd_op *b, att_grads *d)
{
    const vp_op *o = b->o;
    uint32_t i = b->i;
    uint8_t ce = d->ce;
    uint64_t sc = vp__mulc(S, vp__mulc(S, d->bh, o->q_len), o->kv_len);
    uint8_t me = o->causal ? vp__promote(ce, S->PE) : ce;
    uint8_t se = S->amp ? 4 : me;
    uint32_t t = vp__talloc(S, vp__mulc(S, d->qn, ce), VP_CAT_TEMP);
    vp__tunref(S, b->gy);
    b->gy = NONE;
    d->dv = vp__talloc(S, vp__mulc(S, d->kvn, ce), VP_CAT_TEMP);
    uint32_t ga = vp__talloc(S, vp__mulc(S, sc, ce), VP_CAT_TEMP);
    vp__tunref(S, t);
    vp__drop_saved(S, i, ATT_V);
    vp__drop_saved(S, i, ATT_DROPPED);
    if (o->dropout > 0) {
        uint32_t g2 = vp__talloc(S, vp__mulc(S, sc, ce), VP_CAT_TEMP);
        vp__tunref(S, ga);
        ga = g2;
        vp__drop_saved(S, i, ATT_MASK);
    }
    if (se != ce) {
        uint32_t g3 = vp__talloc(S, vp__mulc(S, sc, se), VP_CAT_TEMP);
        vp__tunref(S, ga);
        ga = g3;
    }
    uint32_t g4 = vp__talloc(S, vp__mulc(S, sc, se), VP_CAT_TEMP);
    vp__transient(S, vp__mulc(S, sc, se));
    vp__tunref(S, ga);
    vp__drop_saved(S, i, ATT_PROBS);
    ga = g4;
    if (me != ce) {
        uint32_t g5 = vp__talloc(S, vp__mulc(S, sc, ce), VP_CAT_TEMP);
        vp__tunref(S, ga);
        ga = g5;
    }
    uint32_t g6 = vp__talloc(S, vp__mulc(S, sc, ce), VP_CAT_TEMP);
    vp__tunref(S, ga);
    d->dq = vp__talloc(S, vp__mulc(S, d->qn, ce), VP_CAT_TEMP);
    d->dk = vp__talloc(S, vp__mulc(S, d->kvn, ce), VP_CAT_TEMP);
    vp__tunref(S, g6);
    vp__drop_saved(S, i, ATT_Q);
    vp__drop_saved(S, i, ATT_K);
}

/* The kernels' own scratch after dq, dk, dv: the fused kernels' fp32
 * workspace, the math path's two fp32 score gradients. */
static void kernel_bwd_scratch(sim *S, const vp_op *o, const att_grads *d)
{
    if (d->impl == VP_ATTN_FLASH || d->impl == VP_ATTN_EFFICIENT) {
        uint64_t ws = vp__mulc(S, d->qn, 4);
        ws += vp__mulc(S, vp__mulc(S, d->bh, o->q_len), 4) + FUSED_SCRATCH;
        vp__transient(S, ws);
    } else if (d->impl == VP_ATTN_MATH) {
        uint64_t sc = vp__mulc(S, vp__mulc(S, d->bh, o->q_len), o->kv_len);
        uint32_t t1 = vp__talloc(S, vp__mulc(S, sc, 4), VP_CAT_TEMP);
        uint32_t t2 = vp__talloc(S, vp__mulc(S, sc, 4), VP_CAT_TEMP);
        vp__tunref(S, t1);
        vp__tunref(S, t2);
    }
}

/* torch_mha: q, k, v are views of the packed projection:
 * q.view(L, N*h, d).transpose(0, 1).view(N, h, L, d). The two
 * ViewBackward nodes of each (v, k, q, in the engine's order) reshape its
 * grad, copying when it is not in the projection's order: the efficient
 * kernel writes [B, L, h, d] (two copies each), math's bmm [B*h, L, d]
 * (one), flash like q (none). Then each SelectBackward of proj[0..2]
 * makes a zero [3, L, N, E] buffer, summed into the first (v's). */
static void mha_input_grad(sim *S, vp__bwd_op *b, att_grads *d)
{
    int rounds = d->impl == VP_ATTN_FLASH       ? 0
                 : d->impl == VP_ATTN_EFFICIENT ? 2
                                                : 1;
    for (int r = 0; r < rounds; r++) {
        uint32_t *gs[3] = {&d->dv, &d->dk, &d->dq};
        for (int k = 0; k < 3; k++) {
            uint32_t c = vp__talloc(S, vp__mulc(S, d->qn, d->ce),
                                    VP_CAT_TEMP);
            vp__tunref(S, *gs[k]);
            *gs[k] = c;
        }
    }
    uint64_t pk = vp__mulc(S, S->g->ops[b->in0].numel, d->ce);
    b->gx = vp__talloc(S, pk, VP_CAT_TEMP);
    vp__tunref(S, d->dv);
    uint32_t t = vp__talloc(S, pk, VP_CAT_TEMP);
    vp__tunref(S, d->dk);
    vp__tunref(S, t);
    uint32_t c = vp__talloc(S, pk, VP_CAT_TEMP);
    vp__tunref(S, d->dq);
    vp__tunref(S, c);
    b->gxe = d->ce;
}

/* The packed layout: the cache's cat backward makes k's and v's grads
 * contiguous (one at a time), then split's backward cats q, k, v. */
static void packed_input_grad(sim *S, vp__bwd_op *b, att_grads *d)
{
    if (kv_copy(S, b->o)) {
        uint32_t a = vp__talloc(S, vp__mulc(S, d->kvn, d->ce), VP_CAT_TEMP);
        vp__tunref(S, d->dk);
        d->dk = a;
        uint32_t c = vp__talloc(S, vp__mulc(S, d->kvn, d->ce), VP_CAT_TEMP);
        vp__tunref(S, d->dv);
        d->dv = c;
    }
    b->gx = vp__grad_like(S, b->in0, d->ce);
    vp__tunref(S, d->dq);
    vp__tunref(S, d->dk);
    vp__tunref(S, d->dv);
    b->gxe = d->ce;
}

void vp__attention_bwd(sim *S, vp__bwd_op *b)
{
    const vp_op *o = b->o;
    bool mha = o->flags & VP_OPF_TORCH_MHA;
    att_grads d;
    d.ce = b->oeb;
    d.bh = vp__mulc(S, o->shape[0], o->heads);
    d.qn = vp__mulc(S, vp__mulc(S, o->shape[0], o->q_len),
                    (uint64_t)o->heads * o->head_dim);
    d.kvn = vp__mulc(S, vp__mulc(S, o->shape[0], o->kv_len),
                     (uint64_t)o->kv_heads * o->head_dim);
    d.impl = vp__attention_core_impl(S, o, d.ce);
    bool math = d.impl == VP_ATTN_MATH && !mha; /* attention_math.c */
    /* torch_mha: the efficient kernel wants grad_out in [B, L, h, d]
     * order; it comes back sequence-first (the permute's grad) */
    bool mha_eff = mha && d.impl == VP_ATTN_EFFICIENT;
    uint32_t gcopy = mha_eff ? vp__talloc(S, vp__mulc(S, d.qn, d.ce),
                                          VP_CAT_TEMP)
                             : NONE;
    uint32_t delta = NONE;
    if (d.impl == VP_ATTN_EAGER) {
        eager_bwd(S, b, &d);
    } else if (math) {
        vp__attention_math_bwd(S, b, d.ce, &d.dq, &d.dk, &d.dv);
    } else {
        d.dq = vp__talloc(S, vp__mulc(S, d.qn, d.ce), VP_CAT_TEMP);
        d.dk = vp__talloc(S, vp__mulc(S, d.kvn, d.ce), VP_CAT_TEMP);
        d.dv = vp__talloc(S, vp__mulc(S, d.kvn, d.ce), VP_CAT_TEMP);
    }
    if (mha_eff) {
        /* delta = (grad_out * out).sum(-1) in fp32 (traced on the
         * torch_mha path; the packed path leaves it out) */
        uint64_t rows4 = vp__mulc(S, vp__mulc(S, d.bh, o->q_len), 4);
        uint32_t t = vp__talloc(S, vp__mulc(S, d.qn, 4), VP_CAT_TEMP);
        uint32_t s1 = vp__talloc(S, rows4, VP_CAT_TEMP);
        delta = vp__talloc(S, rows4, VP_CAT_TEMP);
        vp__tunref(S, s1);
        vp__tunref(S, t);
    }
    if (!math)
        kernel_bwd_scratch(S, o, &d);
    vp__tunref(S, delta);
    vp__tunref(S, gcopy);
    vp__tunref(S, b->gy);
    b->gy = NONE;
    vp__release_saved(S, b->i);
    if (o->n_inputs == 1 && mha) {
        mha_input_grad(S, b, &d);
    } else if (o->n_inputs == 1) {
        packed_input_grad(S, b, &d);
    } else {
        /* math's grads are [B, h, L, d], and so are k's and v's through
         * the cache's cat: the projections' views copy them */
        bool kvs = math || kv_copy(S, o);
        vp__give_grad_l(S, o->inputs[0], d.dq, d.ce, math);
        vp__give_grad_l(S, o->inputs[1], d.dk, d.ce, kvs);
        vp__give_grad_l(S, o->inputs[2], d.dv, d.ce, kvs);
    }
}
