/* Megatron-LM's data-parallel wrapper and optimizer, one rank: the
 * contiguous fp32 gradient buffer of its DistributedDataParallel (each
 * parameter's `main_grad` a view of it), the backward post-hook that adds
 * each gradient into it and frees `.grad`, and the fp32 main parameters
 * and Adam states, whole (Float16OptimizerWithFloat16Params) or sharded
 * over the data-parallel ranks (DistributedOptimizer). Sources
 * (NVIDIA/Megatron-LM, megatron/core), docs/DISTRIBUTED.md "Megatron-LM":
 *   distributed/distributed_data_parallel.py  DistributedDataParallel.
 *       __init__ (the buffers), _make_backward_post_hook
 *   distributed/param_and_grad_buffer.py      _ParamAndGradBuffer.__init__
 *       (grad_data in fp32 with grad_reduce_in_fp32 / --accumulate-
 *       allreduce-grads-in-fp32; param_data only with the distributed
 *       optimizer: the bf16 parameters moved into one buffer)
 *   optimizer/distrib_optimizer.py            _build_model_and_main_param_
 *       groups (shard_model_param.clone().float() per local shard)
 *   optimizer/optimizer.py                    Float16OptimizerWithFloat16
 *       Params (main_param = param.detach().clone().float();
 *       _copy_model_grads_to_main_grads)
 *   training/arguments.py                     bf16 sets accumulate_allreduce_
 *       grads_in_fp32 (fp8: Megatron-Bridge's grad_reduce_in_fp32 False,
 *       a bf16 buffer)
 * The fused Adam (Apex / Transformer Engine FusedAdam) steps in place:
 * its two moments, fp32, made at the first step; no temporaries.
 * --optimizer-cpu-offload (vp_dist.cpu_offload; optimizer/cpu_offloading/
 * hybrid_optimizer.py, HybridDeviceOptimizer with offload_fraction 1 and
 * param_update_in_fp32): each shard of the bf16 parameters is cloned to
 * pinned host memory and to fp32 there, its gradient copied to the host,
 * stepped by the CPU Adam and copied back into the device parameter: on
 * the device the parameters and the gradient buffer only. */
#include <stdlib.h>

#include "dist_internal.h"

typedef struct {
    uint64_t numel;  /* trainable elements of the rank (its stage)       */
    uint64_t expert; /* of them, the routed experts' (their own buffer)  */
    uint64_t shard;  /* elements its optimizer steps                     */
    bool on;         /* the optimizer's one tensor is stepped            */
    uint8_t grad_eb; /* the gradient buffer's bytes per element          */
    uint32_t buf;    /* the gradient buffer                              */
    uint32_t main;   /* fp16: the fp32 main gradients of a step           */
} meg;

/* The routed experts' elements: the parameters of the VP_OP_MOE_EXPERTS
 * ops (Megatron's MoE layer, graph_moe.c: TEGroupedMLP's weights,
 * allreduce=False), each once. */
static bool expert_numel(const vp_graph *g, uint64_t *out)
{
    *out = 0;
    for (size_t i = 0; i < g->n_ops; i++) {
        const vp_op *o = &g->ops[i];
        if (o->kind != VP_OP_MOE_EXPERTS || !(o->flags & VP_OPF_MEGATRON))
            continue;
        for (uint32_t j = 0; j < o->n_params; j++)
            if (g->params[o->params[j]].trainable &&
                !vp_add_u64(*out, g->params[o->params[j]].numel, out))
                return false;
    }
    return true;
}

/* Whether the module has Transformer Engine fp8 linears. */
static bool fp8_linears(const vp_graph *g)
{
    for (size_t i = 0; i < g->n_ops; i++)
        if (g->ops[i].flags & VP_OPF_FP8)
            return true;
    return false;
}

static vp_status meg_init(sim *S, vp__dist *d)
{
    const vp_graph *g = S->g;
    if (S->amp)
        return vp_error_set(S->err, VP_EARG,
                            "Megatron-LM runs its module in bf16 or fp16 "
                            "(--bf16), not under autocast: use precision "
                            "bf16, fp16 or fp32");
    if (S->s->optimizer != VP_OPT_ADAMW_FUSED)
        return vp_error_set(S->err, VP_EARG,
                            "Megatron-LM's optimizer is the fused Adam "
                            "(adamw-fused)");
    meg *m = calloc(1, sizeof *m);
    if (!m)
        return vp_error_set(S->err, VP_ENOMEM, "out of memory");
    d->impl = m;
    for (uint32_t p = 0; p < g->n_params; p++)
        if (g->params[p].trainable && !vp__dist_is_buffer(g, p) &&
            !vp_add_u64(m->numel, g->params[p].numel, &m->numel))
            return vp_error_set(S->err, VP_EOVERFLOW,
                                "the parameters overflow 64 bits");
    /* the distributed optimizer's shard: each buffer split in equal parts
     * over its data-parallel group (padded to a multiple of it): the
     * dense parameters' over dp x cp, the experts' over the expert-data-
     * parallel group (DistributedDataParallel.__init__'s expert_parallel_
     * buffers, reduced over parallel_state.get_expert_data_parallel_
     * group; distrib_optimizer.py shards each buffer over its own group) */
    if (!expert_numel(g, &m->expert))
        return vp_error_set(S->err, VP_EOVERFLOW,
                            "the experts' parameters overflow 64 bits");
    uint64_t ew = d->cfg->expert_world ? d->cfg->expert_world : d->group;
    m->shard = d->cfg->strategy == VP_DIST_MEGATRON_DISTOPT
                   ? (m->numel - m->expert + d->group - 1) / d->group +
                         (m->expert + ew - 1) / ew
                   : m->numel;
    m->on = true;
    m->buf = m->main = NONE;
    /* arguments.py: bf16 forces accumulate_allreduce_grads_in_fp32; fp16
     * keeps the buffer in fp16 (the flag's default); fp8 is Megatron-
     * Bridge's fp8 recipe, whose performance configs set
     * grad_reduce_in_fp32 = False (docs/CLUSTER.md "Model states") */
    m->grad_eb = S->s->precision == VP_PREC_FP16 || fp8_linears(g) ? 2 : 4;
    S->n_opt = d->cfg->cpu_offload ? 0 : 1;
    S->opt_numel = &m->shard;
    S->opt_on = &m->on;
    S->opt_eb = 4;
    return VP_OK;
}

/* DistributedDataParallel.__init__ then the optimizer's constructor: the
 * parameters converted (model.bfloat16(), before DDP wraps it); with the
 * distributed optimizer moved into one param_data buffer (each copied in,
 * the original freed); the gradient buffer; the fp32 main parameters. */
static void meg_wrap(sim *S, uint32_t *model)
{
    vp__dist *d = S->dist;
    meg *m = d->impl;
    const vp_graph *g = S->g;
    vp__model_convert(S, model);
    uint64_t pe = d->model_eb;
    if (d->cfg->strategy == VP_DIST_MEGATRON_DISTOPT && OK(S)) {
        vp__dist_alloc(S, vp__mulc(S, m->numel, pe), VP_CAT_PARAM,
                       VP_STREAM_DEFAULT, "megatron param_data");
        for (uint32_t p = 0; p < g->n_params; p++)
            if (g->params[p].trainable && !vp__dist_is_buffer(g, p))
                vp__dist_free_id(S, &model[p]);
    }
    m->buf = vp__dist_alloc(S, vp__mulc(S, m->numel, m->grad_eb), VP_CAT_GRAD,
                            VP_STREAM_DEFAULT, "megatron grad_data");
    if (pe != 4 && !d->cfg->cpu_offload)
        vp__dist_alloc(S, vp__mulc(S, m->shard, 4), VP_CAT_OPTIM,
                       VP_STREAM_DEFAULT, "megatron main params");
}

/* _make_backward_post_hook: main_grad.add_(grad); grad = None. */
static void meg_grad_ready(sim *S, uint32_t p)
{
    if (S->pgrad[p] != NONE) {
        uint32_t id = S->pgrad[p];
        S->pgrad[p] = NONE;
        vp__tunref(S, id);
    }
}

/* A 16-bit gradient buffer: _copy_model_grads_to_main_grads (optimizer.
 * py; distrib_optimizer.py for the shard) sets each fp32 main parameter's
 * .grad to main_grad.float(), a copy, dropped by the next step's
 * optimizer.zero_grad() (train_step's start). */
static void meg_opt_begin(sim *S)
{
    meg *m = S->dist->impl;
    if (m->grad_eb != 4 && !S->dist->cfg->cpu_offload)
        m->main = vp__dist_alloc(S, vp__mulc(S, m->shard, 4), VP_CAT_TEMP,
                                 VP_STREAM_DEFAULT, "megatron main grads");
}

static void meg_zero_grad(sim *S)
{
    meg *m = S->dist->impl;
    vp__dist_free_id(S, &m->main);
}

static void meg_destroy(vp__dist *d)
{
    free(d->impl);
    d->impl = NULL;
}

const vp__dist_rules vp__dist_megatron_rules = {
    .init = meg_init,
    .wrap = meg_wrap,
    .grad_ready = meg_grad_ready,
    .opt_begin = meg_opt_begin,
    .zero_grad = meg_zero_grad,
    .destroy = meg_destroy,
};
