/* Op rules: mixture of experts (HF MixtralSparseMoeBlock): the router's
 * top-k of a softmax, each expert's gather of its tokens, and the
 * weighted scatter-add of its output into the running sum.
 * transformers modeling_mixtral.py (MixtralSparseMoeBlock.forward).
 * The router's and the dispatch's backward make one gradient like their
 * first input's (vp__elementwise_bwd). */
#include "../sim_internal.h"

/* What the router saves: the fp32 routing probabilities and the chosen
 * experts (int64). */
enum { ROUTER_PROBS, ROUTER_EXPERTS };

/* softmax(router_logits, dtype=float) over the experts, then topk: the
 * fp32 probabilities of every expert, the top-k weights (the output) and
 * their indices */
void vp__router_fwd(sim *S, vp__fwd_op *f)
{
    const vp_op *o = f->o;
    uint32_t sm = vp__talloc(S, vp__mulc(S, vp__mulc(S, o->shape[0],
                                                      o->classes), 4),
                             VP_CAT_ACT);
    f->oeb = 4;
    f->out = vp__talloc(S, vp__mulc(S, f->n, 4), VP_CAT_ACT);
    uint32_t idx = vp__talloc(S, vp__mulc(S, f->n, 8), VP_CAT_ACT);
    if (f->sv) {
        vp__save(S, f->i, ROUTER_PROBS, sm);
        vp__save(S, f->i, ROUTER_EXPERTS, idx);
    }
    vp__tunref(S, sm);
    vp__tunref(S, idx);
}

/* hidden_states[top_x]: the expert's tokens, a new tensor */
void vp__moe_dispatch_fwd(sim *S, vp__fwd_op *f)
{
    f->ol = 0;
    f->out = vp__talloc(S, vp__mulc(S, f->n, f->oeb), VP_CAT_ACT);
}

/* final_hidden_states.index_add_(0, top_x, y * weight): a new sum for
 * the first expert, in place after it */
void vp__moe_combine_fwd(sim *S, vp__fwd_op *f)
{
    f->oeb = vp__promoted_eb(S, f);
    if (f->o->inplace)
        vp__alias_input(S, f);
    else
        f->out = vp__talloc(S, vp__mulc(S, f->n, f->oeb), VP_CAT_ACT);
}

/* a gradient for each operand that needs one (the running sum, the
 * expert's output, the routing weights) */
void vp__moe_combine_bwd(sim *S, vp__bwd_op *b)
{
    const vp_graph *g = S->g;
    const vp_op *o = b->o;
    for (uint32_t j = 0; j < o->n_inputs; j++) {
        uint32_t in = o->inputs[j];
        if (g->ops[in].needs_grad)
            vp__give_grad(S, in, vp__grad_like(S, in, S->out_eb[in]),
                          S->out_eb[in]);
    }
    for (uint32_t k = 0; k < o->n_params; k++)
        vp__weight_grad(S, o->params[k], false);
}
