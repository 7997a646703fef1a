/* Mixture-of-experts layers as transformers 5.x builds them (Mixtral,
 * Qwen2-MoE, Qwen3-MoE, DeepSeek-V3): the router (gate), the routed
 * experts held as two stacked parameters (gate_up_proj [E, 2I, H],
 * down_proj [E, H, I]) and run as one grouped GEMM each over the tokens
 * sorted by expert (integrations/moe.py, grouped_mm_experts_forward; the
 * default experts implementation on a GPU with torch._grouped_mm), then
 * the shared experts. The experts' sizes depend only on tokens x top_k,
 * not on how the router spreads them (docs/SIMULATION_NOTES.md §12). */
#include <math.h>
#include <stdio.h>

#include "graph_tf.h"

#define NO_ROUTE UINT32_MAX

bool vp__tf_layer_moe(const vp_tf *t, uint64_t l)
{
    const vp_tf_ext *x = &t->x;
    if (!t->experts || l < x->dense_layers)
        return false;
    return x->moe_every <= 1 || (l + 1) % x->moe_every == 0;
}

/* The router: gate logits [tokens, E], then the top-k weights [tokens,
 * k] (modeling_<family>.py: Qwen3MoeTopKRouter, DeepseekV3TopkRouter). */
static vp_status router(vp__tb *c, uint32_t x, uint64_t tokens,
                        uint32_t *route)
{
    const vp_tf *t = c->t;
    uint32_t logits;
    VP_TRY(vp__tb_linear(c, x, "mlp.gate", t->experts, false, &logits));
    vp_op o;
    vp__tb_op(&o, VP_OP_ROUTER);
    o.n_inputs = 1;
    o.inputs[0] = logits;
    vp__tb_shape(&o, 2, tokens, t->top_k, 0, 0);
    o.classes = t->experts;
    o.top_k = (uint32_t)t->top_k;
    if (t->x.norm_topk)
        o.flags |= VP_OPF_NORM_TOPK;
    if (t->x.router == VP_ROUTER_SIGMOID_GROUP) {
        c->g->ops[logits].flags |= VP_OPF_FP32_LINEAR;
        o.flags |= VP_OPF_ROUTER_GROUP;
        o.rows = t->x.n_group;
    }
    return vp__tb_push(c, &o, "mlp.route", route);
}

/* The routed experts: the tokens gathered in expert order, gate_up, the
 * gated activation, down, the routing weights, back to token order and
 * summed over the k experts of each token. */
static vp_status experts(vp__tb *c, uint32_t x, uint32_t route,
                         uint32_t *out)
{
    const vp_tf *t = c->t;
    const vp_op *xo = &c->g->ops[x];
    uint64_t gu, dn;
    if (!vp_mul_u64(t->experts, 2 * t->expert_ffn, &gu) ||
        !vp_mul_u64(gu, t->hidden, &gu) ||
        !vp_mul_u64(t->experts, t->expert_ffn, &dn) ||
        !vp_mul_u64(dn, t->hidden, &dn))
        return vp__tb_overflow(c, "the experts' weights");
    vp_op o;
    vp__tb_op(&o, VP_OP_MOE_EXPERTS);
    o.n_inputs = 2;
    o.inputs[0] = x;
    o.inputs[1] = route;
    o.ndim = xo->ndim;
    for (uint32_t i = 0; i < xo->ndim; i++)
        o.shape[i] = xo->shape[i];
    o.classes = t->experts;
    o.top_k = (uint32_t)t->top_k;
    o.in_features = t->hidden;
    o.out_features = t->expert_ffn;
    VP_TRY(vp__tb_named(c, &o, "mlp.experts"));
    VP_TRY(vp__tb_param(c, &o, "gate_up_proj", gu));
    VP_TRY(vp__tb_param(c, &o, "down_proj", dn));
    return vp__tb_push(c, &o, "mlp.experts", out);
}

/* The shared experts' MLP on the layer's input (one MLP of their summed
 * inner size). */
static vp_status shared_mlp(vp__tb *c, uint32_t x, uint32_t *out)
{
    const vp_tf *t = c->t;
    uint64_t f = t->x.shared_ffn;
    if (!f && !vp_mul_u64(t->shared_experts, t->expert_ffn, &f))
        return vp__tb_overflow(c, "the shared experts");
    return vp__tb_mlp(c, x, f, "mlp.shared_expert.", out);
}

/* Megatron-Core's MoE layer (megatron/core/transformer/moe/moe_layer.py,
 * MoELayer.forward): TopKRouter on the rank's own tokens (router.py; its
 * gating linear is replicated over the tensor-parallel ranks: no
 * sequence-parallel gather), then MoEAlltoAllTokenDispatcher
 * (token_dispatcher.py) and the local experts' grouped MLP (experts.py,
 * TEGroupedMLP), one op (vp__meg_experts_fwd). Balanced routing: each of
 * the experts / ep local experts receives tokens x top_k / experts rows
 * from each expert-parallel rank, times the tensor-parallel ranks whose
 * tokens the dispatcher gathers (the expert tensor parallelism is the
 * tensor parallelism, arguments.py's default; Megatron requires sequence
 * parallelism with MoE and tp > 1), times the load the planner assumes
 * for the busiest rank (tf.moe_load, vp_moe_load: the imbalance, or the
 * capacity factor's padding). */
static vp_status meg_moe(vp__tb *c, uint32_t x, uint64_t tokens,
                         uint32_t *out)
{
    const vp_tf *t = c->t;
    uint32_t ep = t->ep > 1 ? t->ep : 1, etp = t->sp > 1 ? t->sp : 1;
    double load = t->moe_load > 1 ? t->moe_load : 1.0;
    uint32_t logits, route;
    c->local = true;
    vp_status st = vp__tb_linear(c, x, "mlp.router", t->experts, false,
                                 &logits);
    c->local = false;
    VP_TRY(st);
    vp_op o;
    vp__tb_op(&o, VP_OP_ROUTER);
    o.n_inputs = 1;
    o.inputs[0] = logits;
    vp__tb_shape(&o, 2, tokens, t->experts, 0, 0); /* the dense probs */
    o.classes = t->experts;
    o.top_k = (uint32_t)t->top_k;
    o.flags |= VP_OPF_MEGATRON;
    if (t->x.router == VP_ROUTER_SIGMOID_GROUP)
        o.flags |= VP_OPF_ROUTER_GROUP;
    VP_TRY(vp__tb_push(c, &o, "mlp.route", &route));
    uint64_t local = t->experts / ep, gu, dn, rows;
    /* tokens x top_k <= 2^52 (check_sizes), etp <= 4096, load <= ep */
    rows = (uint64_t)ceil((double)(tokens * t->top_k) * etp * load);
    if (!vp_mul_u64(local, 2 * t->expert_ffn, &gu) ||
        !vp_mul_u64(gu, t->hidden, &gu) ||
        !vp_mul_u64(local, t->expert_ffn, &dn) ||
        !vp_mul_u64(dn, t->hidden, &dn))
        return vp__tb_overflow(c, "the experts' weights");
    vp__tb_op(&o, VP_OP_MOE_EXPERTS);
    o.n_inputs = 2;
    o.inputs[0] = x;
    o.inputs[1] = route;
    const vp_op *xo = &c->g->ops[x];
    o.ndim = xo->ndim;
    for (uint32_t i = 0; i < xo->ndim; i++)
        o.shape[i] = xo->shape[i];
    o.classes = local;
    o.top_k = (uint32_t)t->top_k;
    o.in_features = t->hidden;
    o.out_features = t->expert_ffn;
    o.rows = rows;
    o.heads = etp;
    o.flags |= VP_OPF_MEGATRON;
    VP_TRY(vp__tb_named(c, &o, "mlp.experts"));
    VP_TRY(vp__tb_param(c, &o, "linear_fc1.weight", gu));
    VP_TRY(vp__tb_param(c, &o, "linear_fc2.weight", dn));
    VP_TRY(vp__tb_push(c, &o, "mlp.experts", out));
    /* the dispatcher keeps the routing map until the layer's unpermute */
    c->g->ops[route].hold_until = *out;
    return VP_OK;
}

/* Qwen2MoeSparseMoeBlock.forward: the shared expert first, then the
 * router and the experts, then sigmoid(shared_expert_gate(x)) scales the
 * shared output, added to the experts'. DeepseekV3MoE.forward: the router
 * and the experts, then the shared experts on the block's input. */
vp_status vp__tb_moe(vp__tb *c, uint32_t x, uint32_t *out)
{
    const vp_tf *t = c->t;
    const vp_op *xo = &c->g->ops[x];
    uint64_t tokens = xo->shape[0] * xo->shape[1]; /* numel / hidden */
    uint32_t route = NO_ROUTE, y, s = 0, g;
    if (t->megatron) {
        /* MoELayer.forward: the routed experts, then the shared experts
         * (shared_experts.py, SharedExpertMLP: a Megatron MLP, scaled by
         * the sigmoid gate with moe_shared_expert_gate) on the layer's
         * input, added to the routed output */
        VP_TRY(meg_moe(c, x, tokens, &y));
    } else {
        if (t->x.shared_gate)
            VP_TRY(shared_mlp(c, x, &s));
        VP_TRY(router(c, x, tokens, &route));
        VP_TRY(experts(c, x, route, &y));
    }
    if (!t->shared_experts) {
        *out = y;
        return VP_OK;
    }
    if (t->megatron || !t->x.shared_gate)
        VP_TRY(shared_mlp(c, x, &s));
    if (t->x.shared_gate) {
        VP_TRY(vp__tb_linear(c, x, "mlp.shared_expert_gate", 1, false, &g));
        VP_TRY(vp__tb_unary(c, VP_OP_SIGMOID, g, "mlp.shared_gate_act", &g));
        VP_TRY(vp__tb_binary(c, VP_OP_MUL, s, g, "mlp.shared_scale", &s));
    }
    VP_TRY(vp__tb_binary(c, VP_OP_ADD, y, s, "mlp.shared_add", out));
    /* DeepseekV3MoE.forward keeps router_logits, topk_indices and
     * topk_weights in locals until it returns (traced: deepseek-v3-small
     * generate(), live at the experts' peak) */
    if (route != NO_ROUTE && t->x.router == VP_ROUTER_SIGMOID_GROUP) {
        c->g->ops[c->g->ops[route].inputs[0]].hold_until = *out;
        c->g->ops[route].hold_until = *out;
    }
    return VP_OK;
}
