/* Op rules: the attention core under context parallelism as Megatron-LM
 * runs it, Transformer Engine's ring over the cp ranks (AttnFuncWithCPAnd
 * KVP2P, transformer_engine/pytorch/attention/dot_product_attention/
 * context_parallel.py; megatron/core/transformer/dot_product_attention
 * hands it cp_group with --context-parallel-size). Each rank holds s/cp
 * tokens of q, k, v; k and v travel round the ring. docs/DISTRIBUTED.md
 * "Megatron-LM". */
#include "../sim_internal.h"

/* The slots ops/attention.c gives a fused kernel's saved tensors. */
enum { CP_Q, CP_KV, CP_V_UNUSED, CP_LSE, CP_OUT };

/* The largest ring simulated step by step. */
#define CP_MAX 64u

/* forward: p2p_comm_buffers[0] = cat(k, v) (a copy), then at step i <
 * cp - 1 the next buffer (empty_like) the ring receives into; each step
 * the flash kernel's out_per_step[i] and softmax_lse_per_step[i] (fp32);
 * after the first correction `out = zeros_like(q)` and the logsumexp in
 * fp64 (clone().to(double)), made fp32 at the end. Every buffer lives
 * until the function returns (the Python lists hold them); it saves q,
 * the last buffer received (kv = p2p_comm_buffers[-1]), out and the fp32
 * logsumexp. Causal steps past the rank's own run half of q (rank r >= i
 * runs all of it): the rank simulated is the last, cp - 1, the one whose
 * every step runs whole. */
void vp__attention_cp_fwd(sim *S, vp__fwd_op *f, uint32_t q, uint64_t qn,
                          uint64_t kvn, uint64_t bh, uint8_t ce,
                          bool keep_out)
{
    const vp_op *o = f->o;
    uint32_t cp = o->cp;
    if (cp > CP_MAX) {
        S->st = vp_error_set(S->err, VP_ELIMIT,
                             "context parallelism is simulated up to %u "
                             "ranks, not %u",
                             CP_MAX, cp);
        return;
    }
    uint64_t kv2 = vp__mulc(S, vp__mulc(S, kvn, 2), ce);
    uint64_t ob = vp__mulc(S, qn, ce);
    uint64_t lb = vp__mulc(S, vp__mulc(S, bh, o->q_len), 4);
    uint32_t buf[CP_MAX], out_i[CP_MAX], lse_i[CP_MAX];
    uint32_t out = NONE, lse64 = NONE;
    buf[0] = vp__talloc(S, kv2, VP_CAT_ACT);
    for (uint32_t i = 0; i < cp; i++) {
        if (i + 1 < cp)
            buf[i + 1] = vp__talloc(S, kv2, VP_CAT_ACT);
        out_i[i] = vp__talloc(S, ob, VP_CAT_ACT);
        lse_i[i] = vp__talloc(S, lb, VP_CAT_ACT);
        if (i == 1) {
            out = vp__talloc(S, ob, VP_CAT_ACT);
            lse64 = vp__talloc(S, vp__mulc(S, lb, 2), VP_CAT_ACT);
        }
    }
    uint32_t lse = vp__talloc(S, lb, VP_CAT_ACT);
    f->out = out;
    f->oeb = ce;
    if (f->sv) {
        vp__save(S, f->i, CP_Q, q);
        vp__save(S, f->i, CP_KV, buf[cp - 1]);
        vp__save(S, f->i, CP_LSE, lse);
        if (!keep_out)
            vp__save(S, f->i, CP_OUT, out);
    }
    vp__tunref(S, lse64);
    vp__tunref(S, lse);
    for (uint32_t i = 0; i < cp; i++) {
        vp__tunref(S, out_i[i]);
        vp__tunref(S, lse_i[i]);
        vp__tunref(S, buf[i]);
    }
}

/* backward: dq = empty_like(q); two ring buffers of (2, *kv.shape), each
 * a kv and its gradient dkv; each step's kernel writes its own dq_ and
 * dkv_ (empty_like), added into dq and the travelling dkv. dk and dv are
 * views of the last dkv: modelled as their own two tensors of k's size,
 * made before the ring buffers are dropped. *dq, *dk, *dv: made here. */
void vp__attention_cp_bwd(sim *S, const vp_op *o, uint64_t qn, uint64_t kvn,
                          uint8_t ce, uint32_t *dq, uint32_t *dk,
                          uint32_t *dv)
{
    uint64_t kb = vp__mulc(S, kvn, ce);
    *dq = vp__talloc(S, vp__mulc(S, qn, ce), VP_CAT_TEMP);
    uint32_t b0 = vp__talloc(S, vp__mulc(S, kb, 4), VP_CAT_TEMP);
    uint32_t b1 = vp__talloc(S, vp__mulc(S, kb, 4), VP_CAT_TEMP);
    for (uint32_t i = 0; i < o->cp && OK(S); i++) {
        uint32_t dq_ = vp__talloc(S, vp__mulc(S, qn, ce), VP_CAT_TEMP);
        uint32_t dkv_ = vp__talloc(S, vp__mulc(S, kb, 2), VP_CAT_TEMP);
        vp__tunref(S, dkv_);
        vp__tunref(S, dq_);
    }
    *dk = vp__talloc(S, kb, VP_CAT_TEMP);
    *dv = vp__talloc(S, kb, VP_CAT_TEMP);
    vp__tunref(S, b1);
    vp__tunref(S, b0);
}
