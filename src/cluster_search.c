/* Plans for clusters: the exhaustive search over the valid configurations,
 * with the model-state bound, the ranking and the reasons. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cluster_impl.h"

void vp_search_opts_init(vp_search_opts *o)
{
    memset(o, 0, sizeof *o);
    o->recompute = -1;
    o->sharding = -1;
    o->schedule = -1;
    o->sp = -1;
    o->top = 5;
}

#define MAX_DIV 256

/* Divisors of n in ascending order (at most MAX_DIV). */
static uint32_t divisors(uint64_t n, uint64_t *out)
{
    uint32_t k = 0;
    uint64_t hi[MAX_DIV];
    uint32_t nh = 0;
    for (uint64_t i = 1; i * i <= n && k < MAX_DIV / 2; i++)
        if (n % i == 0) {
            out[k++] = i;
            if (i != n / i && nh < MAX_DIV / 2)
                hi[nh++] = n / i;
        }
    while (nh > 0)
        out[k++] = hi[--nh];
    return k;
}

/* ---- ranking ------------------------------------------------------- */

typedef struct {
    vp_cluster_plan *out;
    uint32_t cap; /* best + alternatives kept */
    vp_plan_entry top[VP__VERIFY_TOP];
    uint32_t n;
    bool have_closest;
} ranking;

static bool same_family(const vp_par *a, const vp_par *b)
{
    return a->dp == b->dp && a->tp == b->tp && a->pp == b->pp &&
           a->cp == b->cp && a->ep == b->ep && a->dtype == b->dtype &&
           a->sharding == b->sharding && a->offload == b->offload;
}

/* Faster wins; at the same step time (within 1e-9), less host memory
 * (less offload), then less device memory. */
static bool better3(double t, uint64_t host, uint64_t mem, double t2,
                    uint64_t host2, uint64_t mem2)
{
    double tol = 1e-9 * (t2 > t ? t2 : t);
    if (t < t2 - tol)
        return true;
    if (t > t2 + tol)
        return false;
    return host < host2 || (host == host2 && mem < mem2);
}

static bool better(const vp_plan_entry *x, double t, uint64_t host,
                   uint64_t mem)
{
    return better3(t, host, mem, x->time.step, x->mem.host, x->mem.total);
}

static void rank_fit(ranking *r, const vp_par *p, const vp_cluster_mem *mem,
                     const vp_cluster_time *tm)
{
    double t = tm->step;
    if (r->n == r->cap &&
        !better(&r->top[r->n - 1], t, mem->host, mem->total))
        return;
    uint32_t j;
    for (j = 0; j < r->n; j++)
        if (same_family(&r->top[j].par, p))
            break;
    if (j < r->n) {
        if (!better(&r->top[j], t, mem->host, mem->total))
            return;
    } else if (r->n < r->cap) {
        j = r->n++;
    } else {
        j = r->n - 1;
    }
    vp_plan_entry *e = &r->top[j];
    e->par = *p;
    e->mem = *mem;
    e->time = *tm;
    e->fits = true;
    e->reason[0] = '\0';
    /* keep sorted: move the changed entry up */
    while (j > 0 && better(&r->top[j - 1], t, mem->host, mem->total)) {
        vp_plan_entry tmp = r->top[j - 1];
        r->top[j - 1] = r->top[j];
        r->top[j] = tmp;
        j--;
    }
}

/* ---- reasons ------------------------------------------------------- */

static void explain(vp_plan_entry *k, const vp_plan_entry *best)
{
    const vp_cluster_time *a = &k->time, *b = &best->time;
    struct {
        const char *what;
        double d;
    } parts[] = {
        {"compute", a->compute - b->compute},
        {"recomputation", a->recompute - b->recompute},
        {"tensor-parallel communication", a->tp_comm - b->tp_comm},
        {"context-parallel communication", a->cp_comm - b->cp_comm},
        {"expert all-to-alls", a->ep_comm - b->ep_comm},
        {"pipeline sends", a->pp_comm - b->pp_comm},
        {"pipeline bubble", a->bubble - b->bubble},
        {"data-parallel communication", a->dp_comm - b->dp_comm},
        {"optimizer step", a->optimizer - b->optimizer},
        {"host transfers", a->offload - b->offload},
    };
    size_t w = 0;
    for (size_t i = 1; i < sizeof parts / sizeof parts[0]; i++)
        if (parts[i].d > parts[w].d)
            w = i;
    double pct = b->step > 0 ? 100.0 * (a->step / b->step - 1.0) : 0;
    if (pct < 0.05) {
        if (k->mem.host > best->mem.host)
            snprintf(k->reason, sizeof k->reason,
                     "as fast, but needs more host RAM (%.1f GiB vs %.1f "
                     "GiB per node)",
                     (double)k->mem.host / (double)VP_GiB,
                     (double)best->mem.host / (double)VP_GiB);
        else
            snprintf(k->reason, sizeof k->reason,
                     "as fast, but needs more memory (%.2f GiB vs %.2f GiB "
                     "per GPU)",
                     (double)k->mem.total / (double)VP_GiB,
                     (double)best->mem.total / (double)VP_GiB);
        return;
    }
    snprintf(k->reason, sizeof k->reason,
             "%.1f%% slower: %s %+.3f s per step", pct, parts[w].what,
             parts[w].d);
}

/* ---- the search ---------------------------------------------------- */

typedef struct {
    vp_cluster_model *cm;
    const vp_cluster *c;
    const vp_search_opts *o;
    vp__evctx x;
    ranking r;
    vp_cluster_plan *out;
    uint64_t G;
    double closest_over;
    bool check;       /* pins that need vp_par_check on each configuration */
    vp_error perr;    /* its message: the last pin refused                 */
    uint64_t applies; /* configurations the pins apply to                  */
    vp_error *err;
} sctx;

/* How far a configuration is from fitting: the larger of its GPU and
 * host memory over the capacity. */
static double overshoot(const sctx *s, const vp_cluster_mem *m)
{
    double g = (double)m->total / (double)s->c->memory;
    double h = s->c->host_mem ? (double)m->host / (double)s->c->host_mem
                              : (m->host ? 1e30 : 0);
    return g > h ? g : h;
}

static void note_closest(sctx *s, const vp_par *p, const vp_cluster_mem *m)
{
    double o = overshoot(s, m);
    if (s->r.have_closest && o >= s->closest_over)
        return;
    s->r.have_closest = true;
    s->closest_over = o;
    s->out->closest.par = *p;
    s->out->closest.mem = *m;
    s->out->closest.fits = false;
}

static int all_schedules(const sctx *s, uint32_t pp, uint64_t m,
                         vp_engine e, vp_schedule *sched, uint32_t *vpp,
                         int cap);

static bool sched_pinned_out(const vp_search_opts *o, vp_schedule sc,
                             uint32_t v)
{
    return (o->schedule >= 0 && (int)sc != o->schedule) ||
           (o->vpp && v != o->vpp);
}

/* The schedules (with interleaving) a layout allows at m micro-batches,
 * less those the pins rule out: fills sched[] and vpp[]; returns the
 * count. */
static int schedules(const sctx *s, uint32_t pp, uint64_t m, vp_engine e,
                     vp_schedule *sched, uint32_t *vpp, int cap)
{
    vp_schedule all[64];
    uint32_t av[64];
    int n = all_schedules(s, pp, m, e, all, av, cap < 64 ? cap : 64), k = 0;
    for (int i = 0; i < n; i++)
        if (!sched_pinned_out(s->o, all[i], av[i])) {
            sched[k] = all[i];
            vpp[k++] = av[i];
        }
    return k;
}

/* Every schedule (with interleaving) a layout allows at m micro-batches. */
static int all_schedules(const sctx *s, uint32_t pp, uint64_t m,
                         vp_engine e, vp_schedule *sched, uint32_t *vpp,
                         int cap)
{
    int n = 0;
    if (pp == 1) {
        sched[0] = VP_SCHED_1F1B;
        vpp[0] = 1;
        return 1;
    }
    /* 1F1B first: GPipe takes as long and never less memory, so ties go
     * to 1F1B */
    sched[n] = VP_SCHED_1F1B;
    vpp[n++] = 1;
    if (e != VP_ENGINE_DEEPSPEED && n < cap) {
        sched[n] = VP_SCHED_GPIPE;
        vpp[n++] = 1;
    }
    /* DualPipe only when pinned: no engine vramplan exports runs it */
    if (s->o->schedule == VP_SCHED_DUALPIPE && e != VP_ENGINE_DEEPSPEED &&
        pp % 2 == 0 && m % 2 == 0 && m >= 2 * (uint64_t)pp && n < cap) {
        sched[n] = VP_SCHED_DUALPIPE;
        vpp[n++] = 1;
    }
    if (e == VP_ENGINE_DEEPSPEED || m % pp)
        return n;
    /* every stage holds at least v layers (the last the fewest) */
    uint64_t L = s->cm->L;
    uint64_t per = L / pp;
    for (uint64_t v = 2; v <= per && n < cap; v++) {
        sched[n] = VP_SCHED_INTERLEAVED;
        vpp[n++] = (uint32_t)v;
    }
    return n;
}

/* Evaluate (or count, when prune) every configuration of one layout. */
static void inner(sctx *s, vp_par *p, const vp__act *a, bool prune)
{
    uint64_t local = s->G / p->dp;
    uint64_t bs[MAX_DIV];
    uint32_t nb = divisors(local, bs);
    vp_engine e = vp_sharding_engine(p->sharding);
    int rc_lo = 0, rc_hi = VP_RC__COUNT - 1;
    if (s->o->recompute >= 0)
        rc_lo = rc_hi = s->o->recompute;
    if (s->cm->whole) /* graph-form: no recomputation (vp__whole_check) */
        rc_lo = rc_hi = VP_RC_NONE;
    for (uint32_t bi = 0; bi < nb; bi++) {
        if (s->o->micro_batch && bs[bi] != s->o->micro_batch)
            continue;
        p->micro_batch = bs[bi];
        p->accum = local / bs[bi];
        vp_schedule sch[64];
        uint32_t vpp[64];
        int ns = schedules(s, p->pp, p->accum, e, sch, vpp, 64);
        int sp_lo = 0, sp_hi = p->tp > 1 ? 1 : 0;
        if (s->o->sp >= 0)
            sp_lo = sp_hi = s->o->sp;
        int nsp = sp_hi - sp_lo + 1;
        int nrc = 0;
        for (int rc = rc_lo; rc <= rc_hi; rc++)
            nrc += !(rc == VP_RC_SELECTIVE && e == VP_ENGINE_DEEPSPEED);
        if (prune) {
            s->out->pruned += (uint64_t)ns * nsp * nrc;
            continue;
        }
        for (int si = 0; si < ns; si++) {
            p->schedule = sch[si];
            p->vpp = vpp[si];
            for (int spi = sp_lo; spi <= sp_hi; spi++) {
                p->sp = spi == 1;
                for (int rc = rc_lo; rc <= rc_hi; rc++) {
                    if (rc == VP_RC_SELECTIVE && e == VP_ENGINE_DEEPSPEED)
                        continue;
                    p->recompute = (vp_recompute)rc;
                    if (s->check && vp_par_check(s->cm, s->c, p, &s->perr)) {
                        s->out->evaluated++;
                        continue; /* a pin that does not apply */
                    }
                    s->applies++;
                    vp_cluster_mem mem;
                    vp__evaluate(&s->x, a, p, &mem, NULL);
                    s->out->evaluated++;
                    if (mem.total > s->c->memory ||
                        mem.host > s->c->host_mem) {
                        note_closest(s, p, &mem);
                        continue;
                    }
                    vp_cluster_time tm;
                    vp__evaluate(&s->x, a, p, NULL, &tm);
                    s->out->fitting++;
                    rank_fit(&s->r, p, &mem, &tm);
                }
            }
        }
    }
}

static bool engine_ok(const sctx *s, vp_engine e)
{
    bool any = false;
    for (int i = 0; i < VP_ENGINE__COUNT; i++)
        any |= s->o->engines[i];
    return !any || s->o->engines[e];
}

/* Shardings possible for a layout. */
static bool sharding_ok(const sctx *s, vp_sharding sh, const vp_par *p)
{
    if (s->o->sharding >= 0 && (int)sh != s->o->sharding)
        return false;
    vp_engine e = vp_sharding_engine(sh);
    if (!engine_ok(s, e))
        return false;
    if (p->dtype == VP_DT_FP8 && e == VP_ENGINE_DEEPSPEED)
        return false;
    if (s->cm->whole && (e == VP_ENGINE_MEGATRON || p->dtype == VP_DT_FP8))
        return false; /* vp__whole_check */
    uint32_t D = p->dp * p->cp;
    switch (e) {
    case VP_ENGINE_TORCH:
        /* DDP (with ZeroRedundancyOptimizer) alone; FSDP1 and FSDP2
         * compose with TP, PP, CP and EP (torchtitan parallelize.py:
         * apply_tp / pipelining, then apply_fsdp's fully_shard) */
        if (vp__ddp_like(sh) &&
            (p->tp > 1 || p->pp > 1 || p->cp > 1 || p->ep > 1))
            return false;
        if (vp__hybrid(sh))
            return p->dp > s->c->gpus_per_node &&
                   p->dp % s->c->gpus_per_node == 0;
        return true;
    case VP_ENGINE_DEEPSPEED:
        /* Megatron-DeepSpeed: ZeRO with tensor parallelism, its pipeline
         * engine with ZeRO-1 */
        if (p->cp > 1 || p->ep > 1)
            return false;
        return p->pp == 1 || sh == VP_SHARD_ZERO1;
    default:
        /* the distributed optimizer on one replica is Megatron's DDP */
        return sh != VP_SHARD_DISTOPT || D > 1;
    }
}

static vp_status layout(sctx *s, vp_par *p)
{
    const vp__act *act[3] = {NULL, NULL, NULL};
    for (int sh = 0; sh < VP_SHARD__COUNT; sh++) {
        if (!sharding_ok(s, (vp_sharding)sh, p))
            continue;
        p->sharding = (vp_sharding)sh;
        p->bucket_view = true; /* False only adds memory (dominated) */
        p->first_layers = s->o->first_layers;
        p->last_layers = s->o->last_layers;
        p->overlap_dp = s->o->overlap_dp;
        p->overlap_tp = s->o->overlap_tp;
        p->overlap_ep = s->o->overlap_ep;
        p->compile = s->o->compile;
        p->fp8_gather = s->o->fp8_gather;
        p->mtp = s->o->mtp;
        int cls = vp__cls_of(p);
        if (!act[cls]) {
            vp_status st = vp__act_get(s->cm, cls, p->cp, &act[cls], s->err);
            if (st != VP_OK)
                return st;
        }
        for (int of = 0; of < VP_OFFLOAD__COUNT; of++) {
            if (!vp__offload_allowed(p->sharding, (vp_offload)of))
                continue;
            if (of != VP_OFFLOAD_NONE && s->o->no_offload)
                continue;
            p->offload = (vp_offload)of;
            double host;
            double bound = vp__states_bound(&s->x, p, &host);
            /* the bound is computed in doubles and the totals are sums
             * of rounded parts: keep a margin of a few bytes */
            bool prune = bound > (double)s->c->memory + 64.0 ||
                         host > (double)s->c->host_mem + 64.0;
            if (prune && s->r.n == 0) {
                /* remember the configuration nearest to fitting, even
                 * when pruned: the least activation memory of the layout */
                vp_cluster_mem mem;
                const vp_search_opts *o = s->o;
                uint64_t local = s->G / p->dp;
                p->micro_batch = o->micro_batch && local % o->micro_batch == 0
                                     ? o->micro_batch
                                     : 1;
                p->accum = local / p->micro_batch;
                p->schedule = VP_SCHED_1F1B;
                p->vpp = 1;
                if (p->pp > 1 && o->schedule >= 0) {
                    p->schedule = (vp_schedule)o->schedule;
                    p->vpp = o->vpp ? o->vpp : 1;
                }
                p->sp = o->sp >= 0 ? o->sp == 1 && p->tp > 1 : p->tp > 1;
                p->recompute = o->recompute >= 0 ? (vp_recompute)o->recompute
                                                 : VP_RC_FULL;
                if (!s->check ||
                    vp_par_check(s->cm, s->c, p, &s->perr) == VP_OK) {
                    s->applies++;
                    vp__evaluate(&s->x, act[cls], p, &mem, NULL);
                    note_closest(s, p, &mem); /* only where the pins apply */
                }
            }
            inner(s, p, act[cls], prune);
        }
    }
    return VP_OK;
}

/* The fastest candidates (VP__VERIFY_TOP family bests) re-evaluated by
 * simulation where it models their layout (megatron.c); those that do
 * not fit then are dropped (the first of them is the closest when none
 * is left); the first `shown` are kept. */
static vp_status verify(sctx *s, uint32_t shown)
{
    ranking *r = &s->r;
    uint32_t kept = 0;
    vp_plan_entry near;
    bool dropped = false;
    for (uint32_t i = 0; i < r->n; i++) {
        vp_plan_entry e = r->top[i];
        vp_status st = vp__plan_simulate(s->cm, s->c, &e, s->err);
        if (st == VP_OK)
            st = vp__plan_simulate_ds(s->cm, s->c, &e, s->err);
        if (st == VP_OK)
            st = vp__plan_simulate_torch(s->cm, s->c, &e, s->err);
        if (st != VP_OK)
            return st;
        if (e.fits) {
            r->top[kept++] = e;
        } else if (!dropped || overshoot(s, &e.mem) < overshoot(s, &near.mem)) {
            near = e;
            dropped = true;
        }
    }
    if (kept == 0 && dropped) {
        s->out->closest = near;
        r->have_closest = true;
    }
    r->n = kept < shown ? kept : shown;
    return VP_OK;
}

/* The cluster, its GPU profile and, for a graph-form model, the options. */
static vp_status search_args_check(const vp_cluster_model *cm,
                                   const vp_cluster *c,
                                   const vp_search_opts *o, vp_error *err)
{
    if (c->gpus == 0 || c->gpus_per_node == 0)
        return vp_error_set(err, VP_EARG, "the cluster needs >= 1 GPU");
    if (c->hw.hbm <= 0)
        return vp_error_set(err, VP_EARG,
                            "the GPU profile '%s' has no memory bandwidth",
                            c->hw.name);
    return cm->whole ? vp__whole_opts_check(cm, o, err) : VP_OK;
}

/* Pins that apply to some configurations only (vp_par_check on each). */
static bool pins_need_check(const vp_search_opts *o)
{
    return o->first_layers || o->last_layers || o->overlap_dp ||
           o->overlap_tp || o->overlap_ep || o->compile || o->mtp ||
           o->fp8_gather;
}

vp_status vp_cluster_search(vp_cluster_model *cm, const vp_cluster *c,
                            const vp_search_opts *o, vp_cluster_plan *out,
                            vp_error *err)
{
    vp_error_clear(err);
    memset(out, 0, sizeof *out);
    vp_status ast = search_args_check(cm, c, o, err);
    if (ast != VP_OK)
        return ast;
    sctx s;
    memset(&s, 0, sizeof s);
    s.cm = cm;
    s.c = c;
    s.o = o;
    s.out = out;
    s.err = err;
    uint32_t sims0 = cm->sims;
    s.check = pins_need_check(o);
    s.G = o->global_batch;
    if (s.G == 0 && cm->whole) {
        /* a graph-form model: 32 samples per GPU, Goyal et al. 2017's
         * per-worker batch (ImageNet in 1 hour, section 5) */
        s.G = (uint64_t)VP_WHOLE_SAMPLES_PER_GPU * c->gpus;
    } else if (s.G == 0) {
        s.G = ((uint64_t)1 << 22) / cm->seq;
        if (s.G == 0)
            s.G = 1;
    }
    out->gpus = c->gpus;
    out->global_batch = s.G;
    s.r.out = out;
    uint32_t shown = 1 + (o->top < VP_CLUSTER_TOP ? o->top : VP_CLUSTER_TOP);
    s.r.cap = VP__VERIFY_TOP;
    vp__evctx_init(&s.x, cm, c);
    bool dts[VP_DT__COUNT], any = false;
    for (int i = 0; i < VP_DT__COUNT; i++)
        any |= o->dtypes[i];
    for (int i = 0; i < VP_DT__COUNT; i++)
        dts[i] = any ? o->dtypes[i] : false;
    if (!any) {
        /* fp16 is bf16's twin (same rates and bytes) where bf16 exists;
         * fp8 changes the numerics: both on request */
        if (c->hw.bf16 > 0)
            dts[VP_DT_BF16] = true;
        else if (c->hw.fp16 > 0)
            dts[VP_DT_FP16] = true;
        dts[VP_DT_FP32] = true;
    }
    bool some_dt = false;
    for (int i = 0; i < VP_DT__COUNT; i++) {
        dts[i] = dts[i] && vp__dtype_rate(&c->hw, (vp_dtype)i, true) > 0;
        some_dt |= dts[i];
    }
    if (!some_dt)
        return vp_error_set(err, VP_EARG,
                            "the GPU '%s' has no rate for the precisions "
                            "asked",
                            c->hw.name);
    uint64_t dv[MAX_DIV];
    uint32_t nd = divisors(c->gpus, dv);
    vp_par p;
    memset(&p, 0, sizeof p);
    uint64_t N = c->gpus;
    for (uint32_t i = 0; i < nd; i++) {
        uint32_t tp = (uint32_t)dv[i];
        if ((o->tp && tp != o->tp) || !vp__tp_valid(cm, tp))
            continue;
        for (uint32_t j = 0; j < nd; j++) {
            uint32_t cp = (uint32_t)dv[j];
            if ((o->cp && cp != o->cp) || N % ((uint64_t)tp * cp) ||
                !vp__cp_valid(cm, cp))
                continue;
            for (uint32_t k = 0; k < nd; k++) {
                uint32_t pp = (uint32_t)dv[k];
                uint64_t tcp = (uint64_t)tp * cp * pp;
                if ((o->pp && pp != o->pp) || N % tcp || pp > cm->L ||
                    (cm->whole && pp > 1)) /* vp__whole_check */
                    continue;
                uint32_t dp = (uint32_t)(N / tcp);
                if ((o->dp && dp != o->dp) || s.G % dp)
                    continue;
                uint64_t eps[MAX_DIV];
                uint32_t ne = cm->experts ? divisors(dp, eps) : 1;
                if (!cm->experts)
                    eps[0] = 1;
                for (uint32_t q = 0; q < ne; q++) {
                    uint32_t ep = (uint32_t)eps[q];
                    if (o->ep && ep != o->ep)
                        continue;
                    if (ep > 1 && cm->experts % ep)
                        continue;
                    for (int dt = 0; dt < VP_DT__COUNT; dt++) {
                        if (!dts[dt])
                            continue;
                        p.tp = tp, p.cp = cp, p.pp = pp, p.dp = dp;
                        p.ep = ep;
                        p.dtype = (vp_dtype)dt;
                        vp_status st = layout(&s, &p);
                        if (st != VP_OK)
                            return st;
                    }
                }
            }
        }
    }
    if (s.check && s.applies == 0 && (out->evaluated || out->pruned))
        return vp_error_set(err, VP_EARG,
                            "the options apply to no configuration searched: "
                            "%s",
                            s.perr.msg);
    if (s.r.n == 0 && s.r.have_closest) {
        /* the figures of the nearest configuration, step time included */
        const vp__act *a;
        vp_status st = vp__act_get(cm, vp__cls_of(&out->closest.par),
                                   out->closest.par.cp, &a, err);
        if (st != VP_OK)
            return st;
        vp__evaluate(&s.x, a, &out->closest.par, NULL, &out->closest.time);
    }
    vp_status vst = verify(&s, shown);
    if (vst != VP_OK)
        return vst;
    out->sims = cm->sims - sims0;
    if (s.r.n > 0) {
        out->found = true;
        out->best = s.r.top[0];
        for (uint32_t i = 1; i < s.r.n; i++) {
            out->alt[out->n_alt] = s.r.top[i];
            explain(&out->alt[out->n_alt], &out->best);
            out->n_alt++;
        }
    }
    if (out->evaluated == 0 && out->pruned == 0)
        return vp_error_set(err, VP_EARG,
                            "no configuration of %u GPUs matches: the "
                            "global batch %llu must be divisible by the "
                            "data-parallel degree, and pinned degrees must "
                            "divide the GPU count",
                            c->gpus, (unsigned long long)s.G);
    return VP_OK;
}

vp_status vp_cluster_min_gpus(vp_cluster_model *cm, const vp_cluster *c,
                              const vp_search_opts *o, uint32_t max_gpus,
                              uint32_t *gpus, vp_cluster_plan *out,
                              vp_error *err)
{
    *gpus = 0;
    uint64_t n = 1;
    while (n <= c->gpus)
        n *= 2;
    for (; n <= max_gpus; n *= 2) {
        vp_cluster c2 = *c;
        c2.gpus = (uint32_t)n;
        vp_status st = vp_cluster_search(cm, &c2, o, out, err);
        if (st == VP_EARG) {
            vp_error_clear(err);
            continue; /* no valid layout at this size (global batch) */
        }
        if (st != VP_OK)
            return st;
        if (out->found) {
            *gpus = (uint32_t)n;
            return VP_OK;
        }
    }
    return VP_OK;
}

/* Whether the best plan on n GPUs trains on `tokens` within `seconds`
 * (*out gets that search; sizes without a valid layout do not). */
static vp_status finishes(vp_cluster_model *cm, const vp_cluster *c,
                          const vp_search_opts *o, uint64_t n, double tokens,
                          double seconds, vp_cluster_plan *out, bool *ok,
                          vp_error *err)
{
    vp_cluster c2 = *c;
    c2.gpus = (uint32_t)n;
    *ok = false;
    vp_status st = vp_cluster_search(cm, &c2, o, out, err);
    if (st == VP_EARG) {
        vp_error_clear(err);
        out->found = false;
        return VP_OK; /* no valid layout at this size (global batch) */
    }
    if (st != VP_OK)
        return st;
    double tps = out->found ? out->best.time.tokens_per_s : 0.0;
    *ok = tps > 0.0 && tokens / tps <= seconds;
    return VP_OK;
}

vp_status vp_cluster_gpus_for_time(vp_cluster_model *cm, const vp_cluster *c,
                                   const vp_search_opts *o, double tokens,
                                   double seconds, uint32_t max_gpus,
                                   uint32_t *gpus, vp_cluster_plan *out,
                                   vp_error *err)
{
    *gpus = 0;
    if (!(tokens > 0.0) || !(seconds > 0.0))
        return vp_error_set(err, VP_EARG,
                            "the token budget and the time must be above 0");
    uint64_t node = c->gpus_per_node ? c->gpus_per_node : 1;
    bool ok;
    vp_status st;
    /* within a node: 1, 2, 4 ... */
    for (uint64_t n = 1; n < node && n <= max_gpus; n *= 2) {
        if ((st = finishes(cm, c, o, n, tokens, seconds, out, &ok, err)))
            return st;
        if (ok) {
            *gpus = (uint32_t)n;
            return VP_OK;
        }
    }
    /* whole nodes: double the count until one finishes, then bisect */
    uint64_t lo = 0, hi = 0;
    for (uint64_t k = 1; k * node <= max_gpus; k *= 2) {
        if ((st = finishes(cm, c, o, k * node, tokens, seconds, out, &ok,
                           err)))
            return st;
        if (ok) {
            hi = k;
            break;
        }
        lo = k;
    }
    if (hi == 0)
        return VP_OK;
    while (hi - lo > 1) {
        uint64_t mid = lo + (hi - lo) / 2;
        if ((st = finishes(cm, c, o, mid * node, tokens, seconds, out, &ok,
                           err)))
            return st;
        *(ok ? &hi : &lo) = mid;
    }
    if ((st = finishes(cm, c, o, hi * node, tokens, seconds, out, &ok, err)))
        return st;
    *gpus = (uint32_t)(hi * node);
    return VP_OK;
}
