/* The step-time model: a roofline per op, with each op's memory traffic
 * taken from the simulator (the bytes it allocates are the bytes it
 * writes; it reads about as much) and one kernel launch per allocation. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

double vp_hw_matmul_rate(const vp_hw *hw, vp_precision p)
{
    switch (p) {
    case VP_PREC_FP32:
        return hw->fp32;
    case VP_PREC_AMP_BF16:
    case VP_PREC_BF16:
        return hw->bf16;
    case VP_PREC_AMP_FP16:
    case VP_PREC_FP16:
        return hw->fp16;
    default:
        return 0.0;
    }
}

void vp_hw_fill_defaults(vp_hw *hw)
{
    if (hw->f_half <= 0.0) {
        hw->f_half = VP_HW_DEFAULT_F_HALF;
        if (hw->eff_max <= 0.0 || hw->eff_max >= 1.0)
            hw->eff_max = VP_HW_DEFAULT_EFF_MAX;
    }
    if (hw->mem_eff <= 0.0 || hw->mem_eff >= 1.0)
        hw->mem_eff = VP_HW_DEFAULT_MEM_EFF;
}

static bool is_matmul(vp_op_kind k)
{
    return k == VP_OP_LINEAR || k == VP_OP_CONV2D || k == VP_OP_ATTENTION;
}

/* Seconds for `flops` of matrix work at `rate`. */
static double gemm_time(const vp_hw *hw, double flops, double rate)
{
    if (flops <= 0.0)
        return 0.0;
    double eff = hw->eff_max * flops / (flops + hw->f_half);
    if (eff <= 1e-3)
        eff = 1e-3;
    return flops / (rate * eff);
}

typedef struct {
    double bytes[2];   /* written in forward, backward (step 2)            */
    double kernels[2];
} op_traffic;

typedef struct {
    const vp_graph *g;
    const char **names; /* sorted op name pointers                        */
    uint32_t *index;
    op_traffic *t;
    double opt_bytes, opt_kernels;
    uint32_t step;
} tctx;

static int ptr_cmp(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t) * (const char *const *)a;
    uintptr_t y = (uintptr_t) * (const char *const *)b;
    return (x > y) - (x < y);
}

static void on_event(const vp_sim_event *ev, void *ud)
{
    tctx *c = ud;
    if (ev->is_free || ev->step != c->step)
        return;
    if (ev->phase == VP_PHASE_OPTIMIZER) {
        c->opt_bytes += (double)ev->bytes;
        c->opt_kernels += 1.0;
        return;
    }
    if (ev->phase != VP_PHASE_FORWARD && ev->phase != VP_PHASE_BACKWARD)
        return;
    /* find the op by its name pointer */
    size_t lo = 0, hi = c->g->n_ops;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if ((uintptr_t)c->names[mid] < (uintptr_t)ev->op)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo >= c->g->n_ops || c->names[lo] != ev->op)
        return; /* batch, loss seed: not an op */
    int ph = ev->phase == VP_PHASE_FORWARD ? 0 : 1;
    c->t[c->index[lo]].bytes[ph] += (double)ev->bytes;
    c->t[c->index[lo]].kernels[ph] += 1.0;
}

vp_status vp_step_time_estimate(const vp_graph *g, const vp_setup *s,
                                const vp_hw *hw, vp_step_time *out,
                                vp_error *err)
{
    memset(out, 0, sizeof *out);
    double rate = vp_hw_matmul_rate(hw, s->precision);
    if (rate <= 0.0 || hw->hbm <= 0.0)
        return vp_error_set(err, VP_EARG,
                            "the GPU profile '%s' has no %s rate or no "
                            "memory bandwidth",
                            hw->name, vp_precision_name(s->precision));
    /* cuDNN convolutions (NCHW) run far from the GEMM rates, at a flat
     * share of the fp32 peak */
    double conv_rate = VP_CONV_FP32_SHARE * hw->fp32;
    if (conv_rate <= 0.0 || conv_rate > rate)
        conv_rate = rate;
    size_t n = g->n_ops ? g->n_ops : 1;
    tctx c = {g, malloc(n * sizeof(char *)), malloc(n * sizeof(uint32_t)),
              calloc(n, sizeof(op_traffic)), 0, 0, 2};
    if (!c.names || !c.index || !c.t) {
        free(c.names);
        free(c.index);
        free(c.t);
        return vp_error_set(err, VP_ENOMEM, "out of memory");
    }
    /* sort the name pointers with their indices */
    typedef struct {
        const char *p;
        uint32_t i;
    } pi;
    pi *tmp = malloc(n * sizeof *tmp);
    if (!tmp) {
        free(c.names);
        free(c.index);
        free(c.t);
        return vp_error_set(err, VP_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < g->n_ops; i++)
        tmp[i] = (pi){g->ops[i].name, (uint32_t)i};
    qsort(tmp, g->n_ops, sizeof *tmp, ptr_cmp);
    for (size_t i = 0; i < g->n_ops; i++) {
        c.names[i] = tmp[i].p;
        c.index[i] = tmp[i].i;
    }
    free(tmp);
    vp_setup s2 = *s;
    s2.steps = 2;
    s2.skip_breakdown = true;
    s2.alloc.limit = 0;
    s2.alloc.device_total = 0;
    vp_estimate e;
    vp_status st = vp_simulate(g, &s2, &e, on_event, &c, err);
    if (st != VP_OK)
        goto done;
    double bw = hw->hbm * hw->mem_eff;
    /* a kernel costs at least PyTorch's eager dispatch */
    double launch = hw->launch > VP_EAGER_OP_OVERHEAD ? hw->launch
                                                      : VP_EAGER_OP_OVERHEAD;
    double fwd = 0, bwd = 0, rec = 0, flops = 0;
    uint32_t mb = s->inference ? 1 : s->accum;
    for (size_t i = 0; i < g->n_ops; i++) {
        const vp_op *o = &g->ops[i];
        const op_traffic *t = &c.t[i];
        double r = o->kind == VP_OP_CONV2D ? conv_rate : rate;
        double gf, gb;
        if (o->kind == VP_OP_CONV2D) {
            gf = o->flops_fwd / r;
            gb = s->inference ? 0 : o->flops_bwd / r;
        } else {
            gf = is_matmul(o->kind) ? gemm_time(hw, o->flops_fwd, r) : 0;
            gb = is_matmul(o->kind) && !s->inference
                     ? gemm_time(hw, o->flops_bwd, r)
                     : 0;
        }
        /* per micro-batch: traffic was recorded for all of them */
        double mf = 2.0 * t->bytes[0] / mb / bw;
        double mbk = 2.0 * t->bytes[1] / mb / bw;
        double f = (gf > mf ? gf : mf) + t->kernels[0] / mb * launch;
        double b = (gb > mbk ? gb : mbk) + t->kernels[1] / mb * launch;
        fwd += f;
        flops += o->flops_fwd;
        if (!s->inference) {
            bwd += b;
            flops += o->flops_bwd;
            if (o->segment >= 0 && s->checkpoint &&
                (size_t)o->segment < s->n_checkpoint &&
                s->checkpoint[o->segment])
                rec += gf; /* recompute's traffic is in the backward's */
        }
    }
    out->forward = fwd * mb;
    out->backward = bwd * mb;
    out->recompute = rec * mb;
    out->flops = flops * mb;
    if (!s->inference && s->optimizer != VP_OPT_NONE) {
        /* the state is read and written whatever is allocated */
        uint64_t params = 0;
        for (size_t p = 0; p < g->n_params; p++)
            if (g->params[p].trainable)
                params += g->params[p].numel;
        double per = 4.0 * 7.0; /* AdamW: read p g m v, write p m v */
        if (s->optimizer == VP_OPT_SGD)
            per = 4.0 * 4.0;
        else if (s->optimizer == VP_OPT_SGD_PLAIN)
            per = 4.0 * 3.0;
        else if (s->optimizer == VP_OPT_ADAMW_8BIT)
            per = 4.0 * 3.0 + 4.0;
        if (s->precision == VP_PREC_BF16 || s->precision == VP_PREC_FP16)
            per /= 2.0;
        out->optimizer = ((double)params * per + c.opt_bytes) / bw +
                         c.opt_kernels * launch;
        if (s->optimizer == VP_OPT_ADAMW_FORLOOP ||
            s->optimizer == VP_OPT_ADAMW_8BIT)
            out->optimizer += (double)g->n_params * 4.0 * launch;
    }
    /* offloads: what crosses the host link, not overlapped with compute
     * (conservative), and the CPU optimizer's own pass */
    if (e.host_traffic && hw->host > 0)
        out->offload = (double)e.host_traffic / hw->host;
    if (s->offload_optimizer && !s->inference) {
        uint64_t params = 0;
        for (size_t p = 0; p < g->n_params; p++)
            if (g->params[p].trainable)
                params += g->params[p].numel;
        out->offload += (double)params * 16.0 / VP_HOST_ADAM_BW;
        out->optimizer = 0.0;
    }
    out->total = out->forward + out->backward + out->recompute +
                 out->optimizer + out->offload;
    out->mfu = out->total > 0 ? out->flops / (out->total * rate) : 0.0;
done:
    free(c.names);
    free(c.index);
    free(c.t);
    return st;
}
