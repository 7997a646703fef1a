/* Op rules: the concatenations of multi-head latent attention
 * (transformers 5.x modeling_deepseek_v3.py, DeepseekV3Attention; traced:
 * groundtruth/traces/deepseek-v3-small-amp-bf16-b1-s512). q is
 * cat(q_pass, q_rot) in the promoted dtype (fp32 under autocast: the
 * rotary part is fp32); k is the expanded k part and the shared rotary key
 * in kv_b_proj's dtype. Neither saves anything. The first input is the
 * projection whose slices they read (q_b_proj's or kv_b_proj's output),
 * the second the rotary part. */
#include "../sim_internal.h"

void vp__mla_q_fwd(sim *S, vp__fwd_op *f)
{
    f->oeb = vp__promote(f->eb0, S->out_eb[f->o->inputs[1]]);
    f->ol = 0;
    f->out = vp__talloc(S, vp__mulc(S, f->n, f->oeb), VP_CAT_ACT);
}

void vp__mla_k_fwd(sim *S, vp__fwd_op *f)
{
    f->ol = 0;
    f->out = vp__talloc(S, vp__mulc(S, f->n, f->eb0), VP_CAT_ACT);
}

/* cat's backward hands each part a narrow view of the gradient; a part of
 * another dtype gets a cast copy; the projection's slice backward fills a
 * zero tensor like the projection's output. The rotary key of k is
 * summed over the heads. */
void vp__mla_cat_bwd(sim *S, vp__bwd_op *b)
{
    const vp_op *o = b->o;
    uint32_t r = o->inputs[1];
    if (S->g->ops[r].needs_grad) {
        if (o->kind == VP_OP_MLA_K) {
            vp__give_grad(S, r, vp__grad_like(S, r, b->oeb), b->oeb);
        } else {
            vp__tref(S, b->gy);
            vp__give_grad(S, r, b->gy, b->oeb);
        }
    }
    if (!b->ig0)
        return;
    if (b->eb0 != b->oeb) /* the pass part cast back */
        vp__transient(S, vp__mulc(S, b->n, b->eb0));
    b->gx = vp__grad_like(S, b->in0, b->eb0);
}
