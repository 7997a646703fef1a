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
enum { ATT_Q, ATT_K, ATT_V, ATT_PROBS, ATT_MASK, ATT_DROPPED, ATT_TANH };
enum { ATT_LSE = ATT_V + 1, ATT_OUT, ATT_RNG_SEED, ATT_RNG_OFFSET,
       ATT_BIAS };

/* The efficient kernel pads the logsumexp's rows to this. */
#define EFFICIENT_LSE_ROWS 32u
/* The fused kernels' small scratch (forward), and their backward's
 * workspace beyond an fp32 q and the row sums. */
#define FUSED_SCRATCH 256u

static bool windowed(const vp_setup *s, const vp_op *o);
static bool sdpa_gqa(const vp_op *o);

/* The kernel that runs, the one choice for every caller: the setup's or
 * the model's. SDPA: a sliding window whose mask cuts is an explicit
 * mask, which flash cannot take: the memory-efficient kernel; else flash
 * for 16-bit inputs; grouped KV heads without a mask (HF passes
 * enable_gqa, sdpa_gqa) in fp32: the math path (traced: Qwen3 fp32, the
 * fine-tuning cases); else the memory-efficient kernel. An additive bias
 * (the fourth input, T5's position bias, ops/attention_math.c) that needs
 * a gradient sends SDPA to the math kernel unless the setup chose one,
 * and flash takes no mask (traced: T5's self-attention runs math, its
 * cross-attention, whose zero bias needs none, the efficient kernel). */
vp_attn_impl vp__attention_impl(const sim *S, const vp_op *o, uint8_t ce)
{
    return vp__attention_impl_of(S->g, S->s, o, ce);
}

/* transformers' sdpa_attention_forward: transpose(1, 2).contiguous()
 * copies flash's output when its head width is not a power of two, or
 * v's differs from q's (traced: Phi-3's 96, DeepSeek-V3's MLA; never for
 * 64, 128, 256; the fp32 MLA case measures none for the efficient
 * kernel; not Megatron's, whose output is a view: graph_mla.c); the
 * kernel keeps its own for backward. Traced on causal decoders only: the
 * measured U-Nets' non-causal cross-attention (head width 40,
 * groundtruth/h200-torch2.11-encdec.jsonl) shows no such copy. */
bool vp__attention_out_copied(const vp_op *o, vp_attn_impl impl)
{
    return !(o->flags & VP_OPF_TORCH_MHA) && o->causal && o->n_inputs == 3 &&
           impl == VP_ATTN_FLASH && !(o->flags & VP_OPF_MEGATRON) &&
           ((o->head_dim & (o->head_dim - 1)) ||
            (o->v_head_dim && o->v_head_dim != o->head_dim));
}

vp_attn_impl vp__attention_impl_of(const vp_graph *g, const vp_setup *s,
                                   const vp_op *o, uint8_t ce)
{
    vp_attn_impl impl = s->attn_set ? s->attn : o->attn_impl;
    bool chosen = s->attn_set && s->attn != VP_ATTN_SDPA;
    if (impl == VP_ATTN_SDPA)
        impl = windowed(s, o) ? VP_ATTN_EFFICIENT
               : ce == 2      ? VP_ATTN_FLASH
               : sdpa_gqa(o)  ? VP_ATTN_MATH
                              : VP_ATTN_EFFICIENT;
    if (o->n_inputs < 4 || impl == VP_ATTN_EAGER)
        return impl;
    if (!chosen && g->ops[o->inputs[3]].needs_grad && vp__setup_training(s))
        return VP_ATTN_MATH;
    return impl == VP_ATTN_FLASH ? VP_ATTN_EFFICIENT : impl;
}

/* Whether a windowed layer's window cuts (shorter than the keys) in a
 * training or inference step; generate() models its masks, their repeats
 * and conversions itself (generate.c, mask_needed). */
static bool windowed(const vp_setup *s, const vp_op *o)
{
    return o->window && o->window < o->kv_len && !s->generate.prompt;
}

/* HF masking_utils: the model builds its masks once, before the decoder
 * layers, and keeps them until its forward returns. Eager attention: one
 * 4-D float causal mask [B, 1, Sq, Sk] in the model's dtype per kind of
 * layer, full and sliding (traced: 16,777,216 B for GPT-2 B=4, S=1024
 * fp32; two for Gemma 2). SDPA: the full layers use is_causal and need
 * none; sliding layers whose window cuts get a bool mask [B, 1, Sq, Sk]
 * (create_sliding_window_causal_mask). */
void vp__attention_model_mask(sim *S)
{
    const vp_graph *g = S->g;
    bool full = false, slide = false;
    for (uint32_t i = 0; i < g->n_ops; i++) {
        const vp_op *o = &g->ops[i];
        if (o->kind != VP_OP_ATTENTION || !o->causal)
            continue;
        vp_attn_impl impl = S->s->attn_set ? S->s->attn : o->attn_impl;
        bool eager = impl == VP_ATTN_EAGER;
        bool w = windowed(S->s, o);
        if ((w && slide) || (!w && (full || !eager)))
            continue;
        uint64_t e = vp__mulc(S, vp__mulc(S, o->shape[0], o->q_len),
                              o->kv_len);
        uint32_t m = vp__talloc(S, eager ? vp__mulc(S, e, S->PE) : e,
                                VP_CAT_ACT);
        vp__hold(S, m);
        vp__tunref(S, m);
        full |= !w;
        slide |= w;
    }
}

/* The tensors of one attention forward. */
typedef struct {
    uint32_t q, k, v; /* owned references (k, v: NONE when packed)     */
    uint8_t ce;       /* compute bytes per element                     */
    uint64_t bh;      /* batch x heads                                 */
    uint64_t on;      /* elements of the output before its reshape     */
} att_in;

/* Elements of q, of k and of v (and the output) of an attention op. */
static uint64_t att_qn(sim *S, const vp_op *o)
{
    return vp__mulc(S, vp__mulc(S, o->shape[0], o->q_len),
                    (uint64_t)o->heads * o->head_dim);
}

static uint64_t att_kn(sim *S, const vp_op *o, bool v)
{
    uint64_t d = v && o->v_head_dim ? o->v_head_dim : o->head_dim;
    return vp__mulc(S, vp__mulc(S, o->shape[0], o->kv_len),
                    (uint64_t)o->kv_heads * d);
}

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

/* Gemma 2's attn_logit_softcapping between the scale and the mask:
 * scores / cap, tanh (saved), * cap (modeling_gemma2.py,
 * eager_attention_forward; traced). s is replaced. */
static uint32_t softcap_fwd(sim *S, uint64_t bytes, uint32_t s,
                            uint32_t *th)
{
    uint32_t d = vp__talloc(S, bytes, VP_CAT_TEMP);
    vp__tunref(S, s);
    *th = vp__talloc(S, bytes, VP_CAT_ACT);
    vp__tunref(S, d);
    return vp__talloc(S, bytes, VP_CAT_TEMP);
}

/* The softmax's dtype in eager attention. The rotary families' and
 * DeepSeek's eager_attention_forward (transformers 5.x modeling_llama.py,
 * modeling_gemma2.py, ...) call softmax(..., dtype=torch.float32): fp32
 * always, from an fp32 copy of 16-bit scores. GPT-2's and BERT's
 * (modeling_gpt2.py eager_attention_forward, BertSelfAttention) call
 * softmax(scores) (VP_OPF_SOFTMAX_NATIVE): the scores' dtype, fp32 under
 * autocast (softmax is in its fp32 list). */
static uint8_t softmax_es(const sim *S, const vp_op *o, uint8_t me)
{
    if (o->flags & VP_OPF_SOFTMAX_NATIVE)
        return S->amp ? 4 : me;
    return 4;
}

/* HF eager_attention_forward (transformers 5.x, traced on GPT-2 and
 * Gemma 2): q made contiguous for bmm when it is a view of a packed
 * projection (saved); q @ k^T; times the scale; soft-capping; plus the
 * float causal mask (the model's dtype, so fp32 under autocast); softmax
 * (fp32 under autocast, saved); .type(v.dtype); dropout (mask and output
 * saved); probs @ v; transpose(1, 2).reshape() copies the output. */
static void eager_fwd(sim *S, vp__fwd_op *f, const att_in *a)
{
    const vp_op *o = f->o;
    uint8_t ce = a->ce;
    uint64_t sc = vp__mulc(S, vp__mulc(S, a->bh, o->q_len), o->kv_len);
    uint64_t qn = att_qn(S, o);
    uint8_t me = o->causal ? vp__promote(ce, S->PE) : ce;
    uint32_t qc = a->q, th = NONE;
    if (o->n_inputs == 1)
        qc = vp__talloc(S, vp__mulc(S, qn, ce), VP_CAT_ACT);
    else
        vp__tref(S, qc);
    uint32_t s1 = vp__talloc(S, vp__mulc(S, sc, ce), VP_CAT_TEMP);
    uint32_t s2 = vp__talloc(S, vp__mulc(S, sc, ce), VP_CAT_TEMP);
    vp__tunref(S, s1);
    if (o->softcap > 0)
        s2 = softcap_fwd(S, vp__mulc(S, sc, ce), s2, &th);
    if (!f->sv) { /* tanh's output is saved only for the backward */
        vp__tunref(S, th);
        th = NONE;
    }
    if (o->causal) {
        uint32_t s3 = vp__talloc(S, vp__mulc(S, sc, me), VP_CAT_TEMP);
        vp__tunref(S, s2);
        s2 = s3;
    }
    /* softmax(dtype=torch.float32): a fp32 copy of 16-bit scores, then
     * the fp32 softmax (traced on Gemma 2 in bf16) */
    uint8_t se = softmax_es(S, o, me);
    uint32_t s4 = se != me && !(o->flags & VP_OPF_SOFTMAX_NATIVE)
                      ? vp__talloc(S, vp__mulc(S, sc, se), VP_CAT_TEMP)
                      : NONE;
    uint32_t sm = vp__talloc(S, vp__mulc(S, sc, se), VP_CAT_ACT);
    vp__tunref(S, s4);
    uint32_t pc = sm;
    if (se != ce)
        pc = vp__talloc(S, vp__mulc(S, sc, ce), VP_CAT_TEMP);
    else
        vp__tref(S, sm);
    vp__tunref(S, s2);
    uint32_t mask = NONE, dropped = pc;
    if (o->dropout > 0) {
        mask = vp__talloc(S, sc, VP_CAT_ACT);
        dropped = vp__talloc(S, vp__mulc(S, sc, ce), VP_CAT_ACT);
        vp__tunref(S, pc);
    }
    uint32_t o4 = vp__talloc(S, vp__mulc(S, a->on, ce), VP_CAT_TEMP);
    f->out = vp__talloc(S, vp__mulc(S, f->n, f->oeb), VP_CAT_ACT);
    vp__tunref(S, o4);
    if (f->sv) {
        save_materialised(S, f, qc, a->k != NONE ? a->k : a->q, a->v, sm,
                          mask, dropped);
        vp__save(S, f->i, ATT_TANH, th);
    } else {
        /* the attention returns its weights, which the decoder layer
         * keeps in a local (`hidden_states, _ = self.self_attn(...)`)
         * until it returns (traced: Gemma 2 generate()) */
        vp__hold_layer(S, dropped, o->segment);
    }
    vp__tunref(S, qc);
    vp__tunref(S, sm);
    vp__tunref(S, mask);
    vp__tunref(S, dropped);
    vp__tunref(S, th);
}

/* Grouped-query attention that SDPA runs with enable_gqa (HF's
 * sdpa_attention_forward passes it when no mask is given:
 * integrations/sdpa_attention.py, use_gqa_in_sdpa), which the fused
 * efficient kernel does not take (sdp_utils.cpp: its dense constraints
 * check_batch_size_and_num_heads_dense<false>). */
static bool sdpa_gqa(const vp_op *o)
{
    return o->kv_heads && o->kv_heads < o->heads &&
           !(o->flags & VP_OPF_TORCH_MHA);
}

/* SDPA's math path (aten/src/ATen/native/transformers/attention.cpp,
 * _scaled_dot_product_attention_math, torch 2.11): q, k, v upcast to
 * fp32 for half inputs; q * sqrt(scale) (saved); the causal mask as an
 * fp32 [L, S] tensor (from a bool tril); k, v repeated per query head for
 * enable_gqa (repeat_interleave); k^T * sqrt(scale) (saved); the scores,
 * the mask added in place; _safe_softmax (softmax, the rows that are all
 * -inf, where(): the result saved); dropout (mask and output saved);
 * probs @ v (v saved), cast back to the input dtype; HF's
 * transpose(1, 2).contiguous() copies the [B, h, L, d] output. */
static void math_fwd(sim *S, vp__fwd_op *f, const att_in *a)
{
    const vp_op *o = f->o;
    uint8_t ce = a->ce;
    uint64_t sc = vp__mulc(S, vp__mulc(S, a->bh, o->q_len), o->kv_len);
    uint64_t qn = vp__mulc(S, vp__mulc(S, o->shape[0], o->q_len),
                           (uint64_t)o->heads * o->head_dim);
    uint64_t kvn = vp__mulc(S, vp__mulc(S, o->shape[0], o->kv_len),
                            (uint64_t)o->kv_heads * o->head_dim);
    uint64_t ls = vp__mulc(S, o->q_len, o->kv_len);
    bool gqa = sdpa_gqa(o), up = ce != 4;
    uint32_t k = a->k != NONE ? a->k : a->q, v = a->v != NONE ? a->v : a->q;
    uint32_t q32 = up ? vp__talloc(S, vp__mulc(S, qn, 4), VP_CAT_TEMP) : NONE;
    uint32_t k32 = up ? vp__talloc(S, vp__mulc(S, kvn, 4), VP_CAT_TEMP) : k;
    uint32_t v32 = up ? vp__talloc(S, vp__mulc(S, kvn, 4), VP_CAT_ACT) : v;
    uint32_t qs = vp__talloc(S, vp__mulc(S, qn, 4), VP_CAT_ACT);
    vp__tunref(S, q32);
    uint32_t mask = NONE;
    if (o->causal) { /* ones(L, S).tril(), then zeros_like + masked_fill_ */
        uint32_t ones = vp__talloc(S, ls, VP_CAT_TEMP);
        uint32_t tril = vp__talloc(S, ls, VP_CAT_TEMP);
        vp__tunref(S, ones);
        mask = vp__talloc(S, vp__mulc(S, ls, 4), VP_CAT_TEMP);
        vp__transient(S, ls);
        vp__tunref(S, tril);
    }
    uint32_t kx = gqa ? vp__talloc(S, vp__mulc(S, qn, 4), VP_CAT_TEMP) : k32;
    uint32_t vx = gqa ? vp__talloc(S, vp__mulc(S, qn, 4), VP_CAT_ACT) : v32;
    uint32_t ks = vp__talloc(S, vp__mulc(S, qn, 4), VP_CAT_ACT);
    if (gqa)
        vp__tunref(S, kx);
    if (up)
        vp__tunref(S, k32);
    uint32_t scores = vp__talloc(S, vp__mulc(S, sc, 4), VP_CAT_TEMP);
    uint32_t sm = vp__talloc(S, vp__mulc(S, sc, 4), VP_CAT_TEMP);
    uint32_t eq = vp__talloc(S, sc, VP_CAT_TEMP);
    uint32_t rows = vp__talloc(S, vp__mulc(S, a->bh, o->q_len), VP_CAT_TEMP);
    uint32_t probs = vp__talloc(S, vp__mulc(S, sc, 4), VP_CAT_ACT);
    vp__tunref(S, rows);
    vp__tunref(S, eq);
    vp__tunref(S, sm);
    vp__tunref(S, scores);
    uint32_t dmask = NONE, dropped = NONE;
    if (o->dropout > 0) {
        dmask = vp__talloc(S, sc, VP_CAT_ACT);
        dropped = vp__talloc(S, vp__mulc(S, sc, 4), VP_CAT_ACT);
    }
    uint32_t out = vp__talloc(S, vp__mulc(S, qn, 4), VP_CAT_TEMP);
    if (up) { /* .to(origin_dtype) of the output and of the weights */
        uint32_t c = vp__talloc(S, vp__mulc(S, qn, ce), VP_CAT_TEMP);
        vp__tunref(S, out);
        out = c;
        vp__transient(S, vp__mulc(S, sc, ce));
    }
    vp__tunref(S, mask);
    f->out = vp__talloc(S, vp__mulc(S, f->n, f->oeb), VP_CAT_ACT);
    vp__tunref(S, out);
    if (f->sv)
        save_materialised(S, f, qs, ks, vx, probs, dmask, dropped);
    vp__tunref(S, qs);
    vp__tunref(S, ks);
    if (gqa)
        vp__tunref(S, vx);
    if (up)
        vp__tunref(S, v32);
    vp__tunref(S, probs);
    vp__tunref(S, dmask);
    vp__tunref(S, dropped);
}

/* The math kernel with an additive bias (T5's position bias, the fourth
 * input; ops/attention_math.c) or without one (math_fwd: GQA, torch_mha,
 * a kernel chosen by the setup). */
static bool bias_math(const vp_op *o, vp_attn_impl impl)
{
    return impl == VP_ATTN_MATH && o->n_inputs >= 4 &&
           !(o->flags & VP_OPF_TORCH_MHA);
}

/* Whether a consumer of the attention's output (out_proj) saves it for its
 * weight's gradient: then the packed layout needs no save of its own for
 * it; a frozen out_proj keeps only its weight, and the fused kernel's own
 * save of its output shows. */
static bool output_kept(const sim *S, uint32_t i)
{
    const vp_graph *g = S->g;
    for (uint32_t k = i + 1; k < g->n_ops; k++) {
        const vp_op *c = &g->ops[k];
        /* an fp8 linear saves its fp8 cast, not this output */
        for (uint32_t j = 0; j < c->n_inputs; j++)
            if (c->inputs[j] == i && c->kind == VP_OP_LINEAR &&
                !(c->flags & VP_OPF_FP8) && c->n_params &&
                g->params[c->params[0]].trainable)
                return true;
    }
    return false;
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
    bool copy = vp__attention_out_copied(o, impl);
    uint32_t ko = vp__talloc(S, vp__mulc(S, f->n, f->oeb), VP_CAT_ACT);
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
    /* a sliding window's bool mask: SDPA converts it to an additive
     * float bias [B, 1, Sq, Sk] in q's dtype (convert_boolean_attn_mask),
     * which the efficient kernel's backward reads again */
    if (copy) {
        f->out = vp__talloc(S, vp__mulc(S, f->n, f->oeb), VP_CAT_ACT);
    } else {
        f->out = ko;
        ko = NONE;
    }
    uint32_t bias = NONE;
    if (windowed(S->s, o) && impl == VP_ATTN_EFFICIENT)
        bias = vp__talloc(S, vp__mulc(S, vp__mulc(S, vp__mulc(S,
                              o->shape[0], o->q_len), o->kv_len), a->ce),
                          VP_CAT_ACT);
    if (f->sv) {
        vp__save(S, i, ATT_Q, a->q);
        vp__save(S, i, ATT_K, a->k);
        vp__save(S, i, ATT_V, a->v);
        vp__save(S, i, ATT_LSE, lse);
        /* the packed layout hands the output to out_proj, which saves
         * it (unless frozen; a copied output: the kernel keeps its
         * own); torch_mha's out_proj may save a copy */
        if (ko != NONE)
            vp__save(S, i, ATT_OUT, ko);
        else if (mha || !output_kept(S, i))
            vp__save(S, i, ATT_OUT, f->out);
        vp__save(S, i, ATT_RNG_SEED, rng1);
        vp__save(S, i, ATT_RNG_OFFSET, rng2);
        if (bias != NONE) /* else a T5 bias's (vp__attention_fwd) */
            vp__save(S, i, ATT_BIAS, bias);
    }
    vp__tunref(S, bias);
    vp__tunref(S, ko);
    vp__tunref(S, lse);
    vp__tunref(S, rng1);
    vp__tunref(S, rng2);
}

/* HF's DynamicCache in training (VP_OPF_KV_COPY; off under
 * checkpointing): GPT-2's packed k, v, or the separate ones. */
static bool kv_copy(const sim *S, const vp_op *o)
{
    return (o->flags & VP_OPF_KV_COPY) &&
           !(o->segment >= 0 && S->ckpt[o->segment]);
}

/* Whether k and v are copied to every head: HF's repeat_kv (eager, and
 * SDPA with a mask: transformers passes enable_gqa only without one);
 * the math kernel's repeat_interleave (enable_gqa) is math_fwd's own. */
static bool att_repeats(const sim *S, const vp_op *o, vp_attn_impl impl)
{
    if (o->n_inputs != 3 || o->kv_heads >= o->heads)
        return false;
    return impl == VP_ATTN_EAGER ||
           (impl == VP_ATTN_EFFICIENT && windowed(S->s, o));
}

/* Whether HF's repeat_kv is a view, not a copy, for the fused kernels:
 * it expands [B, kv, S, D] to [B, kv, n_rep, S, D] and reshapes that to
 * [B, kv * n_rep, S, D] (transformers integrations/sdpa_attention.py,
 * repeat_kv). With one KV head the reshape only merges a size-1 dim into
 * the stride-0 one, which ATen's computeStride (aten/src/ATen/
 * TensorUtils.cpp) can view: the heads share k and v, and the efficient
 * kernel, which needs only the last dim contiguous, takes them as they
 * are (traced: gemma3-1b bf16 b8's sliding layers, ho5; no copy). Eager
 * attention's matmul reshapes the view again and copies it: its rule. */
static bool repeat_view(const vp_op *o, vp_attn_impl impl)
{
    return o->kv_heads == 1 && impl != VP_ATTN_EAGER;
}

/* HF DynamicCache in training (use_cache; off under checkpointing, read
 * off the Llama, Qwen3 and Gemma traces): update() is cat([], k) and
 * cat([], v), copies that the cache keeps until the model's output is
 * dropped, v promoted to k's dtype (fp32 after the rotary embedding under
 * autocast); the attention reads the copies (repeated for eager GQA). */
static void cache_kv(sim *S, const vp_op *o, att_in *a, bool rep,
                     bool view, uint32_t *kr, uint32_t *vr)
{
    uint8_t ke = S->out_eb[o->inputs[1]];
    uint8_t ve = vp__promote(ke, S->out_eb[o->inputs[2]]);
    uint64_t kn = att_kn(S, o, false), vn = att_kn(S, o, true);
    uint32_t kc = vp__talloc(S, vp__mulc(S, kn, ke), VP_CAT_ACT);
    uint32_t vc = vp__talloc(S, vp__mulc(S, vn, ve), VP_CAT_ACT);
    vp__hold(S, kc);
    vp__hold(S, vc);
    vp__tunref(S, a->k);
    vp__tunref(S, a->v);
    vp__tunref(S, *kr);
    vp__tunref(S, *vr);
    *kr = *vr = NONE;
    uint64_t r = rep ? o->heads / o->kv_heads : 1;
    uint32_t c[2] = {kc, vc};
    uint8_t e[2] = {ke, ve};
    uint64_t n[2] = {kn, vn};
    uint32_t *dst[2] = {&a->k, &a->v}, *reps[2] = {kr, vr};
    for (int j = 0; j < 2; j++) {
        uint32_t src = c[j];
        if (r > 1 && !view) { /* repeat_kv of the cached tensor */
            src = *reps[j] = vp__talloc(S, vp__mulc(S, vp__mulc(S, n[j], r),
                                                    e[j]), VP_CAT_TEMP);
        }
        if (e[j] != a->ce) {
            *dst[j] = vp__talloc(S, vp__mulc(S, vp__mulc(S, n[j], r),
                                             a->ce), VP_CAT_ACT);
        } else {
            vp__tref(S, src);
            *dst[j] = src;
        }
    }
    vp__tunref(S, kc);
    vp__tunref(S, vc);
}

/* Eager attention with fewer KV heads than heads: repeat_kv copies k
 * (or v) to every head in its dtype (a local freed when the attention
 * function returns), then autocast casts the copy for the matmul (saved).
 * *rep the copy (NONE when it is the cast itself, or a view: view, then
 * only a cast copies, to every head). */
static uint32_t repeat_kv(sim *S, const vp_op *o, uint32_t in, bool v,
                          uint8_t ce, bool view, uint32_t *rep)
{
    uint64_t n = vp__mulc(S, att_kn(S, o, v), o->heads / o->kv_heads);
    uint8_t eb = S->out_eb[in];
    if (view) {
        *rep = NONE;
        if (eb == ce) {
            vp__tref(S, S->out_t[in]);
            return S->out_t[in];
        }
        return vp__talloc(S, vp__mulc(S, n, ce), VP_CAT_ACT);
    }
    *rep = vp__talloc(S, vp__mulc(S, n, eb), VP_CAT_TEMP);
    if (eb == ce) {
        vp__tref(S, *rep);
        return *rep;
    }
    return vp__talloc(S, vp__mulc(S, n, ce), VP_CAT_ACT);
}

void vp__attention_fwd(sim *S, vp__fwd_op *f)
{
    const vp_op *o = f->o;
    att_in a;
    a.ce = S->amp ? 2 : f->eb0;
    vp_attn_impl impl = vp__attention_impl(S, o, a.ce);
    bool rep = att_repeats(S, o, impl), view = repeat_view(o, impl);
    uint32_t kr = NONE, vr = NONE;
    a.q = vp__cast_input(S, f->in0, a.ce);
    a.k = a.v = NONE;
    if (rep) {
        a.k = repeat_kv(S, o, o->inputs[1], false, a.ce, view, &kr);
        a.v = repeat_kv(S, o, o->inputs[2], true, a.ce, view, &vr);
    } else if (o->n_inputs >= 3) {
        a.k = vp__cast_input(S, o->inputs[1], a.ce);
        a.v = vp__cast_input(S, o->inputs[2], a.ce);
    }
    a.bh = vp__mulc(S, o->shape[0], o->heads);
    a.on = f->n;
    uint64_t kvn = att_kn(S, o, false);
    bool copy = kv_copy(S, o) && f->mode == MODE_SAVE;
    if (copy && o->n_inputs == 3)
        cache_kv(S, o, &a, rep, view, &kr, &vr);
    else if (copy) {
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
    f->oeb = a.ce;
    f->ol = 0;
    if (impl == VP_ATTN_EAGER)
        eager_fwd(S, f, &a);
    else if (bias_math(o, impl))
        vp__attention_math_fwd(S, f, a.q, a.k != NONE ? a.k : a.q,
                               a.v != NONE ? a.v : a.q, copy, a.ce);
    else if (impl == VP_ATTN_MATH)
        math_fwd(S, f, &a);
    else if (o->cp > 1) /* Megatron's context parallelism */
        vp__attention_cp_fwd(S, f, a.q, att_qn(S, o), kvn, a.bh, a.ce,
                             output_kept(S, f->i));
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
    vp__tunref(S, kr);
    vp__tunref(S, vr);
}

/* ---- backward ---------------------------------------------------------------- */

/* The sizes of one attention backward. */
typedef struct {
    uint8_t ce;
    vp_attn_impl impl;
    uint64_t bh, qn, kvn; /* batch x heads; elements of q, of k (or v)  */
    uint64_t vn, on;      /* elements of v, of the output                */
    uint32_t dq, dk, dv;  /* the gradients made                          */
    uint8_t kge;          /* bytes per element of dk, dv                 */
} att_grads;

/* repeat_kv's backward (eager, fewer KV heads): the per-head grad (ce)
 * cast back to the copy's dtype (ToCopyBackward), then summed over the
 * heads sharing it. */
static uint32_t unrepeat_kv(sim *S, const vp_op *o, uint32_t g, uint64_t kn,
                            uint8_t ce, uint8_t eb)
{
    uint64_t n = vp__mulc(S, kn, o->heads / o->kv_heads);
    if (eb != ce) {
        uint32_t c = vp__talloc(S, vp__mulc(S, n, eb), VP_CAT_TEMP);
        vp__tunref(S, g);
        g = c;
    }
    uint32_t r = vp__talloc(S, vp__mulc(S, kn, eb), VP_CAT_TEMP);
    vp__tunref(S, g);
    return r;
}

/* The backward of the soft-capping: * cap, tanh, / cap (one new grad
 * each); the saved tanh is dropped. ga is replaced. */
static uint32_t softcap_bwd(sim *S, uint32_t i, uint64_t bytes, uint32_t ga)
{
    for (int k = 0; k < 3; k++) {
        uint32_t n = vp__talloc(S, bytes, VP_CAT_TEMP);
        vp__tunref(S, ga);
        ga = n;
        if (k == 1)
            vp__drop_saved(S, i, ATT_TANH);
    }
    return ga;
}

/* Its backward, node by node: the output's cast back, probs @ v (its
 * grad_out copied contiguous: it comes back through HF's transpose), the
 * dropout, _safe_softmax, q @ k^T, the scalings, the repeats summed back
 * (v's node, then k's), the upcasts; d->dq, dk, dv in the input dtype. */
static void math_bwd(sim *S, vp__bwd_op *b, att_grads *d)
{
    const vp_op *o = b->o;
    uint32_t i = b->i;
    uint8_t ce = d->ce;
    uint64_t sc = vp__mulc(S, vp__mulc(S, d->bh, o->q_len), o->kv_len);
    bool gqa = sdpa_gqa(o), up = ce != 4;
    uint32_t g = b->gy;
    b->gy = NONE;
    if (up) {
        uint32_t c = vp__talloc(S, vp__mulc(S, d->qn, 4), VP_CAT_TEMP);
        vp__tunref(S, g);
        g = c;
    }
    uint32_t gc = vp__talloc(S, vp__mulc(S, d->qn, 4), VP_CAT_TEMP);
    vp__tunref(S, g);
    uint32_t gp = vp__talloc(S, vp__mulc(S, sc, 4), VP_CAT_TEMP);
    uint32_t gv = vp__talloc(S, vp__mulc(S, d->qn, 4), VP_CAT_TEMP);
    vp__tunref(S, gc);
    vp__drop_saved(S, i, ATT_V);
    if (o->dropout > 0) {
        uint32_t c = vp__talloc(S, vp__mulc(S, sc, 4), VP_CAT_TEMP);
        vp__tunref(S, gp);
        gp = c;
        vp__drop_saved(S, i, ATT_MASK);
        vp__drop_saved(S, i, ATT_DROPPED);
    }
    uint32_t ga = vp__talloc(S, vp__mulc(S, sc, 4), VP_CAT_TEMP);
    vp__tunref(S, gp);
    vp__drop_saved(S, i, ATT_PROBS);
    uint32_t gq = vp__talloc(S, vp__mulc(S, d->qn, 4), VP_CAT_TEMP);
    uint32_t gk = vp__talloc(S, vp__mulc(S, d->qn, 4), VP_CAT_TEMP);
    vp__tunref(S, ga);
    vp__drop_saved(S, i, ATT_Q);
    vp__drop_saved(S, i, ATT_K);
    uint32_t c = vp__talloc(S, vp__mulc(S, d->qn, 4), VP_CAT_TEMP);
    vp__tunref(S, gk);
    gk = c;
    uint32_t *gs[3] = {&gv, &gk, &gq};
    uint64_t n[3] = {d->kvn, d->kvn, d->qn};
    for (int k = 0; k < 3; k++) { /* repeats (v, k), q's scaling, upcasts */
        if (k < 2 && !gqa && !up)
            continue;
        uint64_t e = k == 2 ? d->qn : gqa ? n[k] : d->qn;
        uint32_t t = vp__talloc(S, vp__mulc(S, e, 4), VP_CAT_TEMP);
        vp__tunref(S, *gs[k]);
        *gs[k] = t;
        if (up) {
            uint32_t h = vp__talloc(S, vp__mulc(S, e, ce), VP_CAT_TEMP);
            vp__tunref(S, *gs[k]);
            *gs[k] = h;
        }
    }
    d->dq = gq;
    d->dk = gk;
    d->dv = gv;
}

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
    uint8_t se = softmax_es(S, o, me);
    bool rep = o->n_inputs == 3 && o->kv_heads < o->heads;
    uint64_t r = rep ? o->heads / o->kv_heads : 1;
    uint32_t t = vp__talloc(S, vp__mulc(S, d->on, ce), VP_CAT_TEMP);
    vp__tunref(S, b->gy);
    b->gy = NONE;
    d->dv = vp__talloc(S, vp__mulc(S, vp__mulc(S, d->vn, r), ce),
                       VP_CAT_TEMP);
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
    if (o->softcap > 0)
        ga = softcap_bwd(S, i, vp__mulc(S, sc, ce), ga);
    uint32_t g6 = vp__talloc(S, vp__mulc(S, sc, ce), VP_CAT_TEMP);
    vp__tunref(S, ga);
    d->dq = vp__talloc(S, vp__mulc(S, d->qn, ce), VP_CAT_TEMP);
    d->dk = vp__talloc(S, vp__mulc(S, vp__mulc(S, d->kvn, r), ce),
                       VP_CAT_TEMP);
    vp__tunref(S, g6);
    vp__drop_saved(S, i, ATT_Q);
    vp__drop_saved(S, i, ATT_K);
    if (rep) {
        d->kge = S->out_eb[o->inputs[1]];
        d->dk = unrepeat_kv(S, o, d->dk, d->kvn, ce, d->kge);
        d->dv = unrepeat_kv(S, o, d->dv, d->vn, ce, d->kge);
    }
}

/* The fused kernels' own scratch after dq, dk, dv: their fp32
 * workspace. */
static void kernel_bwd_scratch(sim *S, const vp_op *o, const att_grads *d)
{
    if (d->impl == VP_ATTN_FLASH || d->impl == VP_ATTN_EFFICIENT) {
        uint64_t ws = vp__mulc(S, d->qn, 4);
        ws += vp__mulc(S, vp__mulc(S, d->bh, o->q_len), 4) + FUSED_SCRATCH;
        vp__transient(S, ws);
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
    d.kvn = att_kn(S, o, false);
    d.vn = att_kn(S, o, true);
    d.on = b->n;
    d.kge = d.ce;
    d.impl = vp__attention_impl(S, o, d.ce);
    bool math = bias_math(o, d.impl); /* attention_math.c */
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
    } else if (d.impl == VP_ATTN_MATH) {
        math_bwd(S, b, &d);
    } else if (o->cp > 1) {
        vp__attention_cp_bwd(S, o, d.qn, d.kvn, d.ce, &d.dq, &d.dk, &d.dv);
    } else {
        uint64_t r = att_repeats(S, o, d.impl) ? o->heads / o->kv_heads : 1;
        d.dq = vp__talloc(S, vp__mulc(S, d.qn, d.ce), VP_CAT_TEMP);
        d.dk = vp__talloc(S, vp__mulc(S, vp__mulc(S, d.kvn, r), d.ce),
                          VP_CAT_TEMP);
        d.dv = vp__talloc(S, vp__mulc(S, vp__mulc(S, d.vn, r), d.ce),
                          VP_CAT_TEMP);
        if (r > 1) {
            d.kge = S->out_eb[o->inputs[1]];
            d.dk = unrepeat_kv(S, o, d.dk, d.kvn, d.ce, d.kge);
            d.dv = unrepeat_kv(S, o, d.dv, d.vn, d.ce, d.kge);
        }
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
        uint8_t ve = d.kge;
        if (kv_copy(S, o) && o->n_inputs == 3) { /* ToCopy: the cache's v */
            ve = vp__promote(S->out_eb[o->inputs[1]],
                             S->out_eb[o->inputs[2]]);
            if (ve != d.kge) {
                uint32_t c = vp__talloc(S, vp__mulc(S, d.vn, ve),
                                        VP_CAT_TEMP);
                vp__tunref(S, d.dv);
                d.dv = c;
            }
        }
        /* math's grads are [B, h, L, d], and so are k's and v's through
         * a bias-carrying attention's cache copies (T5): the projections'
         * views copy them */
        bool kvs = math || (kv_copy(S, o) && o->n_inputs >= 4);
        vp__give_grad_l(S, o->inputs[0], d.dq, d.ce, math);
        vp__give_grad_l(S, o->inputs[1], d.dk, d.kge, kvs);
        vp__give_grad_l(S, o->inputs[2], d.dv, ve, kvs);
    }
}
