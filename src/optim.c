/* optimizer.step(): the state each optimizer makes at its first step and
 * the temporaries of every step, or, offloaded, what goes to the host.
 * docs/SIMULATION_NOTES.md §3.7; PyTorch torch/optim/adamw.py
 * (_multi_tensor_adamw, _single_tensor_adamw, fused), sgd.py,
 * _adafactor.py; bitsandbytes optim/optimizer.py (Optimizer2State,
 * Optimizer8bit: blockwise quantization of 2048 values with one fp32
 * absmax). */
#include <stdlib.h>

#include "sim_internal.h"

/* The step's temporaries. */
typedef enum {
    TEMPS_NONE,
    TEMPS_FOREACH, /* torch._foreach_sqrt(exp_avg_sq): one per parameter,
                      all alive at once, freed in reverse             */
    TEMPS_FORLOOP  /* per parameter, two; the second lives until the next
                      parameter's are made                            */
} temps_kind;

typedef struct {
    void (*state)(sim *S, uint32_t p); /* first step; NULL: stateless    */
    temps_kind temps;
    uint8_t temp_eb;        /* bytes per temporary element; 0: the params' */
    uint8_t host_state_eb;  /* offloaded: state bytes per element on host  */
} optim_rules;

/* The optimizer's tensors: the parameters, or what a data-parallel
 * wrapper gives the optimizer (its shards; sim_internal.h, opt_numel). */
static uint64_t opt_numel(const sim *S, size_t k)
{
    return S->opt_numel ? S->opt_numel[k] : S->g->params[k].numel;
}

/* The bytes per element of the optimizer's tensor k: a wrapper's shards
 * are in its dtype; a parameter in its own (a frozen or quantized base's
 * dtype may differ from the trainable parameters', vp__param_bytes). */
static uint32_t opt_eb(const sim *S, size_t k)
{
    return S->opt_eb ? S->opt_eb : vp__param_bytes(S, &S->g->params[k]);
}

static uint64_t param_bytes_total(sim *S, uint32_t p)
{
    return vp__mulc(S, opt_numel(S, p), opt_eb(S, p));
}

/* AdamW: exp_avg and exp_avg_sq in the parameter's dtype */
static void adam_state(sim *S, uint32_t p)
{
    uint64_t b = param_bytes_total(S, p);
    S->st1[p] = vp__talloc(S, b, VP_CAT_OPTIM);
    S->st2[p] = vp__talloc(S, b, VP_CAT_OPTIM);
}

/* fused AdamW: the same, and a device-side step count (never freed) */
static void adam_fused_state(sim *S, uint32_t p)
{
    adam_state(S, p);
    vp__talloc(S, 4, VP_CAT_OPTIM);
}

/* bitsandbytes AdamW8bit and PagedAdamW8bit, one class (optim/optimizer.py,
 * Optimizer2State.init_state and Optimizer8bit.get_state_buffer; adamw.py,
 * AdamW8bit and PagedAdamW8bit differ only in is_paged): a parameter of
 * fewer than min_8bit_size = 4096 values keeps two fp32 moments; a larger
 * one two uint8 moments and, block_wise being the default, an fp32 absmax
 * per block of 2048 values each (init_state: blocks = n // 2048, plus one
 * for a remainder; functional.py, optimizer_update_8bit_blockwise, reads
 * them as they are), the two 256-value fp32 quantization maps moved to the
 * GPU once. Paged, a state buffer of 1e5 values or more goes through
 * F.get_paged (cudaMallocManaged), outside the caching allocator, counted
 * in paged_bytes (and in device_used, resident while the step runs);
 * smaller ones, and every one unpaged, are torch.zeros_like. st1 and st2
 * keep the absmax tensors when the moments are paged. */
#define BNB_MIN_8BIT 4096u
#define BNB_PAGED_MIN 100000u
#define BNB_OPT_BLOCK 2048u
#define BNB_QMAP 1024u

static uint32_t state_buffer(sim *S, uint64_t n, uint64_t eb, bool paged)
{
    uint64_t b = vp__mulc(S, n, eb);
    if (!paged || n < BNB_PAGED_MIN)
        return vp__talloc(S, b, VP_CAT_OPTIM);
    if (!vp_add_u64(S->out->paged_bytes, b, &S->out->paged_bytes))
        S->st = vp_error_set(S->err, VP_EOVERFLOW, "paged bytes overflow");
    return NONE;
}

static void bnb_8bit_state(sim *S, uint32_t p, bool paged)
{
    uint64_t n = opt_numel(S, p);
    if (n < BNB_MIN_8BIT) {
        S->st1[p] = state_buffer(S, n, 4, paged);
        S->st2[p] = state_buffer(S, n, 4, paged);
        return;
    }
    if (!S->qmaps) { /* name2qmap["dynamic"], ["udynamic"] .to(device) */
        vp__talloc(S, BNB_QMAP, VP_CAT_OPTIM);
        vp__talloc(S, BNB_QMAP, VP_CAT_OPTIM);
        S->qmaps = true;
    }
    uint64_t ab = (n / BNB_OPT_BLOCK + (n % BNB_OPT_BLOCK != 0)) * 4;
    uint32_t s1 = state_buffer(S, n, 1, paged);
    uint32_t s2 = state_buffer(S, n, 1, paged);
    uint32_t a1 = vp__talloc(S, ab, VP_CAT_OPTIM);
    uint32_t a2 = vp__talloc(S, ab, VP_CAT_OPTIM);
    S->st1[p] = s1 != NONE ? s1 : a1;
    S->st2[p] = s2 != NONE ? s2 : a2;
}

static void adam_8bit_state(sim *S, uint32_t p)
{
    bnb_8bit_state(S, p, false);
}

static void paged_8bit_state(sim *S, uint32_t p)
{
    bnb_8bit_state(S, p, true);
}

/* SGD with momentum: the momentum buffer */
static void sgd_state(sim *S, uint32_t p)
{
    S->st1[p] = vp__talloc(S, param_bytes_total(S, p), VP_CAT_OPTIM);
}

/* torch.optim.Adafactor: no first moment; the second moment of a matrix
 * is factored into fp32 row and column statistics (rows + columns), a
 * vector keeps a full fp32 variance; plus a 4-byte step */
static void adafactor_state(sim *S, uint32_t p)
{
    const vp_param *pp = &S->g->params[p];
    const vp_op *po = &S->g->ops[pp->op];
    uint64_t elems = pp->numel;
    if (po->kind == VP_OP_EMBEDDING && po->classes && po->params[0] == p) {
        elems = po->classes + pp->numel / po->classes;
    } else if ((po->kind == VP_OP_LINEAR || po->kind == VP_OP_CONV2D) &&
               po->params[0] == p && po->out_features) {
        elems = po->out_features + pp->numel / po->out_features;
    }
    S->st1[p] = vp__talloc(S, vp__mulc(S, elems, 4) + 4, VP_CAT_OPTIM);
}

static const optim_rules OPTIM[VP_OPT__COUNT] = {
    [VP_OPT_ADAMW] = {adam_state, TEMPS_FOREACH, 0, 8},
    [VP_OPT_ADAMW_FUSED] = {adam_fused_state, TEMPS_NONE, 0, 8},
    [VP_OPT_ADAMW_FORLOOP] = {adam_state, TEMPS_FORLOOP, 0, 8},
    [VP_OPT_SGD] = {sgd_state, TEMPS_NONE, 0, 4},
    [VP_OPT_SGD_PLAIN] = {NULL, TEMPS_NONE, 0, 0},
    [VP_OPT_ADAFACTOR] = {adafactor_state, TEMPS_FORLOOP, 0, 0},
    [VP_OPT_ADAMW_8BIT] = {adam_8bit_state, TEMPS_FORLOOP, 4, 2},
    [VP_OPT_PAGED_ADAMW_8BIT] = {paged_8bit_state, TEMPS_FORLOOP, 4, 2},
    [VP_OPT_NONE] = {NULL, TEMPS_NONE, 0, 0},
};

/* A tensor the optimizer updates this step. */
static bool stepped(const sim *S, size_t p)
{
    if (S->opt_on)
        return S->opt_on[p];
    return S->g->params[p].trainable && S->pgrad[p] != NONE;
}

/* CPU optimizer: each gradient goes down to the host, the updated weight
 * comes back into the parameter in place; the state (and a fp32 master
 * copy of half-precision weights) lives on the host */
static void offloaded_step(sim *S, const optim_rules *r)
{
    uint64_t state = 0, moved = 0;
    for (size_t p = 0; p < S->n_opt; p++) {
        if (!stepped(S, p))
            continue;
        uint64_t n = opt_numel(S, p);
        uint64_t pe = opt_eb(S, p);
        uint64_t per = r->host_state_eb;
        per += 4;     /* the gradient's host copy */
        if (pe == 2)
            per += 4; /* fp32 master weights      */
        state += vp__mulc(S, n, per);
        moved += vp__mulc(S, n, 2 * pe);
    }
    if (state > S->out->host_bytes)
        S->out->host_bytes = state;
    S->out->host_traffic += moved;
}

static void foreach_temps(sim *S)
{
    size_t np = S->n_opt;
    uint32_t *tmp = calloc(np ? np : 1, sizeof *tmp);
    if (!tmp) {
        S->st = vp_error_set(S->err, VP_ENOMEM, "out of memory");
        return;
    }
    for (size_t p = 0; p < np; p++) {
        tmp[p] = NONE;
        if (stepped(S, p))
            tmp[p] = vp__talloc(S, param_bytes_total(S, (uint32_t)p),
                                VP_CAT_TEMP);
    }
    for (size_t p = np; p-- > 0;)
        vp__tunref(S, tmp[p]);
    free(tmp);
}

static void forloop_temps(sim *S, uint8_t eb)
{
    uint32_t prev = NONE;
    for (size_t p = 0; p < S->n_opt && OK(S); p++) {
        if (!stepped(S, p))
            continue;
        uint64_t b = eb ? vp__mulc(S, opt_numel(S, p), eb)
                        : param_bytes_total(S, (uint32_t)p);
        uint32_t t1 = vp__talloc(S, b, VP_CAT_TEMP);
        uint32_t t2 = vp__talloc(S, b, VP_CAT_TEMP);
        vp__tunref(S, t1);
        vp__tunref(S, prev);
        prev = t2;
    }
    vp__tunref(S, prev);
}

void vp__optimizer_step(sim *S)
{
    const optim_rules *r = &OPTIM[S->s->optimizer];
    S->cur_op = "optimizer";
    S->cur_op_idx = -1;
    if (S->s->precision == VP_PREC_AMP_FP16) {
        /* GradScaler: found_inf, scale */
        vp__transient(S, 4);
    }
    if (S->s->offload_optimizer) {
        offloaded_step(S, r);
        S->cur_op = "";
        return;
    }
    for (size_t p = 0; p < S->n_opt && OK(S); p++) {
        if (!stepped(S, p) || S->st1[p] != NONE || !r->state)
            continue;
        r->state(S, (uint32_t)p);
    }
    if (r->temps == TEMPS_FOREACH)
        foreach_temps(S);
    else if (r->temps == TEMPS_FORLOOP)
        forloop_temps(S, r->temp_eb);
    S->cur_op = "";
}
