/* The training-step simulator: the exact sequence of allocations and frees
 * that PyTorch 2.11 performs for a graph, fed through the caching-allocator
 * model. The per-op rules follow docs/SIMULATION_NOTES.md (read from the
 * allocator's own traces) and shared/docs/PYTORCH_MEMORY.md. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define NONE UINT32_MAX
#define MAX_SAVED 12

typedef struct {
    uint64_t handle, bytes;
    uint32_t refs;
    uint8_t cat;
    int32_t op;
} tensor;

typedef enum { MODE_SAVE, MODE_NOSAVE, MODE_RECOMPUTE } fwd_mode;

/* A reference that a Python variable holds (graph.h, VP_OPF_HOLD_*). */
enum { PH_MODULE, PH_ADD, PH_LAYER, PH_SEG, PH_UNTIL };
struct pyhold {
    uint32_t id;
    uint8_t kind;
    int32_t seg; /* PH_LAYER: its layer; PH_SEG: the layer it feeds;
                    PH_UNTIL: the op after which it is dropped (hold_until) */
};

typedef struct sim {
    const vp_graph *g;
    const vp_setup *s;
    vp_allocator *a;
    vp_error *err;
    vp_status st;
    tensor *t;
    size_t nt, capt;
    uint32_t *free_ids;
    size_t n_free, cap_free;
    /* per op */
    uint32_t *out_t;
    uint8_t *out_eb;
    uint8_t *lay;      /* output not in its dims' memory order (graph.h,
                          VP_OPF_STRIDED): it follows a permute or the
                          transposed output of nn.MultiheadAttention */
    uint8_t *glay;     /* the same for the gradient held in grad_t      */
    uint32_t *saved;   /* n_ops * MAX_SAVED */
    uint8_t *n_saved;
    uint32_t *grad_t;
    uint32_t *consumers;
    /* per param */
    uint32_t *pgrad, *cast, *st1, *st2;
    bool *ckpt;       /* per segment */
    uint32_t *held;   /* tensors kept until the model output is dropped */
    struct {
        int32_t seg;
        uint32_t id;
    } *ckin;          /* inputs kept by checkpointed segments */
    uint64_t *reload; /* per op: saved bytes offloaded or compressed, to
                         bring back (decompress) for its backward      */
    bool saving_offloadable; /* fwd in a mode whose saves may move    */
    int32_t recompute_slot;  /* saved slots from this one on are
                                recomputed in backward (-1: none)     */
    bool *sel;               /* per segment: selective recomputation  */
    uint64_t host_now;       /* host bytes held by offloads           */
    bool *int8;              /* per param: an INT8 linear weight, or NULL */
    size_t n_ckin, cap_ckin;
    size_t n_held, cap_held;
    struct pyhold *ph; /* tensors kept by Python locals (VP_OPF_HOLD_*) */
    size_t n_ph, cap_ph;
    /* state */
    vp_phase phase;
    uint32_t step;
    const char *cur_op;
    int32_t cur_op_idx;
    bool amp, half, training;
    uint8_t A, PE; /* low-precision activation bytes, parameter bytes */
    uint64_t cat_live[VP_CAT__COUNT];
    uint64_t phase_peak;
    uint64_t events;
    bool ws_fwd_lt, ws_bwd, ws_bwd_lt;
    /* results */
    vp_estimate *out;
    uint64_t peak;
    uint64_t stop_at;      /* pass 2: stop at this event (0 = run all) */
    bool stopped;
    vp_sim_event_fn cb;
    void *ud;
} sim;

#define OK(S) ((S)->st == VP_OK && !(S)->stopped)

static uint64_t mulc(sim *S, uint64_t a, uint64_t b)
{
    uint64_t r;
    if (!vp_mul_u64(a, b, &r)) {
        if (S->st == VP_OK)
            S->st = vp_error_set(S->err, VP_EOVERFLOW,
                                 "a tensor of %s is larger than 2^64 bytes",
                                 S->cur_op ? S->cur_op : "the model");
        return 0;
    }
    return r;
}

static void emit(sim *S, bool is_free, uint64_t bytes, vp_category cat,
                 uint64_t handle)
{
    S->events++;
    vp_allocator_stats st;
    vp_allocator_stats_get(S->a, &st);
    if (!is_free) {
        if (st.allocated > S->phase_peak)
            S->phase_peak = st.allocated;
        if (st.allocated > S->peak) {
            S->peak = st.allocated;
            S->out->peak_alloc = st.allocated;
            S->out->peak_phase = S->phase;
            S->out->peak_step = S->step;
            snprintf(S->out->peak_op, sizeof S->out->peak_op, "%s",
                     S->cur_op ? S->cur_op : "");
            memcpy(S->out->by_category, S->cat_live, sizeof S->cat_live);
            S->out->peak_alloc = st.allocated;
            /* remember the event for the layer breakdown pass */
            S->out->events = S->events;
        }
    }
    if (S->cb) {
        vp_sim_event ev = {S->events, is_free, bytes, cat, S->phase,
                           S->step, S->cur_op ? S->cur_op : "",
                           st.allocated, st.reserved, handle,
                           vp_allocator_block_addr(S->a, handle)};
        S->cb(&ev, S->ud);
    }
    if (S->stop_at && S->events == S->stop_at)
        S->stopped = true;
}

/* Allocate a tensor with one reference. NONE on failure (S->st set). */
static uint32_t talloc(sim *S, uint64_t bytes, vp_category cat)
{
    if (!OK(S))
        return NONE;
    uint64_t h = 0;
    vp_status st = vp_allocator_malloc(S->a, bytes, 0, &h, S->err);
    if (st != VP_OK) {
        S->st = st;
        if (st == VP_EOOM) {
            char b1[32];
            vp_error_set(S->err, VP_EOOM,
                         "out of memory allocating %s in %s (step %u, %s)",
                         vp_size_format(bytes, b1, sizeof b1),
                         S->cur_op && *S->cur_op ? S->cur_op : "setup",
                         S->step, vp_phase_name(S->phase));
        }
        return NONE;
    }
    uint32_t id;
    if (S->n_free) {
        id = S->free_ids[--S->n_free];
    } else {
        if (!vp__grow((void **)&S->t, &S->capt, S->nt + 1, sizeof(tensor))) {
            S->st = vp_error_set(S->err, VP_ENOMEM, "out of memory");
            return NONE;
        }
        id = (uint32_t)S->nt++;
    }
    uint64_t bs = vp_allocator_block_size(S->a, h);
    S->t[id] = (tensor){h, bs, 1, (uint8_t)cat, S->cur_op_idx};
    S->cat_live[cat] += bs;
    emit(S, false, bytes, cat, h);
    return id;
}

static void tref(sim *S, uint32_t id)
{
    if (id != NONE)
        S->t[id].refs++;
}

static void tunref(sim *S, uint32_t id)
{
    if (id == NONE || S->st != VP_OK)
        return;
    tensor *t = &S->t[id];
    VP_ASSERT(t->refs > 0);
    if (--t->refs)
        return;
    uint64_t bytes = t->bytes;
    uint64_t handle = t->handle;
    vp_category cat = (vp_category)t->cat;
    S->cat_live[cat] -= bytes;
    vp_status st = vp_allocator_release(S->a, handle, S->err);
    VP_ASSERT(st == VP_OK);
    if (!vp__grow((void **)&S->free_ids, &S->cap_free, S->n_free + 1,
                  sizeof(uint32_t))) {
        S->st = vp_error_set(S->err, VP_ENOMEM, "out of memory");
        return;
    }
    S->free_ids[S->n_free++] = id;
    if (!S->stopped)
        emit(S, true, bytes, cat, handle);
}

/* A transient: allocate and free at once. */
static void transient(sim *S, uint64_t bytes)
{
    if (!bytes)
        return;
    uint32_t id = talloc(S, bytes, VP_CAT_TEMP);
    tunref(S, id);
}

/* Keep a tensor until the model's output is dropped (end of forward). */
static void hold(sim *S, uint32_t id)
{
    if (id == NONE)
        return;
    if (!vp__grow((void **)&S->held, &S->cap_held, S->n_held + 1,
                  sizeof(uint32_t))) {
        S->st = vp_error_set(S->err, VP_ENOMEM, "out of memory");
        return;
    }
    tref(S, id);
    S->held[S->n_held++] = id;
}

static void release_held(sim *S)
{
    for (size_t i = 0; i < S->n_held; i++)
        tunref(S, S->held[i]);
    S->n_held = 0;
}

static void pyhold_push(sim *S, uint32_t id, uint8_t kind, int32_t seg)
{
    if (id == NONE)
        return;
    if (!vp__grow((void **)&S->ph, &S->cap_ph, S->n_ph + 1,
                  sizeof(struct pyhold))) {
        S->st = vp_error_set(S->err, VP_ENOMEM, "out of memory");
        return;
    }
    tref(S, id);
    S->ph[S->n_ph++] = (struct pyhold){id, kind, seg};
}

/* Drop the Python references of one kind (kind < 0: all; seg >= 0: only
 * those tied to that layer), innermost (latest) first. */
static void pyhold_release(sim *S, int kind, int32_t seg)
{
    size_t k = S->n_ph;
    while (k-- > 0) {
        struct pyhold h = S->ph[k];
        if (kind >= 0 && h.kind != kind)
            continue;
        if (seg >= 0 && h.seg != seg)
            continue;
        memmove(&S->ph[k], &S->ph[k + 1], (S->n_ph - k - 1) * sizeof h);
        S->n_ph--;
        tunref(S, h.id);
    }
}

/* A checkpointed segment keeps each tensor it takes from outside once
 * (the arguments of the checkpointed function), until its backward. */
static void ckpt_save_input(sim *S, int32_t seg, uint32_t id)
{
    if (id == NONE)
        return;
    for (size_t k = 0; k < S->n_ckin; k++)
        if (S->ckin[k].seg == seg && S->ckin[k].id == id)
            return;
    if (!vp__grow((void **)&S->ckin, &S->cap_ckin, S->n_ckin + 1,
                  sizeof *S->ckin)) {
        S->st = vp_error_set(S->err, VP_ENOMEM, "out of memory");
        return;
    }
    tref(S, id);
    S->ckin[S->n_ckin].seg = seg;
    S->ckin[S->n_ckin].id = id;
    S->n_ckin++;
}

static void ckpt_release_inputs(sim *S, int32_t seg)
{
    size_t w = 0;
    for (size_t k = 0; k < S->n_ckin; k++) {
        if (S->ckin[k].seg == seg)
            tunref(S, S->ckin[k].id);
        else
            S->ckin[w++] = S->ckin[k];
    }
    S->n_ckin = w;
}

/* Saved tensors of 1 MiB and more are what activation offload and
 * compression move (masks, statistics and scalars stay). Returns the id
 * to keep in the op's saved list: the tensor itself, its compressed copy,
 * or NONE when it went to the host. */
static uint32_t stash(sim *S, uint32_t op, uint32_t id)
{
    const vp_setup *s = S->s;
    if (S->recompute_slot >= 0 && S->n_saved[op] >= S->recompute_slot &&
        S->saving_offloadable) {
        /* selective recomputation: not kept; re-made for the backward */
        S->reload[op] += S->t[id].bytes;
        return NONE;
    }
    if (!S->saving_offloadable || (!s->offload_activations && !s->act_bits))
        return id;
    uint64_t b = S->t[id].bytes;
    if (b < VP_MiB || S->t[id].cat != VP_CAT_ACT)
        return id;
    S->reload[op] += b;
    if (s->offload_activations) {
        S->host_now += b;
        S->out->host_traffic += 2 * b; /* down, and back for backward */
        if (S->host_now > S->out->host_bytes)
            S->out->host_bytes = S->host_now;
        return NONE;
    }
    /* ActNN: bits per element of an element of S->A bytes, plus a
     * per-group fp32 scale and zero point (groups of 256) */
    uint64_t elems = b / S->A;
    uint64_t cb = (elems * s->act_bits + 7) / 8 + (elems / 256 + 1) * 8;
    uint32_t c = talloc(S, cb, VP_CAT_ACT);
    return c;
}

static void save(sim *S, uint32_t op, uint32_t id)
{
    if (id == NONE)
        return;
    VP_ASSERT(S->n_saved[op] < MAX_SAVED);
    uint32_t k = stash(S, op, id);
    if (k == id)
        tref(S, id);
    /* a compressed copy comes with its own reference */
    S->saved[op * MAX_SAVED + S->n_saved[op]++] = k;
}

/* Save into a fixed slot (NONE kept), for ops whose backward frees its
 * saved tensors one by one. */
static void save_slot(sim *S, uint32_t op, uint32_t id)
{
    VP_ASSERT(S->n_saved[op] < MAX_SAVED);
    uint32_t k = id == NONE ? NONE : stash(S, op, id);
    if (k == id)
        tref(S, id);
    S->saved[op * MAX_SAVED + S->n_saved[op]++] = k;
}

static void drop_saved(sim *S, uint32_t op, uint32_t k)
{
    if (k < S->n_saved[op]) {
        tunref(S, S->saved[op * MAX_SAVED + k]);
        S->saved[op * MAX_SAVED + k] = NONE;
    }
}

static void release_saved(sim *S, uint32_t op)
{
    for (uint8_t i = 0; i < S->n_saved[op]; i++)
        tunref(S, S->saved[op * MAX_SAVED + i]);
    S->n_saved[op] = 0;
}

static uint32_t param_bytes_of(const sim *S, const vp_param *p)
{
    if (p->elem_bytes_override)
        return p->elem_bytes_override;
    if (p->fp32_buffer)
        return 4;
    return S->PE;
}

/* ---- autocast -------------------------------------------------------- */

/* The low-precision copy of a parameter (autocast's weight cache); NONE
 * when no cast happens (not amp). The cache keeps one reference. */
static uint32_t weight_cast(sim *S, uint32_t p)
{
    if (!S->amp || (S->int8 && S->int8[p]))
        return NONE;
    if (S->cast[p] == NONE) {
        const vp_param *pp = &S->g->params[p];
        S->cast[p] = talloc(S, mulc(S, pp->numel, 2), VP_CAT_CAST);
    }
    return S->cast[p];
}

static void clear_cast_cache(sim *S)
{
    size_t np = S->g->n_params;
    for (size_t p = 0; p < np && OK(S); p++) {
        if (S->cast[p] != NONE) {
            uint32_t id = S->cast[p];
            S->cast[p] = NONE;
            tunref(S, id);
        }
    }
}

/* Input x of op, cast to `eb` bytes if needed: returns an owned
 * reference. */
static uint32_t cast_input(sim *S, uint32_t in_op, uint8_t eb)
{
    uint32_t x = S->out_t[in_op];
    if (S->out_eb[in_op] == eb || S->g->ops[in_op].value != VP_VAL_FLOAT) {
        tref(S, x);
        return x;
    }
    return talloc(S, mulc(S, S->g->ops[in_op].numel, eb), VP_CAT_ACT);
}

/* ---- gradients --------------------------------------------------------- */

/* Hand a parameter gradient (an owned tensor in param dtype) to
 * AccumulateGrad: steal it when .grad is unset, else add in place. */
static void param_grad(sim *S, uint32_t p, uint32_t gid)
{
    if (gid == NONE)
        return;
    if (S->pgrad[p] == NONE) {
        S->cat_live[S->t[gid].cat] -= S->t[gid].bytes;
        S->t[gid].cat = VP_CAT_GRAD;
        S->cat_live[VP_CAT_GRAD] += S->t[gid].bytes;
        S->pgrad[p] = gid;
    } else {
        tunref(S, gid);
    }
}

/* A parameter's gradient as the backward op produces it: in the op's
 * compute dtype, then (amp) ToCopyBackward to fp32. */
static void weight_grad(sim *S, uint32_t p, bool via_cast)
{
    const vp_param *pp = &S->g->params[p];
    if (!pp->trainable)
        return;
    uint64_t n = pp->numel;
    if (via_cast && S->amp) {
        uint32_t lo = talloc(S, mulc(S, n, 2), VP_CAT_TEMP);
        uint32_t hi = talloc(S, mulc(S, n, 4), VP_CAT_TEMP);
        tunref(S, lo);
        param_grad(S, p, hi);
    } else {
        param_grad(S, p, talloc(S, mulc(S, n, param_bytes_of(S, pp)),
                                VP_CAT_TEMP));
    }
}

/* A parameter gradient made in the compute dtype (owned): under autocast
 * ToCopyBackward makes the fp32 copy (then the low one is freed), which
 * AccumulateGrad steals. */
static void param_grad_cast(sim *S, uint32_t p, uint32_t lo)
{
    if (lo == NONE)
        return;
    if (S->amp) {
        uint32_t hi = talloc(S, mulc(S, S->g->params[p].numel, 4),
                             VP_CAT_TEMP);
        tunref(S, lo);
        lo = hi;
    }
    param_grad(S, p, lo);
}

/* Give grad tensor gid (owned) to producer op `in`: convert its dtype if
 * the producer's output has another width (the copy keeps the strides),
 * then accumulate. `strided`: the grad is not in the dims' memory order;
 * a sum into an existing buffer keeps that buffer's layout. */
static void give_grad_l(sim *S, uint32_t in, uint32_t gid, uint8_t g_eb,
                        bool strided)
{
    if (gid == NONE || !OK(S))
        return;
    const vp_op *po = &S->g->ops[in];
    if (!po->needs_grad) {
        tunref(S, gid);
        return;
    }
    if (S->out_eb[in] != g_eb) {
        uint32_t c = talloc(S, mulc(S, po->numel, S->out_eb[in]),
                            VP_CAT_TEMP);
        tunref(S, gid);
        gid = c;
    }
    if (S->grad_t[in] == NONE) {
        S->grad_t[in] = gid;
        S->glay[in] = strided;
    } else {
        tunref(S, gid); /* summed in place into the existing buffer */
    }
}

static void give_grad(sim *S, uint32_t in, uint32_t gid, uint8_t g_eb)
{
    give_grad_l(S, in, gid, g_eb, false);
}

static uint32_t grad_like(sim *S, uint32_t in, uint8_t eb)
{
    return talloc(S, mulc(S, S->g->ops[in].numel, eb), VP_CAT_TEMP);
}

static void bias_staging(sim *S, uint64_t rows, uint64_t out)
{
    /* Reduce.cuh global reduction for the bias gradient: a fp32 staging
     * buffer of out x min(2 rows, cap) plus a semaphore. */
    if (rows < 256)
        return;
    uint64_t r = 2 * rows;
    uint64_t cap = 34700000u / (out ? out : 1);
    if (cap < 512)
        cap = 512;
    if (r > cap)
        r = cap;
    uint32_t a = talloc(S, mulc(S, mulc(S, out, r), 4), VP_CAT_TEMP);
    uint32_t b = talloc(S, 32, VP_CAT_TEMP);
    tunref(S, a);
    tunref(S, b);
}

/* ---- cuDNN convolution workspaces --------------------------------------- */

typedef enum { CONV_FWD, CONV_BWD_DATA, CONV_BWD_FILTER } conv_pass;

/* Bytes of the cuDNN workspace that one convolution call takes from the
 * caching allocator (freed at once). torch 2.11 asks cuDNN's heuristics
 * (cudnn.benchmark off) for an algorithm; on the H200 they pick NHWC
 * tensor-core kernels for NCHW tensors, whose workspace holds NHWC copies
 * of the operands: the input, the output and, for k>1, the filter (a 1x1
 * filter has the same layout in NCHW and NHWC). In half precision the
 * copies pad the channels to a multiple of 8 (16-byte vectors), e.g. the
 * 3-channel stem. A 1x1 stride-1 convolution is a plain GEMM over NCHW and
 * needs no copies, except on small feature maps (fewer than 14x14 output
 * positions), where cuDNN transforms as well. The filter gradient of a 1x1
 * stride-1 convolution splits the batch into fp32 partial filters
 * (batch x Cout x Cin x 4 B) when that is smaller than the copies; the
 * other filter gradients add split-K partial sums, up to 16 fp32 copies of
 * the filter. In fp32 the split count fills one wave of CTAs over the
 * filter's 128x128 tiles: floor(132 / tiles), at most 16 (measured
 * exactly 14, 3, 16, 4 and 1 splits for ResNet-50's 3x3 128/256 and 1x1
 * downsample filters); in bf16 it varies with the batch (0-13 splits),
 * modelled as 16 splits capped at 8 MiB (measured 2-16 MB). That
 * extra is what keeps the filter-gradient workspace from fitting in the
 * block the data-gradient workspace just freed. The copies carry ~147 B
 * of alignment slack (measured: +147 B in most calls, +16 in the rest).
 * Evidence (docs/SIMULATION_NOTES.md §7.1): every distinct conv of
 * ResNet-50, fp32 and bf16, batches 32-256, and the resnet50 traces; the
 * rule gives 175 of the 184 measured forward workspaces within 1 % (the
 * rest: other algorithms, up to 1.5x) and 109 of the 184 filter-gradient
 * ones. A few hundred bytes of per-call scratch (272/400 B, small pool)
 * are left out. */
#define CUDNN_WS_SLACK 147u
#define CUDNN_SPLITK_MAX 16u
#define CUDNN_SPLITK_CAP (8u << 20)
#define CUDNN_WGRAD_CTAS 132u /* the H200's SMs: one wave of split-K CTAs */
static uint64_t conv_ws(sim *S, const vp_op *o, uint8_t eb, conv_pass pass)
{
    const vp_op *x = &S->g->ops[o->inputs[0]];
    if (x->ndim != 4 || o->ndim != 4 || !o->in_features)
        return 0;
    uint64_t B = x->shape[0], ci = o->in_features, co = o->out_features;
    uint64_t cip = ci, cop = co;
    if (eb == 2) {
        cip = (ci + 7) / 8 * 8;
        cop = (co + 7) / 8 * 8;
    }
    uint64_t grp = o->groups ? o->groups : 1;
    uint64_t in = mulc(S, mulc(S, mulc(S, B, cip), mulc(S, x->shape[2],
                                                         x->shape[3])), eb);
    uint64_t out = mulc(S, mulc(S, mulc(S, B, cop), mulc(S, o->shape[2],
                                                          o->shape[3])), eb);
    uint64_t k2 = (uint64_t)o->kernel * o->kernel;
    uint64_t w = mulc(S, mulc(S, mulc(S, cop, cip / grp), k2), eb);
    uint64_t w4 = mulc(S, mulc(S, mulc(S, co, ci / grp), k2), 4);
    bool pointwise = o->kernel == 1 && o->stride <= 1;
    /* a non-overlapping patchify convolution (kernel = stride > 1, no
     * padding: ViT's conv_proj) in fp32: the forward takes no workspace
     * (traced: ViT-B/16 fp32 b32; in bf16 the general rule below holds to
     * 16 B) */
    if (pass == CONV_FWD && eb == 4 && o->kernel > 1 &&
        o->kernel == o->stride && !o->padding)
        return 0;
    if (!pointwise) {
        /* a strided 1x1 forward in fp32 writes large outputs (over 14x14
         * positions) in NCHW directly: only the input is copied
         * (measured: ResNet-50's 256->512 downsample, 28x28 out) */
        if (o->kernel == 1 && pass == CONV_FWD && eb == 4 &&
            o->shape[2] * o->shape[3] > 14 * 14)
            return in + CUDNN_WS_SLACK;
        uint64_t ws = in + out + (o->kernel > 1 ? w : 0) + CUDNN_WS_SLACK;
        if (pass == CONV_BWD_FILTER) {
            uint64_t sk;
            if (eb == 4) {
                /* fp32: as many splits as fill one wave of CTAs over the
                 * filter's 128x128 output tiles */
                uint64_t crs = mulc(S, cip / grp, k2);
                uint64_t tiles = ((cop + 127) / 128) * ((crs + 127) / 128);
                uint64_t splits = CUDNN_WGRAD_CTAS / (tiles ? tiles : 1);
                if (splits > CUDNN_SPLITK_MAX)
                    splits = CUDNN_SPLITK_MAX;
                sk = splits > 1 ? mulc(S, w4, splits) : 0;
            } else {
                sk = mulc(S, w4, CUDNN_SPLITK_MAX);
                if (sk > CUDNN_SPLITK_CAP)
                    sk = CUDNN_SPLITK_CAP;
            }
            ws += sk;
        }
        return ws;
    }
    bool small_map = o->shape[2] * o->shape[3] < 14 * 14;
    if (pass == CONV_BWD_FILTER) {
        uint64_t split = mulc(S, B, w4);
        uint64_t copies = in + out;
        return split < copies ? split : copies;
    }
    return small_map ? in + out + CUDNN_WS_SLACK : 0;
}

/* ---- forward ------------------------------------------------------------ */

/* The kernel an attention core runs: the user's choice or the model's;
 * SDPA picks flash for 16-bit inputs, memory-efficient otherwise. */
static vp_attn_impl attn_impl_of(const sim *S, const vp_op *o, uint8_t ce)
{
    vp_attn_impl impl = S->s->attn_set ? S->s->attn : o->attn_impl;
    if (impl == VP_ATTN_SDPA)
        impl = ce == 2 ? VP_ATTN_FLASH : VP_ATTN_EFFICIENT;
    return impl;
}

static uint8_t promote(uint8_t a, uint8_t b) { return a > b ? a : b; }

static bool is_view(vp_op_kind k)
{
    return k == VP_OP_FLATTEN || k == VP_OP_RESHAPE || k == VP_OP_PERMUTE ||
           k == VP_OP_SELECT;
}

static void workspace_fwd(sim *S, bool bias)
{
    if (bias && !S->ws_fwd_lt) {
        S->ws_fwd_lt = true;
        talloc(S, S->s->cublaslt_workspace, VP_CAT_WORKSPACE);
    }
}

/* Forward of op i. `save` says whether autograd keeps what it saves. */
static void fwd(sim *S, uint32_t i, fwd_mode mode, const uint32_t *refs_of)
{
    const vp_graph *g = S->g;
    const vp_op *o = &g->ops[i];
    S->cur_op = o->name;
    S->cur_op_idx = (int32_t)i;
    bool sv = S->training && mode != MODE_NOSAVE && o->needs_grad;
    S->saving_offloadable = mode == MODE_SAVE;
    uint32_t in0 = o->n_inputs ? o->inputs[0] : NONE;
    uint8_t eb0 = in0 != NONE ? S->out_eb[in0] : S->A;
    uint64_t n = o->numel;
    uint32_t out = NONE;
    uint8_t oeb = eb0;
    bool mha = o->flags & VP_OPF_TORCH_MHA;
    /* the output's layout: by default that of the first input (elementwise
     * ops: TensorIterator follows the first operand's strides) */
    uint8_t ol = in0 != NONE ? S->lay[in0] : 0;
    uint32_t refs = refs_of ? refs_of[i] : S->consumers[i];
    if (o->flags & VP_OPF_HOLD_FWD && mode == MODE_SAVE)
        refs++;
    bool hold_out = (o->flags & VP_OPF_HOLD_OUT) && mode != MODE_RECOMPUTE;
    if (o->flags & VP_OPF_MODEL_END && mode != MODE_RECOMPUTE) {
        for (uint32_t j = 0; j < i; j++)
            if (g->ops[j].flags & VP_OPF_HOLD_FWD && S->out_t[j] != NONE)
                tunref(S, S->out_t[j]);
    }
    switch (o->kind) {
    case VP_OP_INPUT:
        return; /* made with the batch */
    case VP_OP_LINEAR:
    case VP_OP_CONV2D: {
        bool bias = o->n_params > 1;
        uint8_t ce = S->amp ? 2 : eb0; /* compute dtype */
        const vp_op *xo = &g->ops[in0];
        /* nn.MultiheadAttention(batch_first=True): out_proj takes
         * attn_output.permute(2, 0, 1, 3).contiguous(), a copy unless the
         * kernel wrote its output sequence-first (flash: empty_like(q),
         * and q is a view of the sequence-first projection); its result is
         * returned transposed */
        bool mha_out = mha && xo->kind == VP_OP_ATTENTION;
        bool mha_in = mha && !mha_out;
        /* F.linear of a 3-d input that is not contiguous (in_proj reads its
         * input through a transpose) goes through matmul: the input is
         * reshaped to 2-d by a copy, which the mm saves, and the bias is
         * added in place */
        bool mm = o->kind == VP_OP_LINEAR &&
                  (mha_in || (S->lay[in0] && xo->ndim >= 3));
        uint32_t xp = NONE;
        if (mha_out &&
            attn_impl_of(S, xo, S->out_eb[in0]) != VP_ATTN_FLASH)
            xp = talloc(S, mulc(S, xo->numel, S->out_eb[in0]), VP_CAT_ACT);
        /* autocast's wrapper casts the arguments right to left:
         * addmm(b, x, W) casts W, x, b; linear/conv(x, W, b) b, W, x */
        uint32_t x, w;
        if (o->flags & VP_OPF_ADDMM) {
            w = weight_cast(S, o->params[0]);
            x = cast_input(S, in0, ce);
            if (bias)
                weight_cast(S, o->params[1]);
        } else {
            if (bias)
                weight_cast(S, o->params[1]);
            w = weight_cast(S, o->params[0]);
            x = xp != NONE ? xp : cast_input(S, in0, ce);
        }
        uint32_t xc = mm ? talloc(S, mulc(S, xo->numel, ce), VP_CAT_ACT)
                         : NONE;
        if (o->kind == VP_OP_LINEAR)
            workspace_fwd(S, bias && !mm);
        oeb = ce;
        ol = mha_out;
        /* INT8 weights: dequantized for the matmul, freed after it */
        uint32_t deq = S->int8 && S->int8[o->params[0]]
                           ? talloc(S,
                                    mulc(S, g->params[o->params[0]].numel,
                                         ce),
                                    VP_CAT_TEMP)
                           : NONE;
        out = talloc(S, mulc(S, n, oeb), VP_CAT_ACT);
        tunref(S, deq);
        if (mm) {
            tunref(S, x); /* the (strided) cast; the mm keeps the copy */
            x = xc;
        }
        if (mha_in) {
            /* unflatten(-1, (3, E)).unsqueeze(0).transpose(0, -2)
             * .squeeze(-2).contiguous(): q, k, v are views of this copy */
            uint32_t c = talloc(S, mulc(S, n, oeb), VP_CAT_ACT);
            tunref(S, out);
            out = c;
        }
        if (o->kind == VP_OP_CONV2D)
            transient(S, conv_ws(S, o, ce, CONV_FWD));
        if (sv) {
            /* MmBackward frees mat2 (W) before self (x) */
            if (mm && g->ops[in0].needs_grad)
                save(S, i, w);
            if (g->params[o->params[0]].trainable)
                save(S, i, x);
            /* ConvolutionBackward keeps the weight (its cast under
             * autocast) even when the input needs no gradient (traced on
             * ResNet-50 and ViT's patchify conv); linear's mm saves it
             * only for the input's gradient */
            if (!mm && (g->ops[in0].needs_grad || o->kind == VP_OP_CONV2D))
                save(S, i, w);
        }
        tunref(S, x);
        break;
    }
    case VP_OP_EMBEDDING:
        oeb = S->PE;
        out = talloc(S, mulc(S, n, oeb), VP_CAT_ACT);
        break;
    case VP_OP_LAYERNORM:
    case VP_OP_GROUPNORM: {
        uint8_t ce = S->amp ? 4 : eb0;
        uint32_t x = cast_input(S, in0, ce);
        /* layer_norm_cuda: X.expect_contiguous(), a copy of a strided
         * input for the kernel; autograd saves the input itself */
        uint32_t xc = o->kind == VP_OP_LAYERNORM && S->lay[in0]
                          ? talloc(S, mulc(S, n, ce), VP_CAT_TEMP)
                          : NONE;
        oeb = ce;
        ol = 0;
        out = talloc(S, mulc(S, n, oeb), VP_CAT_ACT);
        uint32_t m = talloc(S, mulc(S, o->rows, 4), VP_CAT_ACT);
        uint32_t r = talloc(S, mulc(S, o->rows, 4), VP_CAT_ACT);
        if (sv) {
            save(S, i, x);
            save(S, i, m);
            save(S, i, r);
        }
        tunref(S, m);
        tunref(S, r);
        tunref(S, xc);
        tunref(S, x);
        break;
    }
    case VP_OP_RMSNORM: {
        /* HF LlamaRMSNorm: x.float(), pow, mean, rsqrt, mul, .to(dtype),
         * weight * h */
        uint32_t xf = cast_input(S, in0, 4);
        transient(S, mulc(S, n, 4)); /* pow(2) */
        uint32_t r = talloc(S, mulc(S, o->rows, 4), VP_CAT_ACT);
        uint32_t h = talloc(S, mulc(S, n, 4), VP_CAT_ACT);
        uint32_t h2 = h;
        if (eb0 != 4) {
            h2 = talloc(S, mulc(S, n, eb0), VP_CAT_ACT);
            tunref(S, h);
        }
        oeb = promote(S->PE, eb0);
        out = talloc(S, mulc(S, n, oeb), VP_CAT_ACT);
        if (sv) {
            save(S, i, xf);
            save(S, i, r);
            save(S, i, h2);
        }
        tunref(S, h2);
        tunref(S, r);
        tunref(S, xf);
        break;
    }
    case VP_OP_BATCHNORM2D: {
        out = talloc(S, mulc(S, n, eb0), VP_CAT_ACT);
        uint32_t m = talloc(S, mulc(S, o->rows, 4), VP_CAT_ACT);
        uint32_t r = talloc(S, mulc(S, o->rows, 4), VP_CAT_ACT);
        if (sv) {
            save(S, i, S->out_t[in0]);
            save(S, i, m);
            save(S, i, r);
        }
        tunref(S, m);
        tunref(S, r);
        break;
    }
    case VP_OP_ATTENTION: {
        uint8_t ce = S->amp ? 2 : eb0;
        uint32_t q = cast_input(S, in0, ce);
        uint32_t k = NONE, v = NONE;
        if (o->n_inputs == 3) {
            k = cast_input(S, o->inputs[1], ce);
            v = cast_input(S, o->inputs[2], ce);
        }
        uint64_t bh = mulc(S, o->shape[0], o->heads);
        uint64_t kvn = mulc(S, mulc(S, o->shape[0], o->kv_len),
                            (uint64_t)o->kv_heads * o->head_dim);
        bool kvcopy = (o->flags & VP_OPF_KV_COPY) && mode == MODE_SAVE &&
                      !(o->segment >= 0 && S->ckpt[o->segment]);
        if (kvcopy) {
            /* HF DynamicCache (use_cache): the copies live in the cache
             * until the model's output is dropped */
            k = talloc(S, mulc(S, kvn, ce), VP_CAT_ACT);
            v = talloc(S, mulc(S, kvn, ce), VP_CAT_ACT);
            hold(S, k);
            hold(S, v);
        }
        vp_attn_impl impl = attn_impl_of(S, o, ce);
        oeb = ce;
        ol = 0;
        if (impl == VP_ATTN_EAGER) {
            /* HF eager_attention_forward (transformers 5.x, traced on
             * GPT-2): q made contiguous for bmm (saved); q @ k^T; times
             * the scale; plus the float causal mask (the model's dtype,
             * so fp32 under autocast); softmax (fp32 under autocast,
             * saved); .type(v.dtype); dropout (mask and output saved);
             * probs @ v; transpose(1, 2).reshape() copies the output.
             * Saved slots: q copy, k, v, softmax, mask, dropped. */
            uint64_t sc = mulc(S, mulc(S, bh, o->q_len), o->kv_len);
            uint64_t qn = mulc(S, mulc(S, o->shape[0], o->q_len),
                               (uint64_t)o->heads * o->head_dim);
            uint8_t me = o->causal ? promote(ce, S->PE) : ce;
            uint8_t se = S->amp ? 4 : me;
            uint32_t qc = talloc(S, mulc(S, qn, ce), VP_CAT_ACT);
            uint32_t s1 = talloc(S, mulc(S, sc, ce), VP_CAT_TEMP);
            uint32_t s2 = talloc(S, mulc(S, sc, ce), VP_CAT_TEMP);
            tunref(S, s1);
            if (o->causal) {
                uint32_t s3 = talloc(S, mulc(S, sc, me), VP_CAT_TEMP);
                tunref(S, s2);
                s2 = s3;
            }
            uint32_t sm = talloc(S, mulc(S, sc, se), VP_CAT_ACT);
            tunref(S, s2);
            uint32_t pc = sm;
            if (se != ce) {
                pc = talloc(S, mulc(S, sc, ce), VP_CAT_TEMP);
            } else {
                tref(S, sm);
            }
            uint32_t mask = NONE, dropped = pc;
            if (o->dropout > 0) {
                mask = talloc(S, sc, VP_CAT_ACT);
                dropped = talloc(S, mulc(S, sc, ce), VP_CAT_ACT);
                tunref(S, pc);
            }
            uint32_t o4 = talloc(S, mulc(S, qn, ce), VP_CAT_TEMP);
            out = talloc(S, mulc(S, n, oeb), VP_CAT_ACT);
            tunref(S, o4);
            if (sv) {
                /* selective recomputation keeps q, k, v only */
                if (o->segment >= 0 && S->sel[o->segment])
                    S->recompute_slot = 3;
                save_slot(S, i, qc);
                save_slot(S, i, k != NONE ? k : q);
                save_slot(S, i, v);
                save_slot(S, i, sm);
                save_slot(S, i, mask);
                save_slot(S, i, dropped);
                S->recompute_slot = -1;
            }
            tunref(S, qc);
            tunref(S, sm);
            tunref(S, mask);
            tunref(S, dropped);
        } else if (impl == VP_ATTN_MATH) {
            uint64_t sc = mulc(S, mulc(S, bh, o->q_len), o->kv_len);
            uint8_t pe = impl == VP_ATTN_MATH ? 4 : ce;
            uint32_t scores = talloc(S, mulc(S, sc, pe), VP_CAT_TEMP);
            if (o->causal)
                transient(S, mulc(S, sc, pe)); /* masked copy */
            uint32_t p32 = talloc(S, mulc(S, sc, 4), VP_CAT_TEMP);
            tunref(S, scores);
            uint32_t probs = p32;
            if (pe != 4) {
                probs = talloc(S, mulc(S, sc, pe), VP_CAT_ACT);
                tunref(S, p32);
            }
            uint32_t mask = NONE, dropped = NONE;
            /* dropout follows the module's train mode, also under no_grad
             * (the ground truth's inference runs in train mode) */
            if (o->dropout > 0) {
                mask = talloc(S, sc, VP_CAT_ACT);
                dropped = talloc(S, mulc(S, sc, pe), VP_CAT_ACT);
            }
            out = talloc(S, mulc(S, n, oeb), VP_CAT_ACT);
            if (sv) {
                if (o->segment >= 0 && S->sel[o->segment])
                    S->recompute_slot = 3;
                save_slot(S, i, q);
                save_slot(S, i, k);
                save_slot(S, i, v);
                save_slot(S, i, probs);
                save_slot(S, i, mask);
                save_slot(S, i, dropped);
                S->recompute_slot = -1;
            }
            tunref(S, probs);
            tunref(S, mask);
            tunref(S, dropped);
        } else {
            uint32_t rng1 = NONE, rng2 = NONE, lse = NONE;
            /* torch_mha (traced): flash allocates the philox seed and
             * offset in grad mode also at p = 0 */
            if (o->dropout > 0 ||
                (mha && impl == VP_ATTN_FLASH && S->training)) {
                rng1 = talloc(S, 8, VP_CAT_ACT);
                rng2 = talloc(S, 8, VP_CAT_ACT);
            }
            out = talloc(S, mulc(S, n, oeb), VP_CAT_ACT);
            uint64_t L = o->q_len;
            if (impl == VP_ATTN_EFFICIENT)
                L = (L + 31) / 32 * 32;
            /* logsumexp only when autograd may need it (grad mode on and
             * an input requiring grad: sdp_utils' compute_logsumexp) */
            if (S->training && o->needs_grad)
                lse = talloc(S, mulc(S, mulc(S, bh, L), 4), VP_CAT_ACT);
            /* torch_mha (traced): no scratch in the efficient kernel */
            if (!(mha && impl == VP_ATTN_EFFICIENT))
                transient(S, 256);
            if (sv) {
                save(S, i, q);
                save(S, i, k);
                save(S, i, v);
                save(S, i, lse);
                /* the packed layout hands the output to out_proj, which
                 * saves it; torch_mha's out_proj may save a copy */
                if (mha)
                    save(S, i, out);
                save(S, i, rng1);
                save(S, i, rng2);
            }
            tunref(S, lse);
            tunref(S, rng1);
            tunref(S, rng2);
        }
        tunref(S, q);
        tunref(S, k);
        tunref(S, v);
        break;
    }
    case VP_OP_GELU_TANH: {
        /* HF NewGELUActivation: 0.5*x*(1+tanh(c*(x+0.044715*x^3))) as
         * separate kernels; pow is on autocast's fp32 list. */
        /* Unsaved (no grad, or inside a checkpoint) each temporary dies
         * as soon as the expression no longer needs it: x.float() after
         * pow, tanh after 1+tanh, 0.5*x and 1+tanh after the product. */
        uint8_t fe = S->amp ? 4 : eb0;
        uint32_t half = talloc(S, mulc(S, n, eb0), VP_CAT_ACT);
        uint32_t xf = cast_input(S, in0, fe);
        uint32_t p = talloc(S, mulc(S, n, fe), VP_CAT_TEMP);
        if (!sv) {
            tunref(S, xf);
            xf = NONE;
        }
        uint32_t q = talloc(S, mulc(S, n, fe), VP_CAT_TEMP);
        tunref(S, p);
        uint32_t r = talloc(S, mulc(S, n, fe), VP_CAT_TEMP);
        tunref(S, q);
        uint32_t c = talloc(S, mulc(S, n, fe), VP_CAT_TEMP);
        tunref(S, r);
        uint32_t th = talloc(S, mulc(S, n, fe), VP_CAT_ACT);
        tunref(S, c);
        uint32_t u = talloc(S, mulc(S, n, fe), VP_CAT_ACT);
        if (!sv) {
            tunref(S, th);
            th = NONE;
        }
        oeb = fe;
        out = talloc(S, mulc(S, n, oeb), VP_CAT_ACT);
        if (sv) {
            save(S, i, half);
            save(S, i, xf);
            save(S, i, th);
            save(S, i, u);
        }
        tunref(S, half);
        tunref(S, xf);
        tunref(S, th);
        tunref(S, u);
        break;
    }
    case VP_OP_RELU:
    case VP_OP_TANH:
    case VP_OP_SIGMOID:
    case VP_OP_GELU:
    case VP_OP_SILU:
        if (o->inplace) {
            out = S->out_t[in0];
            tref(S, out);
        } else {
            out = talloc(S, mulc(S, n, eb0), VP_CAT_ACT);
        }
        if (sv)
            save(S, i, (o->kind == VP_OP_GELU || o->kind == VP_OP_SILU)
                           ? S->out_t[in0]
                           : out);
        break;
    case VP_OP_ROPE: {
        uint8_t re = S->amp ? 4 : eb0;
        transient(S, mulc(S, n, re));
        transient(S, mulc(S, n, eb0));
        oeb = re;
        out = talloc(S, mulc(S, n, oeb), VP_CAT_ACT);
        break;
    }
    case VP_OP_DROPOUT: {
        /* native_dropout: the bool mask, then the output */
        uint32_t m = talloc(S, n, VP_CAT_ACT);
        out = talloc(S, mulc(S, n, eb0), VP_CAT_ACT);
        if (sv)
            save(S, i, m);
        tunref(S, m);
        break;
    }
    case VP_OP_ADD:
    case VP_OP_MUL:
    case VP_OP_MOE_COMBINE: {
        uint8_t e = eb0;
        for (uint32_t j = 1; j < o->n_inputs; j++)
            e = promote(e, S->out_eb[o->inputs[j]]);
        if (o->n_params)
            e = promote(e, S->PE);
        oeb = e;
        if (o->inplace) {
            out = S->out_t[in0];
            tref(S, out);
        } else {
            out = talloc(S, mulc(S, n, oeb), VP_CAT_ACT);
        }
        if (sv && o->kind == VP_OP_MUL) {
            save(S, i, S->out_t[o->inputs[0]]);
            save(S, i, S->out_t[o->inputs[1]]);
        }
        break;
    }
    case VP_OP_MAXPOOL2D: {
        out = talloc(S, mulc(S, n, eb0), VP_CAT_ACT);
        uint32_t idx = talloc(S, mulc(S, n, 8), VP_CAT_ACT);
        if (sv) {
            save(S, i, S->out_t[in0]);
            save(S, i, idx);
        }
        tunref(S, idx);
        break;
    }
    case VP_OP_AVGPOOL2D:
    case VP_OP_ADAPTIVE_AVGPOOL2D:
    case VP_OP_CONCAT:
    case VP_OP_MOE_DISPATCH:
        /* cat promotes to the widest input: ViT's class token (a fp32
         * parameter) makes the joined tokens fp32 under autocast */
        if (o->kind == VP_OP_CONCAT && o->n_params)
            oeb = promote(eb0, S->PE);
        ol = 0;
        out = talloc(S, mulc(S, n, oeb), VP_CAT_ACT);
        break;
    case VP_OP_ROUTER: {
        uint32_t sm = talloc(S, mulc(S, mulc(S, o->shape[0], o->classes), 4),
                             VP_CAT_ACT);
        oeb = 4;
        out = talloc(S, mulc(S, n, 4), VP_CAT_ACT);
        uint32_t idx = talloc(S, mulc(S, n, 8), VP_CAT_ACT);
        if (sv) {
            save(S, i, sm);
            save(S, i, idx);
        }
        tunref(S, sm);
        tunref(S, idx);
        break;
    }
    case VP_OP_SOFTMAX:
        oeb = S->amp ? 4 : eb0;
        out = talloc(S, mulc(S, n, oeb), VP_CAT_ACT);
        if (sv)
            save(S, i, out);
        break;
    case VP_OP_FLATTEN:
    case VP_OP_RESHAPE:
        if (S->lay[in0]) {
            /* dims merged across a permuted order: reshape copies */
            out = talloc(S, mulc(S, n, eb0), VP_CAT_ACT);
            ol = 0;
            break;
        }
        out = S->out_t[in0];
        tref(S, out);
        break;
    case VP_OP_PERMUTE:
    case VP_OP_SELECT:
        if (o->flags & VP_OPF_STRIDED)
            ol ^= 1;
        out = S->out_t[in0];
        tref(S, out);
        break;
    case VP_OP_CROSS_ENTROPY:
    case VP_OP_MSE_LOSS: {
        uint64_t rc = mulc(S, o->rows, o->classes);
        uint32_t lbl = NONE, pad = NONE, up = NONE;
        uint32_t lp = NONE, lp32 = NONE;
        /* HF ForCausalLMLoss: logits.float(); labels padded with -100
         * (B x (S+1) int64) and shifted (.contiguous()); both locals live
         * until the loss function returns, after nll_loss */
        if (o->kind == VP_OP_CROSS_ENTROPY && o->upcast_logits)
            up = cast_input(S, in0, 4);
        if (o->flags & VP_OPF_SHIFT_LABELS) {
            uint64_t bsz = g->batch && o->rows % g->batch == 0 ? g->batch : 1;
            pad = talloc(S, mulc(S, o->rows + bsz, 8), VP_CAT_TEMP);
            lbl = talloc(S, mulc(S, o->rows, 8), VP_CAT_ACT);
        }
        if (o->kind == VP_OP_MSE_LOSS) {
            uint32_t x = cast_input(S, in0, S->amp ? 4 : eb0);
            if (sv)
                save(S, i, x);
            tunref(S, x);
        } else if (eb0 == 2 && !o->upcast_logits && S->amp) {
            /* log_softmax keeps bf16; nll_loss (fp32 list) copies */
            lp = talloc(S, mulc(S, rc, 2), VP_CAT_ACT);
            lp32 = talloc(S, mulc(S, rc, 4), VP_CAT_ACT);
        } else {
            uint8_t le = o->upcast_logits ? 4 : eb0;
            if (up == NONE)
                up = cast_input(S, in0, le);
            lp = talloc(S, mulc(S, rc, le), VP_CAT_ACT);
        }
        oeb = 4;
        out = talloc(S, 4, VP_CAT_ACT);
        uint32_t tw = talloc(S, 4, VP_CAT_ACT);
        tunref(S, up);
        tunref(S, pad);
        if (sv) {
            save(S, i, lp);
            save(S, i, lp32);
            save(S, i, lbl);
            save(S, i, tw);
        }
        tunref(S, lp);
        tunref(S, lp32);
        tunref(S, lbl);
        tunref(S, tw);
        refs++; /* the loss is held by the training loop */
        break;
    }
    case VP_OP__COUNT:
        break;
    }
    if (!OK(S))
        return;
    /* the output: refs from consumers; drop our creation reference */
    S->out_eb[i] = oeb;
    S->lay[i] = ol;
    if (out != NONE) {
        S->t[out].refs += refs;
        S->out_t[i] = out;
        /* Python variables that outlive the consumers (graph.h) */
        if (o->kind == VP_OP_ADD)
            pyhold_release(S, PH_ADD, -1);
        if (o->flags & VP_OPF_MODULE_RET)
            pyhold_release(S, PH_MODULE, -1);
        if (o->flags & VP_OPF_HOLD_MODULE)
            pyhold_push(S, out, PH_MODULE, -1);
        if (o->flags & VP_OPF_HOLD_ADD)
            pyhold_push(S, out, PH_ADD, -1);
        if (o->flags & VP_OPF_HOLD_LAYER)
            pyhold_push(S, out, PH_LAYER, o->segment);
        if (hold_out)
            hold(S, out);
        if (o->hold_until > i)
            pyhold_push(S, out, PH_UNTIL, (int32_t)o->hold_until);
        if (o->flags & VP_OPF_HOLD_SEG && mode != MODE_RECOMPUTE) {
            int32_t nx = -1;
            for (size_t k = 0; k < g->n_segs; k++)
                if (g->segs[k].first_op > i) {
                    nx = (int32_t)k;
                    break;
                }
            if (nx >= 0)
                pyhold_push(S, out, PH_SEG, nx);
        }
        tunref(S, out);
    } else {
        S->out_t[i] = NONE;
    }
    /* this op is done with its inputs */
    for (uint32_t j = 0; j < o->n_inputs; j++) {
        uint32_t in = o->inputs[j];
        if (g->ops[in].kind == VP_OP_INPUT)
            continue;
        if (refs_of && refs_of[in] == 0)
            continue; /* an input from outside a recomputed segment */
        tunref(S, S->out_t[in]);
    }
    /* the layer returns: its locals and its input (the caller's loop
     * variable) are dropped */
    if (o->segment >= 0 && i == g->segs[o->segment].last_op &&
        mode != MODE_RECOMPUTE) {
        pyhold_release(S, PH_LAYER, o->segment);
        pyhold_release(S, PH_ADD, -1);
        pyhold_release(S, PH_MODULE, -1);
        pyhold_release(S, PH_SEG, o->segment);
    }
    /* a module call returns: the caller's variable holding its argument
     * is reassigned (graph form, hold_input) */
    pyhold_release(S, PH_UNTIL, (int32_t)i);
}

/* ---- backward ------------------------------------------------------------ */

static void workspace_bwd(sim *S, bool lt)
{
    if (!S->ws_bwd) {
        S->ws_bwd = true;
        talloc(S, S->s->cublas_workspace, VP_CAT_WORKSPACE);
    }
    if (lt && !S->ws_bwd_lt) {
        S->ws_bwd_lt = true;
        talloc(S, S->s->cublaslt_workspace, VP_CAT_WORKSPACE);
    }
}

static void bwd_op(sim *S, uint32_t i);

/* Backward of op i, with its offloaded or compressed saved tensors brought
 * back (decompressed) for the time it runs. */
static void bwd(sim *S, uint32_t i)
{
    uint64_t back = S->reload[i];
    uint32_t r = NONE;
    if (back) {
        S->cur_op = S->g->ops[i].name;
        S->cur_op_idx = (int32_t)i;
        r = talloc(S, back, VP_CAT_ACT);
        if (S->s->offload_activations && S->host_now >= back)
            S->host_now -= back;
        S->reload[i] = 0;
    }
    bwd_op(S, i);
    tunref(S, r);
}

static void bwd_op(sim *S, uint32_t i)
{
    const vp_graph *g = S->g;
    const vp_op *o = &g->ops[i];
    S->cur_op = o->name;
    S->cur_op_idx = (int32_t)i;
    uint32_t gy = S->grad_t[i];
    S->grad_t[i] = NONE;
    bool gstr = S->glay[i]; /* gy is not in the output's memory order */
    S->glay[i] = 0;
    bool mha = o->flags & VP_OPF_TORCH_MHA;
    uint32_t in0 = o->n_inputs ? o->inputs[0] : NONE;
    bool ig0 = in0 != NONE && g->ops[in0].needs_grad;
    uint8_t eb0 = in0 != NONE ? S->out_eb[in0] : S->A;
    uint8_t oeb = S->out_eb[i];
    uint64_t n = o->numel;
    uint32_t gx = NONE;
    uint8_t gxe = eb0;
    bool gxs = false; /* gx strided */
    switch (o->kind) {
    case VP_OP_INPUT:
        break;
    case VP_OP_LINEAR:
    case VP_OP_CONV2D: {
        /* AddmmBackward / ConvolutionBackward: grad_x, grad_W, grad_b in
         * the compute dtype (with cuDNN's workspaces, or the bias-sum
         * staging); then the node drops grad_out and what it saved. Under
         * autocast each grad then goes through the ToCopyBackward of its
         * cast to fp32; the engine runs those in argument order (the
         * autocast wrapper evaluates its casts right to left, so the first
         * argument's node has the highest sequence number): b, x, W for
         * HF Conv1D's addmm(b, x, W); x, W, b for linear and conv. */
        bool bias = o->n_params > 1;
        bool conv = o->kind == VP_OP_CONV2D;
        uint8_t ce = S->amp ? 2 : eb0;
        uint64_t rows = o->in_features ? g->ops[in0].numel / o->in_features : 0;
        /* the forward's matmul path (see fwd) and torch_mha's in_proj, whose
         * grad comes back as the [3, L, N, E] buffer that the core's
         * backward assembles */
        bool mha_out = mha && g->ops[in0].kind == VP_OP_ATTENTION;
        bool mha_in = mha && !mha_out;
        bool mm = !conv && (mha_in ||
                            (S->lay[in0] && g->ops[in0].ndim >= 3));
        /* ViewBackward: the grad must be in the output's memory order to
         * be seen as 2-d; reshape copies it (torch_mha: out_proj's output
         * was returned transposed; in_proj's unflatten/transpose chain) */
        if (!conv && gy != NONE && (mha_in || S->lay[i] != gstr)) {
            uint32_t c = talloc(S, mulc(S, n, S->out_eb[i]), VP_CAT_TEMP);
            tunref(S, gy);
            gy = c;
        }
        /* cuDNN takes a contiguous grad_out: a copy of one that came back
         * through a permute (ViT's patch embedding), freed after the
         * filter gradient */
        uint32_t gc = conv && gstr && gy != NONE
                          ? talloc(S, mulc(S, n, S->out_eb[i]), VP_CAT_TEMP)
                          : NONE;
        if (!conv)
            workspace_bwd(S, false);
        uint32_t pw = o->params[0], pb = bias ? o->params[1] : NONE;
        uint32_t gw = NONE, gb = NONE;
        bool tw = g->params[pw].trainable;
        bool tb = bias && g->params[pb].trainable;
        uint32_t ew = S->amp ? 2 : param_bytes_of(S, &g->params[pw]);
        uint32_t eb = tb ? (S->amp ? 2 : param_bytes_of(S, &g->params[pb]))
                         : 0;
        if (mm) {
            /* the bias's AddBackward (add_ ran last) and its reduction,
             * then MmBackward: mat2 (W), then self (x); the grad of a
             * transposed input comes back transposed */
            if (tb) {
                gb = talloc(S, mulc(S, g->params[pb].numel, eb), VP_CAT_TEMP);
                bias_staging(S, rows, o->out_features);
            }
            if (tw)
                gw = talloc(S, mulc(S, g->params[pw].numel, ew), VP_CAT_TEMP);
            if (ig0) {
                gx = grad_like(S, in0, ce);
                gxe = ce;
                gxs = mha_in;
            }
        } else {
            if (ig0) {
                gx = grad_like(S, in0, ce);
                gxe = ce;
                if (conv)
                    transient(S, conv_ws(S, o, ce, CONV_BWD_DATA));
            }
            if (tw) {
                gw = talloc(S, mulc(S, g->params[pw].numel, ew), VP_CAT_TEMP);
                if (conv)
                    transient(S, conv_ws(S, o, ce, CONV_BWD_FILTER));
            }
            tunref(S, gc);
            if (tb) {
                gb = talloc(S, mulc(S, g->params[pb].numel, eb), VP_CAT_TEMP);
                /* the bias sum over rows (conv: over N, H, W) */
                if (!conv)
                    bias_staging(S, rows, o->out_features);
                else if (o->out_features)
                    bias_staging(S, n / o->out_features, o->out_features);
            }
        }
        tunref(S, gy);
        gy = NONE;
        release_saved(S, i);
        if (o->flags & VP_OPF_ADDMM) { /* addmm(b, x, W) */
            param_grad_cast(S, pb, gb);
            give_grad_l(S, in0, gx, gxe, gxs);
            param_grad_cast(S, pw, gw);
        } else { /* linear / conv (x, W, b) */
            give_grad_l(S, in0, gx, gxe, gxs);
            param_grad_cast(S, pw, gw);
            param_grad_cast(S, pb, gb);
        }
        gx = NONE;
        break;
    }
    case VP_OP_EMBEDDING: {
        const vp_param *p = &g->params[o->params[0]];
        uint64_t tokens = g->ops[in0].numel;
        if (o->shape[0] == 1 && g->batch > 1)
            tokens = o->numel / o->shape[o->ndim - 1];
        for (int k = 0; k < 4; k++)
            transient(S, mulc(S, tokens, 8));
        uint64_t seg = tokens / 10 + (tokens < o->classes ? tokens : o->classes);
        uint32_t buf = talloc(S, mulc(S, mulc(S, seg, o->shape[o->ndim - 1]), 4),
                              VP_CAT_TEMP);
        uint32_t dense = talloc(S, mulc(S, p->numel, S->PE), VP_CAT_TEMP);
        tunref(S, buf);
        param_grad(S, o->params[0], dense);
        break;
    }
    case VP_OP_LAYERNORM:
    case VP_OP_GROUPNORM:
    case VP_OP_RMSNORM: {
        uint8_t ce = S->amp ? 4 : eb0;
        bool ln = o->kind == VP_OP_LAYERNORM;
        if (o->kind == VP_OP_RMSNORM) {
            transient(S, mulc(S, n, 4));
            transient(S, mulc(S, n, 4));
        }
        /* layer_norm_backward_cuda: X.expect_contiguous() first, then dX,
         * dgamma, dbeta; the kernel copies a strided dY */
        uint32_t xc = ln && S->lay[in0]
                          ? talloc(S, mulc(S, n, ce), VP_CAT_TEMP)
                          : NONE;
        if (ig0) {
            gx = grad_like(S, in0, ce);
            gxe = ce;
        }
        for (uint32_t k = 0; k < o->n_params; k++)
            weight_grad(S, o->params[k], false);
        if (ln && gstr && gy != NONE)
            transient(S, mulc(S, n, oeb));
        tunref(S, xc);
        break;
    }
    case VP_OP_BATCHNORM2D:
        if (ig0)
            gx = grad_like(S, in0, eb0);
        weight_grad(S, o->params[0], false);
        weight_grad(S, o->params[1], false);
        break;
    case VP_OP_ATTENTION: {
        uint8_t ce = oeb;
        uint64_t bh = mulc(S, o->shape[0], o->heads);
        uint64_t qn = mulc(S, mulc(S, o->shape[0], o->q_len),
                           (uint64_t)o->heads * o->head_dim);
        uint64_t kvn = mulc(S, mulc(S, o->shape[0], o->kv_len),
                            (uint64_t)o->kv_heads * o->head_dim);
        vp_attn_impl impl = attn_impl_of(S, o, ce);
        uint32_t dq, dk, dv;
        /* torch_mha: the efficient kernel wants grad_out in [B, L, h, d]
         * order; it comes back sequence-first (the permute's grad) */
        bool mha_eff = mha && impl == VP_ATTN_EFFICIENT;
        uint32_t gcopy = mha_eff ? talloc(S, mulc(S, qn, ce), VP_CAT_TEMP)
                                 : NONE;
        uint32_t delta = NONE;
        if (impl == VP_ATTN_EAGER) {
            /* the nodes of eager_attention_forward in reverse (traced):
             * the output copy's backward, bmm(probs, v), dropout, the
             * ToCopy to fp32, softmax (two buffers), the mask add (cast
             * back), the scale, bmm(q, k^T); saved slots as in fwd() */
            uint64_t sc = mulc(S, mulc(S, bh, o->q_len), o->kv_len);
            uint8_t me = o->causal ? promote(ce, S->PE) : ce;
            uint8_t se = S->amp ? 4 : me;
            uint32_t t = talloc(S, mulc(S, qn, ce), VP_CAT_TEMP);
            tunref(S, gy);
            gy = NONE;
            dv = talloc(S, mulc(S, kvn, ce), VP_CAT_TEMP);
            uint32_t ga = talloc(S, mulc(S, sc, ce), VP_CAT_TEMP);
            tunref(S, t);
            drop_saved(S, i, 2);
            drop_saved(S, i, 5);
            if (o->dropout > 0) {
                uint32_t g2 = talloc(S, mulc(S, sc, ce), VP_CAT_TEMP);
                tunref(S, ga);
                ga = g2;
                drop_saved(S, i, 4);
            }
            if (se != ce) {
                uint32_t g3 = talloc(S, mulc(S, sc, se), VP_CAT_TEMP);
                tunref(S, ga);
                ga = g3;
            }
            uint32_t g4 = talloc(S, mulc(S, sc, se), VP_CAT_TEMP);
            transient(S, mulc(S, sc, se));
            tunref(S, ga);
            drop_saved(S, i, 3);
            ga = g4;
            if (me != ce) {
                uint32_t g5 = talloc(S, mulc(S, sc, ce), VP_CAT_TEMP);
                tunref(S, ga);
                ga = g5;
            }
            uint32_t g6 = talloc(S, mulc(S, sc, ce), VP_CAT_TEMP);
            tunref(S, ga);
            dq = talloc(S, mulc(S, qn, ce), VP_CAT_TEMP);
            dk = talloc(S, mulc(S, kvn, ce), VP_CAT_TEMP);
            tunref(S, g6);
            drop_saved(S, i, 0);
            drop_saved(S, i, 1);
        } else {
            dq = talloc(S, mulc(S, qn, ce), VP_CAT_TEMP);
            dk = talloc(S, mulc(S, kvn, ce), VP_CAT_TEMP);
            dv = talloc(S, mulc(S, kvn, ce), VP_CAT_TEMP);
        }
        if (mha_eff) {
            /* delta = (grad_out * out).sum(-1) in fp32 (traced on the
             * torch_mha path; the packed path leaves it out) */
            uint32_t t = talloc(S, mulc(S, qn, 4), VP_CAT_TEMP);
            uint32_t s1 = talloc(S, mulc(S, mulc(S, bh, o->q_len), 4),
                                 VP_CAT_TEMP);
            delta = talloc(S, mulc(S, mulc(S, bh, o->q_len), 4),
                           VP_CAT_TEMP);
            tunref(S, s1);
            tunref(S, t);
        }
        if (impl == VP_ATTN_FLASH || impl == VP_ATTN_EFFICIENT) {
            uint64_t ws = mulc(S, qn, 4);
            ws += mulc(S, mulc(S, bh, o->q_len), 4) + 256;
            transient(S, ws);
        } else if (impl == VP_ATTN_MATH) {
            uint64_t sc = mulc(S, mulc(S, bh, o->q_len), o->kv_len);
            uint8_t pe = impl == VP_ATTN_MATH ? 4 : ce;
            uint32_t t1 = talloc(S, mulc(S, sc, pe), VP_CAT_TEMP);
            uint32_t t2 = talloc(S, mulc(S, sc, pe), VP_CAT_TEMP);
            tunref(S, t1);
            tunref(S, t2);
        }
        tunref(S, delta);
        tunref(S, gcopy);
        tunref(S, gy);
        gy = NONE;
        release_saved(S, i);
        bool kvcopy = (o->flags & VP_OPF_KV_COPY) &&
                      !(o->segment >= 0 && S->ckpt[o->segment]);
        if (o->n_inputs == 1 && mha) {
            /* torch_mha: q, k, v are views of the packed projection:
             * q.view(L, N*h, d).transpose(0, 1).view(N, h, L, d). The two
             * ViewBackward nodes of each (v, k, q, in the engine's order)
             * reshape its grad, copying when it is not in the projection's
             * order: the efficient kernel writes [B, L, h, d] (two copies
             * each), math's bmm [B*h, L, d] (one), flash like q (none).
             * Then each SelectBackward of proj[0..2] makes a zero
             * [3, L, N, E] buffer, summed into the first (v's). */
            int rounds = impl == VP_ATTN_FLASH       ? 0
                         : impl == VP_ATTN_EFFICIENT ? 2
                                                     : 1;
            for (int r = 0; r < rounds; r++) {
                uint32_t *gs[3] = {&dv, &dk, &dq};
                for (int k = 0; k < 3; k++) {
                    uint32_t c = talloc(S, mulc(S, qn, ce), VP_CAT_TEMP);
                    tunref(S, *gs[k]);
                    *gs[k] = c;
                }
            }
            uint64_t pk = mulc(S, g->ops[in0].numel, ce);
            gx = talloc(S, pk, VP_CAT_TEMP);
            tunref(S, dv);
            uint32_t b = talloc(S, pk, VP_CAT_TEMP);
            tunref(S, dk);
            tunref(S, b);
            uint32_t c = talloc(S, pk, VP_CAT_TEMP);
            tunref(S, dq);
            tunref(S, c);
            gxe = ce;
        } else if (o->n_inputs == 1) {
            /* the cache's cat backward makes k's and v's grads contiguous
             * (one at a time), then split's backward cats q, k, v */
            if (kvcopy) {
                uint32_t a = talloc(S, mulc(S, kvn, ce), VP_CAT_TEMP);
                tunref(S, dk);
                dk = a;
                uint32_t b = talloc(S, mulc(S, kvn, ce), VP_CAT_TEMP);
                tunref(S, dv);
                dv = b;
            }
            gx = grad_like(S, in0, ce);
            tunref(S, dq);
            tunref(S, dk);
            tunref(S, dv);
            gxe = ce;
        } else {
            give_grad(S, o->inputs[0], dq, ce);
            give_grad(S, o->inputs[1], dk, ce);
            give_grad(S, o->inputs[2], dv, ce);
        }
        break;
    }
    case VP_OP_GELU_TANH: {
        /* The autograd nodes of 0.5*x * (1 + tanh(c*(x + 0.044715*x^3))),
         * run from the last (highest sequence number) to the first, as
         * traced (docs/SIMULATION_NOTES.md §3.5). F: the fp32 width under
         * autocast (pow is on the fp32 list), X: x's width. Saved:
         * [0] 0.5x, [1] x.float(), [2] tanh, [3] 1+tanh. */
        uint8_t fe = S->amp ? 4 : eb0;
        bool cast = fe != eb0;
        uint64_t nF = mulc(S, n, fe), nX = mulc(S, n, eb0);
        /* MulBackward0 (0.5x * u): both grads in F, 0.5x's cast to X */
        uint32_t a = talloc(S, nF, VP_CAT_TEMP);
        uint32_t b = talloc(S, nF, VP_CAT_TEMP);
        if (cast) {
            uint32_t a2 = talloc(S, nX, VP_CAT_TEMP);
            tunref(S, a);
            a = a2;
        }
        tunref(S, gy);
        gy = NONE;
        drop_saved(S, i, 3);
        drop_saved(S, i, 0);
        /* TanhBackward */
        uint32_t c = talloc(S, nF, VP_CAT_TEMP);
        tunref(S, b);
        drop_saved(S, i, 2);
        /* MulBackward0 (c * r) */
        uint32_t d = talloc(S, nF, VP_CAT_TEMP);
        tunref(S, c);
        /* AddBackward0 (x + q): x's share (cast to X) opens x's input
         * buffer; q's share passes through */
        uint32_t acc = d;
        if (cast)
            acc = talloc(S, nX, VP_CAT_TEMP);
        else
            tref(S, d);
        /* MulBackward0 (0.044715 * p) */
        uint32_t f = talloc(S, nF, VP_CAT_TEMP);
        tunref(S, d);
        /* PowBackward0: grad * 3 * x^2, three kernels */
        uint32_t t1 = talloc(S, nF, VP_CAT_TEMP);
        uint32_t t2 = talloc(S, nF, VP_CAT_TEMP);
        uint32_t t3 = talloc(S, nF, VP_CAT_TEMP);
        tunref(S, t1);
        tunref(S, t2);
        tunref(S, f);
        drop_saved(S, i, 1);
        /* ToCopyBackward0 of x.float(); summed in place into the buffer */
        if (cast) {
            uint32_t g2 = talloc(S, nX, VP_CAT_TEMP);
            tunref(S, t3);
            t3 = g2;
        }
        tunref(S, t3);
        /* MulBackward0 (0.5 * x), summed in place */
        uint32_t h = talloc(S, nX, VP_CAT_TEMP);
        tunref(S, a);
        tunref(S, h);
        if (ig0) {
            gx = acc;
            gxe = eb0;
        } else {
            tunref(S, acc);
        }
        break;
    }
    case VP_OP_RELU:
    case VP_OP_TANH:
    case VP_OP_SIGMOID:
    case VP_OP_GELU:
    case VP_OP_SILU:
    case VP_OP_DROPOUT:
    case VP_OP_SOFTMAX:
    case VP_OP_MAXPOOL2D:
    case VP_OP_AVGPOOL2D:
    case VP_OP_ADAPTIVE_AVGPOOL2D:
    case VP_OP_ROPE:
    case VP_OP_SELECT:
    case VP_OP_MOE_DISPATCH:
        if (o->kind == VP_OP_ROPE)
            transient(S, mulc(S, n, oeb));
        if (ig0)
            gx = grad_like(S, in0, eb0);
        break;
    case VP_OP_ROUTER:
        if (ig0)
            gx = grad_like(S, in0, eb0);
        break;
    case VP_OP_ADD:
    case VP_OP_MUL:
    case VP_OP_MOE_COMBINE:
    case VP_OP_CONCAT: {
        /* add/concat pass the gradient through (concat as views); mul
         * makes one per operand. Broadcast operands get a reduced copy. */
        for (uint32_t j = 0; j < o->n_inputs; j++) {
            uint32_t in = o->inputs[j];
            if (!g->ops[in].needs_grad)
                continue;
            if (o->kind == VP_OP_CONCAT && o->n_params) {
                /* prepended learned tokens: the input's grad is a narrow
                 * view of grad_out (a copy only to change the dtype) */
                tref(S, gy);
                give_grad_l(S, in, gy, oeb, gstr);
            } else if (o->kind == VP_OP_MUL || g->ops[in].numel != n ||
                       o->kind == VP_OP_MOE_COMBINE) {
                give_grad(S, in, grad_like(S, in, S->out_eb[in]),
                          S->out_eb[in]);
            } else {
                tref(S, gy);
                give_grad_l(S, in, gy, oeb, gstr);
            }
        }
        for (uint32_t k = 0; k < o->n_params; k++)
            weight_grad(S, o->params[k], false);
        break;
    }
    case VP_OP_FLATTEN:
    case VP_OP_RESHAPE:
    case VP_OP_PERMUTE:
        if (ig0) {
            tref(S, gy);
            gx = gy;
            gxe = oeb;
            /* through a permute the grad's order flips; a reshape that
             * copied gives it back in the input's dims order */
            gxs = o->kind == VP_OP_PERMUTE
                      ? gstr ^ ((o->flags & VP_OPF_STRIDED) != 0)
                      : (S->lay[in0] ? false : gstr);
        }
        break;
    case VP_OP_CROSS_ENTROPY:
    case VP_OP_MSE_LOSS: {
        uint64_t rc = mulc(S, o->rows, o->classes);
        if (o->kind == VP_OP_MSE_LOSS) {
            if (ig0)
                gx = grad_like(S, in0, eb0);
            break;
        }
        if (eb0 == 2 && !o->upcast_logits && S->amp) {
            uint32_t gn = talloc(S, mulc(S, rc, 4), VP_CAT_TEMP);
            /* saved: [lp16, lp32, ...]: NllLossBackward drops the fp32
             * log-probs before ToCopyBackward runs */
            tunref(S, S->saved[i * MAX_SAVED + 1]);
            S->saved[i * MAX_SAVED + 1] = NONE;
            uint32_t c16 = talloc(S, mulc(S, rc, 2), VP_CAT_TEMP);
            tunref(S, gn);
            gx = talloc(S, mulc(S, rc, 2), VP_CAT_TEMP);
            tunref(S, c16);
            gxe = 2;
        } else {
            uint8_t le = o->upcast_logits ? 4 : eb0;
            uint32_t gn = talloc(S, mulc(S, rc, le), VP_CAT_TEMP);
            uint32_t gl = talloc(S, mulc(S, rc, le), VP_CAT_TEMP);
            tunref(S, gn);
            release_saved(S, i);
            gx = gl;
            gxe = le;
        }
        break;
    }
    case VP_OP__COUNT:
        break;
    }
    tunref(S, gy);
    release_saved(S, i);
    if (gx != NONE)
        give_grad_l(S, in0, gx, gxe, gxs);
}

/* ---- the step ------------------------------------------------------------ */

static void phase_begin(sim *S, vp_phase ph)
{
    S->phase = ph;
    vp_allocator_stats st;
    vp_allocator_stats_get(S->a, &st);
    S->phase_peak = st.allocated;
}

static uint64_t allocated(sim *S)
{
    vp_allocator_stats st;
    vp_allocator_stats_get(S->a, &st);
    return st.allocated;
}

static void recompute(sim *S, const vp_segment *seg, uint32_t *refs_of)
{
    const vp_graph *g = S->g;
    uint32_t last = seg->first_op;
    /* early stop: the last op that saves something */
    for (uint32_t i = seg->first_op; i <= seg->last_op; i++) {
        vp_op_kind k = g->ops[i].kind;
        if (k != VP_OP_ADD && !is_view(k) && k != VP_OP_CONCAT)
            last = i;
    }
    for (uint32_t i = seg->first_op; i <= seg->last_op; i++)
        refs_of[i] = 0;
    for (uint32_t i = seg->first_op; i <= last; i++)
        for (uint32_t j = 0; j < g->ops[i].n_inputs; j++) {
            uint32_t in = g->ops[i].inputs[j];
            if (in >= seg->first_op && in <= last)
                refs_of[in]++;
        }
    /* inputs from outside the segment are passed with refs_of == 0 */
    uint32_t *saved_out = malloc((last - seg->first_op + 1) * sizeof *saved_out);
    if (!saved_out) {
        S->st = vp_error_set(S->err, VP_ENOMEM, "out of memory");
        return;
    }
    /* mark outside inputs: refs_of must be 0 for ops before first */
    for (uint32_t i = seg->first_op; i <= last && OK(S); i++) {
        saved_out[i - seg->first_op] = S->out_t[i];
        fwd(S, i, MODE_RECOMPUTE, refs_of);
    }
    pyhold_release(S, -1, -1); /* early stop unwinds the Python frames */
    clear_cast_cache(S);
    free(saved_out);
}

/* HF masking_utils (eager attention): the model builds one 4-D float
 * causal mask [B, 1, Sq, Sk] in its dtype before the decoder layers and
 * keeps it until its forward returns (traced: 16,777,216 B for GPT-2
 * B=4, S=1024 fp32). */
static void eager_mask(sim *S)
{
    const vp_graph *g = S->g;
    for (uint32_t i = 0; i < g->n_ops; i++) {
        const vp_op *o = &g->ops[i];
        if (o->kind != VP_OP_ATTENTION || !o->causal)
            continue;
        vp_attn_impl impl = S->s->attn_set ? S->s->attn : o->attn_impl;
        if (impl != VP_ATTN_EAGER)
            return;
        uint64_t e = mulc(S, mulc(S, o->shape[0], o->q_len), o->kv_len);
        uint32_t m = talloc(S, mulc(S, e, S->PE), VP_CAT_ACT);
        hold(S, m);
        tunref(S, m);
        return;
    }
}

static void forward_pass(sim *S)
{
    const vp_graph *g = S->g;
    for (uint32_t i = 0; i < g->n_ops && OK(S); i++) {
        const vp_op *o = &g->ops[i];
        bool ck = S->training && o->segment >= 0 && S->ckpt[o->segment];
        if (ck && g->segs[o->segment].first_op == i) {
            /* non-reentrant checkpoint saves the segment's inputs */
            const vp_segment *seg = &g->segs[o->segment];
            for (uint32_t k = seg->first_op; k <= seg->last_op; k++)
                for (uint32_t j = 0; j < g->ops[k].n_inputs; j++) {
                    uint32_t in = g->ops[k].inputs[j];
                    if (in < seg->first_op && g->ops[in].kind != VP_OP_INPUT)
                        ckpt_save_input(S, o->segment, S->out_t[in]);
                }
        }
        if (g->n_segs && i == g->segs[0].first_op)
            eager_mask(S);
        fwd(S, i, ck ? MODE_NOSAVE : MODE_SAVE, NULL);
    }
    pyhold_release(S, -1, -1);
    S->cur_op = "";
    S->cur_op_idx = -1;
}

static void backward_pass(sim *S, uint32_t loss, uint32_t *refs_of)
{
    const vp_graph *g = S->g;
    S->cur_op = "loss";
    uint32_t seed = talloc(S, 4, VP_CAT_TEMP); /* ones */
    uint32_t div = talloc(S, 4, VP_CAT_TEMP);  /* loss / accum */
    tunref(S, seed);
    S->grad_t[loss] = div;
    int32_t active_seg = -1;
    for (uint32_t ii = (uint32_t)g->n_ops; ii-- > 0 && OK(S);) {
        const vp_op *o = &g->ops[ii];
        if (o->segment >= 0 && S->ckpt[o->segment] &&
            o->segment != active_seg) {
            const vp_segment *seg = &g->segs[o->segment];
            active_seg = o->segment;
            /* the segment's saved inputs are dropped after its backward;
             * recompute now (the first unpack triggers it) */
            if (S->grad_t[ii] != NONE || ii != seg->last_op)
                recompute(S, seg, refs_of);
        }
        if (S->grad_t[ii] == NONE) {
            release_saved(S, ii);
            if (S->s->offload_activations && S->host_now >= S->reload[ii])
                S->host_now -= S->reload[ii];
            S->reload[ii] = 0;
            continue;
        }
        bwd(S, ii);
        if (o->segment >= 0 && S->ckpt[o->segment] &&
            ii == g->segs[o->segment].first_op)
            ckpt_release_inputs(S, o->segment);
    }
    S->cur_op = "";
}

static void optimizer_step(sim *S)
{
    const vp_graph *g = S->g;
    size_t np = g->n_params;
    vp_optimizer opt = S->s->optimizer;
    S->cur_op = "optimizer";
    S->cur_op_idx = -1;
    bool adam = opt == VP_OPT_ADAMW || opt == VP_OPT_ADAMW_FUSED ||
                opt == VP_OPT_ADAMW_FORLOOP || opt == VP_OPT_ADAMW_8BIT;
    if (S->s->precision == VP_PREC_AMP_FP16) {
        /* GradScaler: found_inf, scale */
        transient(S, 4);
    }
    if (S->s->offload_optimizer) {
        /* CPU optimizer: each gradient goes down to the host, the updated
         * weight comes back into the parameter in place; the state (and a
         * fp32 master copy of half-precision weights) lives on the host */
        uint64_t state = 0, moved = 0;
        for (size_t p = 0; p < np; p++) {
            const vp_param *pp = &g->params[p];
            if (!pp->trainable || S->pgrad[p] == NONE)
                continue;
            uint64_t n = pp->numel;
            uint64_t per = adam ? (opt == VP_OPT_ADAMW_8BIT ? 2 : 8)
                           : opt == VP_OPT_SGD ? 4 : 0;
            per += 4;                 /* the gradient's host copy      */
            if (S->PE == 2)
                per += 4;             /* fp32 master weights           */
            state += mulc(S, n, per);
            moved += mulc(S, n, 2 * (uint64_t)S->PE);
        }
        if (state > S->out->host_bytes)
            S->out->host_bytes = state;
        S->out->host_traffic += moved;
        S->cur_op = "";
        return;
    }
    for (size_t p = 0; p < np && OK(S); p++) {
        const vp_param *pp = &g->params[p];
        if (!pp->trainable || S->pgrad[p] == NONE || S->st1[p] != NONE)
            continue;
        uint64_t b = mulc(S, pp->numel, S->PE);
        if (adam) {
            uint64_t sb = opt == VP_OPT_ADAMW_8BIT
                              ? pp->numel + (pp->numel + 255) / 256 * 4
                              : b;
            S->st1[p] = talloc(S, sb, VP_CAT_OPTIM);
            S->st2[p] = talloc(S, sb, VP_CAT_OPTIM);
            if (opt == VP_OPT_ADAMW_FUSED)
                talloc(S, 4, VP_CAT_OPTIM); /* device step: never freed */
        } else if (opt == VP_OPT_SGD) {
            S->st1[p] = talloc(S, b, VP_CAT_OPTIM);
        } else if (opt == VP_OPT_ADAFACTOR) {
            /* torch.optim.Adafactor: no first moment; the second moment
             * of a matrix is factored into fp32 row and column statistics
             * (rows + columns), a vector keeps a full fp32 variance; plus
             * a 4-byte step */
            const vp_op *po = &g->ops[pp->op];
            uint64_t elems = pp->numel;
            if (po->kind == VP_OP_EMBEDDING && po->classes &&
                po->params[0] == p) {
                elems = po->classes + pp->numel / po->classes;
            } else if ((po->kind == VP_OP_LINEAR ||
                        po->kind == VP_OP_CONV2D) &&
                       po->params[0] == p && po->out_features) {
                elems = po->out_features + pp->numel / po->out_features;
            }
            S->st1[p] = talloc(S, mulc(S, elems, 4) + 4, VP_CAT_OPTIM);
        }
    }
    if (opt == VP_OPT_ADAMW) {
        uint32_t *tmp = calloc(np ? np : 1, sizeof *tmp);
        if (!tmp) {
            S->st = vp_error_set(S->err, VP_ENOMEM, "out of memory");
            return;
        }
        for (size_t p = 0; p < np; p++) {
            tmp[p] = NONE;
            if (g->params[p].trainable && S->pgrad[p] != NONE)
                tmp[p] = talloc(S, mulc(S, g->params[p].numel, S->PE),
                                VP_CAT_TEMP);
        }
        for (size_t p = np; p-- > 0;)
            tunref(S, tmp[p]);
        free(tmp);
    } else if (opt == VP_OPT_ADAMW_FORLOOP || opt == VP_OPT_ADAMW_8BIT ||
               opt == VP_OPT_ADAFACTOR) {
        uint32_t prev = NONE;
        for (size_t p = 0; p < np && OK(S); p++) {
            if (!g->params[p].trainable || S->pgrad[p] == NONE)
                continue;
            uint64_t b = mulc(S, g->params[p].numel,
                              opt == VP_OPT_ADAMW_8BIT ? 4 : S->PE);
            uint32_t t1 = talloc(S, b, VP_CAT_TEMP);
            uint32_t t2 = talloc(S, b, VP_CAT_TEMP);
            tunref(S, t1);
            tunref(S, prev);
            prev = t2;
        }
        tunref(S, prev);
    }
    S->cur_op = "";
}

static void zero_grad(sim *S)
{
    if (!S->s->set_to_none)
        return;
    for (size_t p = 0; p < S->g->n_params; p++) {
        if (S->pgrad[p] != NONE) {
            uint32_t id = S->pgrad[p];
            S->pgrad[p] = NONE;
            tunref(S, id);
        }
    }
}

static void load_model(sim *S)
{
    const vp_graph *g = S->g;
    S->phase = VP_PHASE_SETUP;
    S->cur_op = "model";
    /* the process's first GEMM made the main-thread cuBLAS workspace */
    talloc(S, S->s->cublas_workspace, VP_CAT_WORKSPACE);
    if (!S->s->fresh_process) {
        S->ws_fwd_lt = S->ws_bwd = true;
        talloc(S, S->s->cublaslt_workspace, VP_CAT_WORKSPACE);
        talloc(S, S->s->cublas_workspace, VP_CAT_WORKSPACE);
    }
    vp_allocator_stats st;
    vp_allocator_stats_get(S->a, &st);
    S->out->baseline = st.allocated;
    /* Construction, in parameter order, in fp32 (the module's default
     * dtype). A head tied to the embedding (HF tie_weights) is first built
     * with a weight of its own, which tying frees: a transient of
     * in x out x 4 B that leaves a free segment behind (GPT-2's lm_head:
     * 154 MB; BERT's decoder, built between its bias and the head's own
     * bias). Then model.to(half) converts each parameter in the same
     * order: the half copy is made before the fp32 original is freed. */
    uint32_t *fp32 = calloc(g->n_params ? g->n_params : 1, sizeof *fp32);
    if (!fp32) {
        S->st = vp_error_set(S->err, VP_ENOMEM, "out of memory");
        return;
    }
    uint32_t tied = NONE, tied_op = 0;
    for (uint32_t i = 0; i < g->n_ops; i++)
        if (g->ops[i].flags & VP_OPF_TIED_INIT) {
            tied_op = i;
            break;
        }
    bool tied_done = !(g->n_ops && g->ops[tied_op].flags & VP_OPF_TIED_INIT);
    for (size_t p = 0; p <= g->n_params && OK(S); p++) {
        if (!tied_done && (p == g->n_params || g->params[p].op >= tied_op)) {
            const vp_op *to = &g->ops[tied_op];
            tied = talloc(S, mulc(S, mulc(S, to->in_features,
                                          to->out_features), 4),
                          VP_CAT_TEMP);
            tied_done = true;
            if (p == g->n_params || g->params[p].op != tied_op) {
                tunref(S, tied);
                tied = NONE;
            }
        }
        if (p == g->n_params)
            break;
        const vp_param *pp = &g->params[p];
        uint32_t pb = param_bytes_of(S, pp);
        fp32[p] = talloc(S, mulc(S, pp->numel, S->half && pb == 2 ? 4 : pb),
                         VP_CAT_PARAM);
        if (tied != NONE) {
            tunref(S, tied);
            tied = NONE;
        }
    }
    for (size_t p = 0; p < g->n_params && OK(S); p++) {
        const vp_param *pp = &g->params[p];
        if (S->int8 && S->int8[p]) {
            /* quantized as it loads: int8 weight and a fp32 scale per
             * output row; the original is freed */
            const vp_op *lo = &g->ops[pp->op];
            talloc(S, mulc(S, pp->numel, 1) + mulc(S, lo->out_features, 4),
                   VP_CAT_PARAM);
            tunref(S, fp32[p]);
        } else if (S->half && param_bytes_of(S, pp) == 2) {
            talloc(S, mulc(S, pp->numel, 2), VP_CAT_PARAM);
            tunref(S, fp32[p]);
        }
    }
    free(fp32);
    S->out->after_model = allocated(S) - S->out->baseline;
}

static void alloc_batch(sim *S, uint32_t *batch, size_t *nb)
{
    const vp_graph *g = S->g;
    *nb = 0;
    S->cur_op = "batch";
    for (uint32_t i = 0; i < g->n_ops; i++) {
        const vp_op *o = &g->ops[i];
        if (o->kind == VP_OP_INPUT) {
            uint8_t e = o->value == VP_VAL_INDEX ? 8 : S->half ? 2 : 4;
            if (S->half && o->value == VP_VAL_FLOAT) {
                uint32_t f = talloc(S, mulc(S, o->numel, 4), VP_CAT_INPUT);
                batch[(*nb)++] = talloc(S, mulc(S, o->numel, e), VP_CAT_INPUT);
                tunref(S, f);
            } else {
                batch[(*nb)++] = talloc(S, mulc(S, o->numel, e), VP_CAT_INPUT);
            }
            S->out_t[i] = batch[*nb - 1];
            S->out_eb[i] = e;
        } else if ((o->kind == VP_OP_CROSS_ENTROPY || o->kind == VP_OP_MSE_LOSS) &&
                   *nb < 8) {
            uint64_t tb = o->kind == VP_OP_CROSS_ENTROPY
                              ? mulc(S, o->rows, 8)
                              : mulc(S, g->ops[o->inputs[0]].numel, 4);
            batch[(*nb)++] = talloc(S, tb, VP_CAT_INPUT);
        }
    }
    S->cur_op = "";
}

static vp_status run(sim *S)
{
    const vp_graph *g = S->g;
    const vp_setup *s = S->s;
    vp_estimate *out = S->out;
    uint32_t *refs_of = calloc(g->n_ops ? g->n_ops : 1, sizeof *refs_of);
    if (!refs_of)
        return vp_error_set(S->err, VP_ENOMEM, "out of memory");
    load_model(S);
    uint32_t loss = NONE;
    for (uint32_t i = 0; i < g->n_ops; i++)
        if (g->ops[i].kind == VP_OP_CROSS_ENTROPY ||
            g->ops[i].kind == VP_OP_MSE_LOSS)
            loss = i;
    if (S->training && loss == NONE) {
        free(refs_of);
        return vp_error_set(S->err, VP_EARG,
                            "the model has no loss op to train with; use "
                            "--inference or add a loss");
    }
    uint32_t accum = S->training ? s->accum : 1;
    for (uint32_t step = 1; step <= s->steps && OK(S); step++) {
        S->step = step;
        vp_phase_peaks *pk = &out->step[step - 1];
        memset(pk, 0, sizeof *pk);
        uint64_t fwd_peak = 0, bwd_peak = 0;
        uint32_t batch[8];
        size_t nb = 0;
        uint32_t loss_t = NONE;
        for (uint32_t mb = 0; mb < accum && OK(S); mb++) {
            if (mb == 0) {
                S->phase = VP_PHASE_FORWARD;
                alloc_batch(S, batch, &nb);
                pk->start = allocated(S) - out->baseline;
            } else {
                tunref(S, loss_t); /* del loss */
                for (size_t k = 0; k < nb; k++)
                    tunref(S, batch[k]);
                alloc_batch(S, batch, &nb);
            }
            if (mb == 0)
                phase_begin(S, VP_PHASE_FORWARD);
            else
                S->phase = VP_PHASE_FORWARD;
            forward_pass(S);
            if (!OK(S))
                break;
            release_held(S);
            loss_t = loss != NONE ? S->out_t[loss] : NONE;
            /* the training loop divides by accum: a new scalar */
            if (S->training) {
                uint32_t l2 = talloc(S, 4, VP_CAT_TEMP);
                tunref(S, loss_t);
                loss_t = l2;
                S->out_t[loss] = NONE;
            }
            clear_cast_cache(S); /* autocast.__exit__ */
            if (!S->training && loss_t != NONE) {
                tunref(S, loss_t);
                loss_t = NONE;
            }
            if (S->phase_peak > fwd_peak)
                fwd_peak = S->phase_peak;
            pk->after_fwd = allocated(S) - out->baseline;
            if (!S->training)
                break;
            phase_begin(S, VP_PHASE_BACKWARD);
            backward_pass(S, loss, refs_of);
            if (S->phase_peak > bwd_peak)
                bwd_peak = S->phase_peak;
        }
        if (!OK(S))
            break;
        pk->peak[VP_PHASE_FORWARD] = fwd_peak - out->baseline;
        if (S->training) {
            pk->peak[VP_PHASE_BACKWARD] = bwd_peak - out->baseline;
            pk->after_bwd = allocated(S) - out->baseline;
            phase_begin(S, VP_PHASE_OPTIMIZER);
            optimizer_step(S);
            if (S->cat_live[VP_CAT_OPTIM] > out->optim_bytes)
                out->optim_bytes = S->cat_live[VP_CAT_OPTIM];
            pk->peak[VP_PHASE_OPTIMIZER] = S->phase_peak - out->baseline;
            zero_grad(S);
            tunref(S, loss_t);
        }
        for (size_t k = 0; k < nb; k++)
            tunref(S, batch[k]);
        pk->end = allocated(S) - out->baseline;
        vp_allocator_stats st;
        vp_allocator_stats_get(S->a, &st);
        pk->reserved = st.reserved;
        out->steps = step;
    }
    free(refs_of);
    return S->st;
}

/* ---- entry point ----------------------------------------------------------- */

static void sim_destroy(sim *S)
{
    vp_allocator_free(S->a);
    free(S->t);
    free(S->free_ids);
    free(S->out_t);
    free(S->out_eb);
    free(S->lay);
    free(S->glay);
    free(S->saved);
    free(S->n_saved);
    free(S->grad_t);
    free(S->consumers);
    free(S->reload);
    free(S->sel);
    free(S->int8);
    free(S->pgrad);
    free(S->cast);
    free(S->st1);
    free(S->st2);
    free(S->ckpt);
    free(S->held);
    free(S->ckin);
    free(S->ph);
}

static vp_status sim_init(sim *S, const vp_graph *g, const vp_setup *s,
                          vp_estimate *out, vp_error *err)
{
    memset(S, 0, sizeof *S);
    S->g = g;
    S->s = s;
    S->err = err;
    S->out = out;
    S->cur_op_idx = -1;
    size_t no = g->n_ops ? g->n_ops : 1, np = g->n_params ? g->n_params : 1;
    S->a = vp_allocator_new(&s->alloc, err);
    if (!S->a)
        return err ? err->code : VP_ENOMEM;
    S->out_t = malloc(no * sizeof *S->out_t);
    S->out_eb = calloc(no, 1);
    S->lay = calloc(no, 1);
    S->glay = calloc(no, 1);
    S->saved = malloc(no * MAX_SAVED * sizeof *S->saved);
    S->n_saved = calloc(no, 1);
    S->grad_t = malloc(no * sizeof *S->grad_t);
    S->consumers = calloc(no, sizeof *S->consumers);
    S->reload = calloc(no, sizeof *S->reload);
    S->pgrad = malloc(np * sizeof *S->pgrad);
    S->cast = malloc(np * sizeof *S->cast);
    S->st1 = malloc(np * sizeof *S->st1);
    S->st2 = malloc(np * sizeof *S->st2);
    S->ckpt = calloc(g->n_segs ? g->n_segs : 1, sizeof *S->ckpt);
    if (!S->out_t || !S->out_eb || !S->lay || !S->glay || !S->saved ||
        !S->n_saved || !S->grad_t || !S->consumers || !S->reload ||
        !S->pgrad || !S->cast || !S->st1 || !S->st2 || !S->ckpt)
        return vp_error_set(err, VP_ENOMEM, "out of memory");
    for (size_t i = 0; i < no; i++)
        S->out_t[i] = S->grad_t[i] = NONE;
    for (size_t p = 0; p < np; p++)
        S->pgrad[p] = S->cast[p] = S->st1[p] = S->st2[p] = NONE;
    for (size_t i = 0; i < g->n_ops; i++)
        for (uint32_t j = 0; j < g->ops[i].n_inputs; j++)
            S->consumers[g->ops[i].inputs[j]]++;
    for (size_t k = 0; k < g->n_segs && k < s->n_checkpoint; k++)
        S->ckpt[k] = s->checkpoint ? s->checkpoint[k] : false;
    S->recompute_slot = -1;
    S->sel = calloc(g->n_segs ? g->n_segs : 1, sizeof *S->sel);
    if (!S->sel)
        return vp_error_set(err, VP_ENOMEM, "out of memory");
    for (size_t k = 0; k < g->n_segs && k < s->n_selective; k++)
        S->sel[k] = s->selective ? s->selective[k] : false;
    vp_precision p = s->precision;
    S->amp = p == VP_PREC_AMP_BF16 || p == VP_PREC_AMP_FP16;
    S->half = p == VP_PREC_BF16 || p == VP_PREC_FP16;
    S->A = p == VP_PREC_FP32 ? 4 : 2;
    S->PE = S->half ? 2 : 4;
    S->training = !s->inference;
    if (s->weight_bits == 8) {
        /* INT8 weights: the weights of linear layers that own them (a
         * weight tied to an embedding stays as it is) */
        S->int8 = calloc(np, sizeof *S->int8);
        if (!S->int8)
            return vp_error_set(err, VP_ENOMEM, "out of memory");
        for (size_t i = 0; i < g->n_ops; i++) {
            const vp_op *o = &g->ops[i];
            if (o->kind == VP_OP_LINEAR && o->n_params &&
                g->params[o->params[0]].op == i)
                S->int8[o->params[0]] = true;
        }
    } else if (s->weight_bits != 0) {
        return vp_error_set(err, VP_EARG,
                            "weight_bits must be 0 or 8 (INT8 weights)");
    }
    if (s->weight_bits && S->training)
        return vp_error_set(err, VP_EARG,
                            "INT8 weights are frozen: use them for "
                            "inference");
    if (s->act_bits && s->act_bits != 2 && s->act_bits != 4 &&
        s->act_bits != 8)
        return vp_error_set(err, VP_EARG,
                            "activation compression takes 2, 4 or 8 bits");
    return VP_OK;
}

/* Live activation bytes by layer at the peak event: a second run that
 * stops there. */
static void layer_breakdown(const vp_graph *g, const vp_setup *s,
                            vp_estimate *out, uint64_t at)
{
    sim S;
    vp_estimate tmp;
    memset(&tmp, 0, sizeof tmp);
    vp_error e2;
    if (sim_init(&S, g, s, &tmp, &e2) != VP_OK) {
        sim_destroy(&S);
        return;
    }
    S.stop_at = at;
    run(&S);
    size_t nb = g->n_segs + 1;
    uint64_t *bytes = calloc(nb, sizeof *bytes);
    if (bytes) {
        for (size_t i = 0; i < S.nt; i++) {
            const tensor *t = &S.t[i];
            if (!t->refs || t->op < 0)
                continue;
            if (t->cat != VP_CAT_ACT && t->cat != VP_CAT_TEMP)
                continue;
            int32_t seg = g->ops[t->op].segment;
            bytes[seg >= 0 ? (size_t)seg : g->n_segs] += t->bytes;
        }
        out->n_top_layers = 0;
        for (uint32_t k = 0; k < VP_TOP_LAYERS; k++) {
            size_t best = nb;
            for (size_t b = 0; b < nb; b++)
                if (bytes[b] && (best == nb || bytes[b] > bytes[best]))
                    best = b;
            if (best == nb)
                break;
            vp_layer_bytes *lb = &out->top_layers[out->n_top_layers++];
            snprintf(lb->name, sizeof lb->name, "%s",
                     best < g->n_segs ? g->segs[best].name
                                      : "(outside layers: embeddings, head, "
                                        "loss)");
            lb->bytes = bytes[best];
            bytes[best] = 0;
        }
        free(bytes);
    }
    sim_destroy(&S);
}

vp_status vp_simulate(const vp_graph *g, const vp_setup *s, vp_estimate *out,
                      vp_sim_event_fn on_event, void *ud, vp_error *err)
{
    vp_error_clear(err);
    memset(out, 0, sizeof *out);
    if (s->batch == 0 || s->accum == 0 || s->steps == 0 ||
        s->steps > VP_MAX_STEPS)
        return vp_error_set(err, VP_EARG,
                            "invalid setup: batch and accum must be >= 1, "
                            "steps 1..%d",
                            VP_MAX_STEPS);
    if ((unsigned)s->precision >= VP_PREC__COUNT ||
        (unsigned)s->optimizer >= VP_OPT__COUNT)
        return vp_error_set(err, VP_EARG, "invalid precision or optimizer");
    sim S;
    vp_status st = sim_init(&S, g, s, out, err);
    if (st == VP_OK) {
        S.cb = on_event;
        S.ud = ud;
        st = run(&S);
    }
    vp_allocator_stats as;
    if (S.a) {
        vp_allocator_stats_get(S.a, &as);
        out->peak_reserved = as.peak_reserved;
        out->num_alloc_retries = as.num_alloc_retries;
    }
    uint64_t peak_event = out->events;
    out->events = S.events;
    sim_destroy(&S);
    /* figures relative to the allocations before the model */
    out->peak_alloc = out->peak_alloc >= out->baseline
                          ? out->peak_alloc - out->baseline
                          : 0;
    if (out->by_category[VP_CAT_WORKSPACE] >= out->baseline)
        out->by_category[VP_CAT_WORKSPACE] -= out->baseline;
    (void)vp_graph_num_params(g, &out->params, NULL);
    for (size_t p = 0; p < g->n_params; p++) {
        const vp_param *pp = &g->params[p];
        uint64_t eb = pp->elem_bytes_override ? pp->elem_bytes_override
                      : pp->fp32_buffer                   ? 4
                      : (s->precision == VP_PREC_BF16 ||
                         s->precision == VP_PREC_FP16)
                          ? 2
                          : 4;
        uint64_t b;
        if (!vp_mul_u64(pp->numel, eb, &b) ||
            !vp_add_u64(out->param_bytes, b, &out->param_bytes) ||
            (pp->trainable && !vp_add_u64(out->grad_bytes, b, &out->grad_bytes)))
            return vp_error_set(err, VP_EOVERFLOW,
                                "parameter bytes overflow 64 bits");
    }
    /* optim_bytes: the state held after the optimizer steps (set in run) */
    for (uint32_t k = 0; k < out->steps; k++) {
        uint64_t m = 0;
        for (int ph = VP_PHASE_FORWARD; ph < VP_PHASE__COUNT; ph++)
            if (out->step[k].peak[ph] > m)
                m = out->step[k].peak[ph];
        if (k + 1 == out->steps)
            out->peak_alloc_steady = m;
    }
    out->device_used = out->peak_reserved + s->context_bytes;
    if (out->steps)
        out->host_traffic /= out->steps; /* per step */
    double f = 0;
    for (size_t i = 0; i < g->n_ops; i++) {
        f += g->ops[i].flops_fwd;
        if (!s->inference)
            f += g->ops[i].flops_bwd;
        if (!s->inference && g->ops[i].segment >= 0 &&
            (size_t)g->ops[i].segment < s->n_checkpoint && s->checkpoint &&
            s->checkpoint[g->ops[i].segment])
            f += g->ops[i].flops_fwd;
    }
    out->flops_per_step = f * (s->inference ? 1 : s->accum);
    if (st == VP_OK && peak_event && !s->skip_breakdown)
        layer_breakdown(g, s, out, peak_event);
    return st;
}
