/* The training-step simulator: the exact sequence of allocations and frees
 * that PyTorch 2.11 performs for a graph, fed through the caching-allocator
 * model. This file runs the step: the forward and backward of each op
 * through its rules (vp__op_table; src/ops/), checkpointed segments and
 * their recomputation, the Python references that keep tensors alive, the
 * model's load, the input batch, the phases and the entry point. The rules
 * follow docs/SIMULATION_NOTES.md (read from the allocator's own traces)
 * and shared/docs/PYTORCH_MEMORY.md; sim_internal.h has the code map. */
#include <stdlib.h>
#include <string.h>

#include "allocator_internal.h"
#include "dist_internal.h"

/* Kinds of Python references (struct vp__pyhold). */
enum { PH_MODULE, PH_ADD, PH_LAYER, PH_SEG, PH_UNTIL };
_Static_assert(PH_UNTIL + 1 == VP__PH_KINDS, "VP__PH_KINDS: the PH_ kinds");

/* Modules built with a weight of their own that tying frees (T5: 3). */
#define MAX_TIED_LATE 4

/* Tensors of the input batch: the inputs and the losses' targets. */
#define MAX_BATCH VP__MAX_BATCH

/* ---- references held by Python variables and checkpointed segments ------ */

static void pyhold_push(sim *S, uint32_t id, uint8_t kind, int32_t seg)
{
    if (id == NONE)
        return;
    if (!vp__grow((void **)&S->ph, &S->cap_ph, S->n_ph + 1,
                  sizeof(struct vp__pyhold))) {
        S->st = vp_error_set(S->err, VP_ENOMEM, "out of memory");
        return;
    }
    vp__tref(S, id);
    S->ph[S->n_ph++] = (struct vp__pyhold){id, kind, seg};
    S->n_ph_kind[kind]++;
    if (kind == PH_UNTIL && seg < S->ph_until_min)
        S->ph_until_min = seg;
}

/* Drop the Python references of one kind (kind < 0: all; seg >= 0: only
 * those tied to that layer), innermost (latest) first (pyhold_release's
 * look at them all, which finds again the lowest op that hold_until
 * entries wait for). */
static void pyhold_scan(sim *S, int kind, int32_t seg)
{
    int32_t until_min = INT32_MAX; /* of the PH_UNTIL entries kept */
    size_t k = S->n_ph;
    while (k-- > 0) {
        struct vp__pyhold h = S->ph[k];
        if ((kind >= 0 && h.kind != kind) || (seg >= 0 && h.seg != seg)) {
            if (h.kind == PH_UNTIL && h.seg < until_min)
                until_min = h.seg;
            continue;
        }
        memmove(&S->ph[k], &S->ph[k + 1], (S->n_ph - k - 1) * sizeof h);
        S->n_ph--;
        S->n_ph_kind[h.kind]--;
        vp__tunref(S, h.id);
    }
    if (kind < 0 || kind == PH_UNTIL)
        S->ph_until_min = until_min;
}

/* pyhold_scan, but not for a kind that holds nothing, nor for the
 * hold_until entries of an op before the lowest one they wait for (every
 * op asks for its own). */
static inline void pyhold_release(sim *S, int kind, int32_t seg)
{
    if (kind >= 0 && (S->n_ph_kind[kind] == 0 ||
                      (kind == PH_UNTIL && seg < S->ph_until_min)))
        return;
    pyhold_scan(S, kind, seg);
}

void vp__hold_layer(sim *S, uint32_t id, int32_t seg)
{
    if (seg >= 0)
        pyhold_push(S, id, PH_LAYER, seg);
}

void vp__hold_until(sim *S, uint32_t id, uint32_t op)
{
    pyhold_push(S, id, PH_UNTIL, (int32_t)op);
}

void vp__release_pyholds(sim *S)
{
    pyhold_release(S, -1, -1);
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
    vp__tref(S, id);
    S->ckin[S->n_ckin].seg = seg;
    S->ckin[S->n_ckin].id = id;
    S->n_ckin++;
}

static void ckpt_release_inputs(sim *S, int32_t seg)
{
    size_t w = 0;
    for (size_t k = 0; k < S->n_ckin; k++) {
        if (S->ckin[k].seg == seg)
            vp__tunref(S, S->ckin[k].id);
        else
            S->ckin[w++] = S->ckin[k];
    }
    S->n_ckin = w;
}

/* ---- forward -------------------------------------------------------------- */

/* What happens to an op's output once its rule has made it: the
 * consumers' references, and the Python variables that outlive the
 * consumers (graph.h, VP_OPF_HOLD_*). */
static void keep_output(sim *S, const vp__fwd_op *f)
{
    const vp_graph *g = S->g;
    const vp_op *o = f->o;
    uint32_t i = f->i, out = f->out;
    S->t[out].refs += f->refs;
    S->out_t[i] = out;
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
    if ((o->flags & VP_OPF_HOLD_OUT) && f->mode != MODE_RECOMPUTE)
        vp__hold(S, out);
    if (o->hold_until > i)
        pyhold_push(S, out, PH_UNTIL, (int32_t)o->hold_until);
    if (o->flags & VP_OPF_HOLD_SEG && f->mode != MODE_RECOMPUTE) {
        int32_t nx = -1;
        for (size_t k = 0; k < g->n_segs; k++)
            if (g->segs[k].first_op > i) {
                nx = (int32_t)k;
                break;
            }
        if (nx >= 0)
            pyhold_push(S, out, PH_SEG, nx);
    }
    vp__tunref(S, out); /* the rule's creation reference */
}

/* After op i's forward: it is done with its inputs; a layer that returns
 * drops its locals and its input (the caller's loop variable); a module
 * call that returns reassigns the caller's variable holding its argument
 * (graph form, hold_input). */
static void fwd_done(sim *S, const vp__fwd_op *f, const uint32_t *refs_of)
{
    const vp_graph *g = S->g;
    const vp_op *o = f->o;
    uint32_t i = f->i;
    for (uint32_t j = 0; j < o->n_inputs; j++) {
        uint32_t in = o->inputs[j];
        if (g->ops[in].kind == VP_OP_INPUT)
            continue;
        if (refs_of && refs_of[in] == 0)
            continue; /* an input from outside a recomputed segment */
        vp__tunref(S, S->out_t[in]);
    }
    if (o->segment >= 0 && i == g->segs[o->segment].last_op &&
        f->mode != MODE_RECOMPUTE) {
        pyhold_release(S, PH_LAYER, o->segment);
        pyhold_release(S, PH_ADD, -1);
        pyhold_release(S, PH_MODULE, -1);
        pyhold_release(S, PH_SEG, o->segment);
    }
    pyhold_release(S, PH_UNTIL, (int32_t)i);
}

/* Forward of op i. refs_of: the consumers' references during a
 * recomputation (NULL: all its consumers). */
void vp__fwd(sim *S, uint32_t i, vp__fwd_mode mode, const uint32_t *refs_of)
{
    const vp_graph *g = S->g;
    const vp_op *o = &g->ops[i];
    S->cur_op = o->name;
    S->cur_op_idx = (int32_t)i;
    S->saving_offloadable = mode == MODE_SAVE;
    vp__fwd_op f;
    f.i = i;
    f.o = o;
    f.mode = mode;
    f.sv = S->training && mode != MODE_NOSAVE && o->needs_grad;
    f.in0 = o->n_inputs ? o->inputs[0] : NONE;
    f.eb0 = f.in0 != NONE ? S->out_eb[f.in0] : S->A;
    f.n = o->numel;
    f.out = NONE;
    f.oeb = f.eb0;
    /* the output's layout: by default that of the first input (elementwise
     * ops: TensorIterator follows the first operand's strides) */
    f.ol = f.in0 != NONE ? S->lay[f.in0] : 0;
    f.refs = refs_of ? refs_of[i] : S->consumers[i];
    if (o->flags & VP_OPF_HOLD_FWD && mode == MODE_SAVE)
        f.refs++;
    if (o->flags & VP_OPF_MODEL_END && mode != MODE_RECOMPUTE) {
        for (uint32_t j = 0; j < i; j++)
            if (g->ops[j].flags & VP_OPF_HOLD_FWD && S->out_t[j] != NONE)
                vp__tunref(S, S->out_t[j]);
    }
    const vp__op_rules *r = &vp__op_table[o->kind];
    if (!r->fwd)
        return; /* the input: made with the batch */
    r->fwd(S, &f);
    vp__release_op_casts(S);
    if (!OK(S))
        return;
    S->out_eb[i] = f.oeb;
    S->lay[i] = f.ol;
    if (f.out != NONE)
        keep_output(S, &f);
    else
        S->out_t[i] = NONE;
    fwd_done(S, &f, refs_of);
}

/* ---- backward ------------------------------------------------------------- */

/* Backward of op i: its rule, then the first input's gradient handed on,
 * the output's gradient and the saved tensors dropped. */
static void bwd_op(sim *S, uint32_t i)
{
    const vp_graph *g = S->g;
    const vp_op *o = &g->ops[i];
    S->cur_op = o->name;
    S->cur_op_idx = (int32_t)i;
    vp__bwd_op b;
    b.i = i;
    b.o = o;
    b.gy = S->grad_t[i];
    S->grad_t[i] = NONE;
    b.gstr = S->glay[i];
    S->glay[i] = 0;
    b.in0 = o->n_inputs ? o->inputs[0] : NONE;
    b.ig0 = b.in0 != NONE && g->ops[b.in0].needs_grad;
    b.eb0 = b.in0 != NONE ? S->out_eb[b.in0] : S->A;
    b.oeb = S->out_eb[i];
    b.n = o->numel;
    b.gx = NONE;
    b.gxe = b.eb0;
    b.gxs = false;
    const vp__op_rules *r = &vp__op_table[o->kind];
    if (r->bwd)
        r->bwd(S, &b);
    vp__tunref(S, b.gy);
    vp__release_saved(S, i);
    if (b.gx != NONE)
        vp__give_grad_l(S, b.in0, b.gx, b.gxe, b.gxs);
}

/* Backward of op i, with its offloaded or compressed saved tensors brought
 * back (decompressed) for the time it runs. */
static void bwd(sim *S, uint32_t i)
{
    uint64_t back = S->reload[i];
    uint32_t r = NONE;
    if (back) {
        S->cur_op = S->g->ops[i].name;
        S->cur_op_idx = (int32_t)i;
        r = vp__talloc(S, back, VP_CAT_ACT);
        if (S->s->offload_activations && S->host_now >= back)
            S->host_now -= back;
        S->reload[i] = 0;
    }
    bwd_op(S, i);
    vp__tunref(S, r);
}
/* ---- the step ------------------------------------------------------------ */

static void phase_begin(sim *S, vp_phase ph)
{
    S->phase = ph;
    vp_allocator_stats st;
    vp_allocator_stats_get(S->a, &st);
    S->phase_peak = st.allocated;
}

uint64_t vp__allocated(sim *S)
{
    vp_allocator_stats st;
    vp_allocator_stats_get(S->a, &st);
    return st.allocated;
}

/* Recompute a checkpointed segment for its backward, up to the last op
 * that saves something. */
static void recompute(sim *S, const vp_segment *seg, uint32_t *refs_of)
{
    const vp_graph *g = S->g;
    uint32_t last = seg->first_op;
    /* early stop: the last op that saves something */
    for (uint32_t i = seg->first_op; i <= seg->last_op; i++) {
        if (!(vp__op_table[g->ops[i].kind].traits & VP__TRAIT_PASSTHROUGH))
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
    for (uint32_t i = seg->first_op; i <= last && OK(S); i++) {
        if (S->dist)
            vp__dist_recompute_op(S, i, false);
        vp__fwd(S, i, MODE_RECOMPUTE, refs_of);
        if (S->dist && OK(S))
            vp__dist_recompute_op(S, i, true);
    }
    if (S->dist && OK(S))
        vp__dist_recompute_end(S);
    /* the counts hold for this recomputation only: an op of this segment
     * that a later one consumes (T5's position bias) is from outside when
     * that one recomputes */
    for (uint32_t i = seg->first_op; i <= seg->last_op; i++)
        refs_of[i] = 0;
    pyhold_release(S, -1, -1); /* early stop unwinds the Python frames */
    vp__clear_cast_cache(S);
}

static void forward_pass(sim *S)
{
    const vp_graph *g = S->g;
    if (S->dist)
        vp__dist_fwd_begin(S);
    /* the model's masks before its first layer (of the chunk) */
    uint32_t mask_at = NONE, end = vp__op_end(S);
    for (size_t k = 0; k < g->n_segs && mask_at == NONE; k++)
        if (g->segs[k].first_op >= S->op_lo)
            mask_at = g->segs[k].first_op;
    for (uint32_t i = S->op_lo; i < end && OK(S); i++) {
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
        if (i == mask_at)
            vp__attention_model_mask(S);
        if (S->dist)
            vp__dist_fwd_op(S, i, false);
        vp__fwd(S, i, ck ? MODE_NOSAVE : MODE_SAVE, NULL);
        if (S->dist && OK(S))
            vp__dist_fwd_op(S, i, true);
    }
    if (S->dist && OK(S))
        vp__dist_fwd_end(S);
    pyhold_release(S, -1, -1);
    S->cur_op = "";
    S->cur_op_idx = -1;
}

/* The backward from the gradients already given (grad_t of the loss, or
 * of a pipeline stage's output). */
static void backward_ops(sim *S, uint32_t *refs_of)
{
    const vp_graph *g = S->g;
    if (S->dist)
        vp__dist_bwd_begin(S);
    memset(S->gview, 0, g->n_params ? g->n_params : 1);
    int32_t active_seg = -1;
    for (uint32_t ii = vp__op_end(S); ii-- > S->op_lo && OK(S);) {
        const vp_op *o = &g->ops[ii];
        if (S->dist)
            vp__dist_bwd_op(S, ii, false);
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
            vp__release_saved(S, ii);
            if (S->s->offload_activations && S->host_now >= S->reload[ii])
                S->host_now -= S->reload[ii];
            S->reload[ii] = 0;
        } else {
            bwd(S, ii);
            if (o->segment >= 0 && S->ckpt[o->segment] &&
                ii == g->segs[o->segment].first_op)
                ckpt_release_inputs(S, o->segment);
        }
        if (S->dist && OK(S))
            vp__dist_bwd_op(S, ii, true);
    }
    if (S->dist && OK(S))
        vp__dist_bwd_end(S);
    S->cur_op = "";
}

static void backward_pass(sim *S, uint32_t loss, uint32_t *refs_of)
{
    S->cur_op = "loss";
    uint32_t seed = vp__talloc(S, 4, VP_CAT_TEMP); /* ones */
    uint32_t div = vp__talloc(S, 4, VP_CAT_TEMP);  /* loss / accum */
    vp__tunref(S, seed);
    S->grad_t[loss] = div;
    backward_ops(S, refs_of);
}

static void zero_grad(sim *S)
{
    if (S->dist)
        vp__dist_zero_grad(S);
    if (!S->s->set_to_none)
        return;
    for (size_t p = 0; p < S->g->n_params; p++) {
        if (S->pgrad[p] != NONE) {
            uint32_t id = S->pgrad[p];
            S->pgrad[p] = NONE;
            vp__tunref(S, id);
        }
    }
}

/* Bytes per element the model holds a parameter in: its dtype, but a
 * data-parallel wrapper's MixedPrecision keeps an fp32 model while the
 * ops run in half precision (dist.c, precision). */
static uint32_t held_bytes(const sim *S, const vp_param *pp)
{
    uint32_t pb = vp__param_bytes(S, pp);
    if (S->dist && pb == 2 && S->dist->model_eb == 4)
        return 4;
    return pb;
}

/* Bytes per element a parameter is built with: fp32 first when the model
 * is built in fp32 and cast (the half copy follows, load_cast); the dtype
 * it is loaded in otherwise (a parameter that a quantized base upcasts to
 * fp32 is loaded in the base's half dtype first, kbit_upcast). */
static uint32_t build_bytes(const sim *S, const vp_param *pp)
{
    uint32_t pb = held_bytes(S, pp);
    if (S->s->ft.load == VP_LOAD_FP32_CAST && pb == 2 && !pp->fp32_buffer &&
        !pp->elem_bytes_override)
        return 4;
    if (S->kbit && pb == 4 && S->PE == 2 && !pp->fp32_buffer &&
        pp->elem_bytes_override == 4)
        return 2;
    return pb;
}

/* The weights that modules tied to an earlier embedding are built with
 * (VP_OPF_TIED_LATE, HF T5: each stack's embed_tokens and lm_head), in
 * the build dtype (teb bytes, as construct's tied head): each made once
 * the parameters of the ops up to its own are, all freed when the model
 * ties them once built, the last made first (traced:
 * groundtruth/traces/t5-base-*). L holds those made so far (at most
 * MAX_TIED_LATE) and the op the scan resumes at, so that construction
 * reads the ops once, not once per parameter; p is the next parameter to
 * be made (n_params: the end). On the meta device they take no memory
 * (the caller skips). */
typedef struct {
    uint32_t t[MAX_TIED_LATE]; /* the tensors made so far */
    size_t n;
    uint32_t next_op; /* where the scan for the next one resumes */
} tied_lates;

static void tied_late(sim *S, size_t p, uint32_t teb, tied_lates *L)
{
    const vp_graph *g = S->g;
    uint32_t i = L->next_op;
    for (; i < g->n_ops && L->n < MAX_TIED_LATE && OK(S); i++) {
        const vp_op *o = &g->ops[i];
        if (!(o->flags & VP_OPF_TIED_LATE))
            continue;
        if (p < g->n_params && g->params[p].op <= i)
            break;
        uint64_t w = o->kind == VP_OP_EMBEDDING
                         ? vp__mulc(S, o->classes, o->shape[o->ndim - 1])
                         : vp__mulc(S, o->in_features, o->out_features);
        L->t[L->n++] = vp__talloc(S, vp__mulc(S, w, teb), VP_CAT_TEMP);
    }
    L->next_op = i;
}

static void tied_late_free(sim *S, const tied_lates *L)
{
    if (!L->n)
        return;
    vp__tunref(S, L->t[L->n - 1]);
    for (size_t k = 0; k + 1 < L->n; k++)
        vp__tunref(S, L->t[k]);
}

/* Construction, in parameter order (the adapters come later). A head
 * tied to the embedding (HF tie_weights) is first built with a weight of
 * its own, in the build dtype, which tying frees: a transient that leaves
 * a free segment behind (GPT-2's lm_head: 154 MB in fp32; BERT's decoder,
 * built between its bias and the head's own bias); on the meta device it
 * takes no memory. A quantized weight is quantized as it loads
 * (ops/quant.c). built[p] is the tensor made. */
/* PyTorch tensor parallelism (vp_param.tp_dim): the whole tensor is
 * built, tp times the rank's share. */
uint64_t vp__tp_whole(const vp_graph *g, const vp_param *pp)
{
    return pp->tp_dim && g->has_tf && g->tf.dtensor && g->tf.sp > 1
               ? g->tf.sp
               : 1;
}

static bool in_segment(const vp_graph *g, uint32_t op)
{
    for (size_t k = 0; k < g->n_segs; k++)
        if (op >= g->segs[k].first_op && op <= g->segs[k].last_op)
            return true;
    return false;
}

/* apply_tp (torchtitan parallelize.py; the plan as parallelize_module
 * walks it: the model's own modules, then each layer's in order):
 * distribute_tensor of each sharded parameter (Shard._shard_tensor,
 * placement_types.py): _split_tensor(contiguous=True) copies the tp
 * chunks of a Shard(1) tensor (those of Shard(0) are views), empty_like
 * makes the rank's share, the copies go on return and the whole tensor
 * when register_parameter replaces it. */
static void tp_distribute(sim *S, uint32_t *built)
{
    const vp_graph *g = S->g;
    uint32_t tp = g->has_tf && g->tf.dtensor ? g->tf.sp : 1;
    if (tp <= 1)
        return;
    uint32_t *tmp = malloc(tp * sizeof *tmp);
    if (!tmp) {
        S->st = vp_error_set(S->err, VP_ENOMEM, "out of memory");
        return;
    }
    S->cur_op = "apply_tp";
    for (int layers = 0; layers < 2; layers++) {
        for (size_t p = 0; p < g->n_params && OK(S); p++) {
            const vp_param *pp = &g->params[p];
            if (vp__tp_whole(g, pp) == 1 || built[p] == NONE ||
                in_segment(g, pp->op) != (layers == 1))
                continue;
            uint64_t b = vp__mulc(S, pp->numel, build_bytes(S, pp));
            uint32_t n = pp->tp_dim == 2 ? tp : 0;
            for (uint32_t k = 0; k < n; k++)
                tmp[k] = vp__talloc(S, b, VP_CAT_TEMP);
            uint32_t t = vp__talloc(S, b, VP_CAT_PARAM);
            for (uint32_t k = 0; k < n; k++)
                vp__tunref(S, tmp[k]);
            vp__tunref(S, built[p]);
            built[p] = t;
        }
    }
    free(tmp);
    S->cur_op = "model";
}

static void construct(sim *S, uint32_t *built)
{
    const vp_graph *g = S->g;
    uint32_t tied = NONE, tied_op = 0;
    for (uint32_t i = 0; i < g->n_ops; i++)
        if (g->ops[i].flags & VP_OPF_TIED_INIT) {
            tied_op = i;
            break;
        }
    bool tied_done = !(g->n_ops && g->ops[tied_op].flags & VP_OPF_TIED_INIT) ||
                     S->s->ft.load == VP_LOAD_META;
    uint32_t teb = S->s->ft.load == VP_LOAD_FP32_CAST ||
                           (S->dist && S->dist->model_eb == 4)
                       ? 4
                       : S->PE;
    bool meta = S->s->ft.load == VP_LOAD_META;
    tied_lates late = {.n = 0, .next_op = 0};
    for (size_t p = 0; p <= g->n_params && OK(S); p++) {
        if (p < g->n_params && g->params[p].adapter)
            continue;
        if (!tied_done && (p == g->n_params || g->params[p].op >= tied_op)) {
            const vp_op *to = &g->ops[tied_op];
            tied = vp__talloc(S, vp__mulc(S, vp__mulc(S, to->in_features,
                                                      to->out_features),
                                          teb),
                              VP_CAT_TEMP);
            tied_done = true;
            if (p == g->n_params || g->params[p].op != tied_op) {
                vp__tunref(S, tied);
                tied = NONE;
            }
        }
        if (p == g->n_params)
            break;
        if (!meta)
            tied_late(S, p, teb, &late);
        const vp_param *pp = &g->params[p];
        if (pp->quant)
            vp__quant_load(S, (uint32_t)p);
        else
            built[p] = vp__talloc(S, vp__mulc(S, vp__mulc(S, pp->numel,
                                                          vp__tp_whole(g, pp)),
                                              build_bytes(S, pp)),
                                  VP_CAT_PARAM);
        if (S->dist && OK(S))
            vp__dist_param_built(S, (uint32_t)p, &built[p]);
        if (tied != NONE) {
            vp__tunref(S, tied);
            tied = NONE;
        }
    }
    if (!meta)
        tied_late(S, g->n_params, teb, &late);
    tied_late_free(S, &late);
}

/* model.to(half) after an fp32 build, parameter by parameter (the half
 * copy is made before the fp32 original is freed); INT8 weights for
 * inference (weight_bits) quantized likewise; a quantized base's other
 * half-precision parameters upcast to fp32 (prepare_model_for_kbit_
 * training), then torch.cuda.empty_cache(). built[p] becomes the
 * converted tensor (a data-parallel wrapper frees it once sharded). */
void vp__model_convert(sim *S, uint32_t *built)
{
    const vp_graph *g = S->g;
    for (size_t p = 0; p < g->n_params && OK(S); p++) {
        const vp_param *pp = &g->params[p];
        uint32_t pb = held_bytes(S, pp);
        if (pp->adapter || pp->quant || built[p] == NONE)
            continue;
        if (S->int8 && S->int8[p]) {
            /* quantized as it loads: int8 weight and a fp32 scale per
             * output row; the original is freed */
            const vp_op *lo = &g->ops[pp->op];
            uint32_t t = vp__talloc(S, vp__mulc(S, pp->numel, 1) +
                                           vp__mulc(S, lo->out_features, 4),
                                    VP_CAT_PARAM);
            vp__tunref(S, built[p]);
            built[p] = t;
        } else if (build_bytes(S, pp) != pb) {
            uint32_t t = vp__talloc(S, vp__mulc(S, pp->numel, pb),
                                    VP_CAT_PARAM);
            vp__tunref(S, built[p]);
            built[p] = t;
        }
    }
    if (S->kbit)
        vp_allocator_empty_cache(S->a);
}

/* get_peft_model: each target's adapters made on the GPU in the base
 * layer's dtype (lora_A, lora_B, DoRA's magnitude, target by target;
 * peft tuners_utils.py, _move_adapter_to_device_of_base_layer), then cast
 * to fp32 one by one (autocast_adapter_dtype: _cast_adapter_dtype). A
 * quantized base layer has no float dtype: its adapters stay fp32. */
static void add_adapters(sim *S)
{
    const vp_graph *g = S->g;
    size_t np = g->n_params;
    uint32_t *half = calloc(np ? np : 1, sizeof *half);
    if (!half) {
        S->st = vp_error_set(S->err, VP_ENOMEM, "out of memory");
        return;
    }
    S->cur_op = "peft";
    for (size_t p = 0; p < np && OK(S); p++) {
        const vp_param *pp = &g->params[p];
        half[p] = NONE;
        if (!pp->adapter)
            continue;
        uint32_t pb = vp__param_bytes(S, pp);
        const vp_op *lo = &g->ops[pp->op];
        const vp_param *w = &g->params[g->ops[lo->inputs[1]].params[0]];
        uint32_t made = pb == 4 && S->PE == 2 && !w->quant ? 2 : pb;
        if (lo->n_params > 2 && p == lo->params[2]) {
            /* DoRA's magnitude (dora.py update_layer): the row norms of
             * W + scaling * (lora_B @ lora_A), in the adapters' dtype */
            uint64_t nw = vp__mulc(S, w->numel, made);
            uint32_t lw = vp__talloc(S, nw, VP_CAT_TEMP);
            uint32_t sc = vp__talloc(S, nw, VP_CAT_TEMP);
            uint32_t sum = vp__talloc(S, nw, VP_CAT_TEMP);
            vp__tunref(S, sc);
            uint32_t t = vp__talloc(S, vp__mulc(S, pp->numel, made),
                                    VP_CAT_PARAM);
            vp__tunref(S, lw);
            vp__tunref(S, sum);
            if (made != pb)
                half[p] = t;
            continue;
        }
        uint32_t t = vp__talloc(S, vp__mulc(S, pp->numel, made), VP_CAT_PARAM);
        if (made != pb)
            half[p] = t;
    }
    for (size_t p = 0; p < np && OK(S); p++) {
        if (half[p] == NONE)
            continue;
        const vp_param *pp = &g->params[p];
        vp__talloc(S, vp__mulc(S, pp->numel, vp__param_bytes(S, pp)),
                   VP_CAT_PARAM);
        vp__tunref(S, half[p]);
    }
    free(half);
}

void vp__load_model(sim *S)
{
    const vp_graph *g = S->g;
    S->phase = VP_PHASE_SETUP;
    S->cur_op = "model";
    /* the process's first GEMM made the main-thread cuBLAS workspace */
    vp__talloc(S, S->s->cublas_workspace, VP_CAT_WORKSPACE);
    if (!S->s->fresh_process) {
        S->ws_fwd_lt = S->ws_bwd = true;
        vp__talloc(S, S->s->cublaslt_workspace, VP_CAT_WORKSPACE);
        vp__talloc(S, S->s->cublas_workspace, VP_CAT_WORKSPACE);
    }
    vp_allocator_stats st;
    vp_allocator_stats_get(S->a, &st);
    S->out->baseline = st.allocated;
    uint32_t *built = malloc((g->n_params ? g->n_params : 1) * sizeof *built);
    if (!built) {
        S->st = vp_error_set(S->err, VP_ENOMEM, "out of memory");
        return;
    }
    for (size_t p = 0; p < g->n_params; p++)
        built[p] = NONE;
    construct(S, built);
    tp_distribute(S, built);
    if (!S->dist || !vp__dist_wrap(S, built))
        vp__model_convert(S, built);
    free(built);
    S->out->load_peak = S->peak - S->out->baseline;
    add_adapters(S);
    S->cur_op = "";
    S->out->after_model = vp__allocated(S) - S->out->baseline;
    S->out->setup_peak = S->peak - S->out->baseline;
}

static void alloc_batch(sim *S, uint32_t *batch, size_t *nb)
{
    const vp_graph *g = S->g;
    *nb = 0;
    S->cur_op = "batch";
    for (uint32_t i = S->op_lo; i < vp__op_end(S); i++) {
        const vp_op *o = &g->ops[i];
        if (o->kind == VP_OP_INPUT) {
            uint8_t e = o->value == VP_VAL_INDEX ? 8 : S->half ? 2 : 4;
            if (S->recv_set && o->value == VP_VAL_FLOAT) {
                vp__tref(S, S->recv_in); /* the stage's receive buffer */
                batch[(*nb)++] = S->recv_in;
            } else if (S->half && o->value == VP_VAL_FLOAT) {
                uint32_t f = vp__talloc(S, vp__mulc(S, o->numel, 4), VP_CAT_INPUT);
                batch[(*nb)++] = vp__talloc(S, vp__mulc(S, o->numel, e), VP_CAT_INPUT);
                vp__tunref(S, f);
            } else {
                batch[(*nb)++] = vp__talloc(S, vp__mulc(S, o->numel, e), VP_CAT_INPUT);
            }
            S->out_t[i] = batch[*nb - 1];
            S->out_eb[i] = e;
        } else if ((vp__op_table[o->kind].traits & VP__TRAIT_LOSS) &&
                   *nb < MAX_BATCH) {
            batch[(*nb)++] = vp__talloc(S, vp__loss_target_bytes(S, o),
                                        VP_CAT_INPUT);
        }
    }
    S->cur_op = "";
}

/* The steady state of the step loop, as of accumulation's: at the start
 * of a step after the first, when the state is the one the previous step
 * started from (vp__steady_reached, with no batch or loss tensor alive),
 * that step took the state to itself and every later one repeats it
 * event for event. Its figures (out->step) are copied to the rest and the
 * counters that grow advanced by the steps left; true when the loop is
 * done. Only without an event callback, hooks, data-parallel wrapper or
 * stop event (where every event is to be seen or the run is driven from
 * outside). The peak so far is no part of the state compared (any_peak):
 * a step that raised it is repeated by the next without raising it again
 * (the peak is at least every figure the step reached), and the peak is
 * read by nothing else. The state is first written out at the start of
 * step 3: step 1 creates the optimizer's state, and steps 2 and 3 start
 * from different blocks and tensors on the five bench models (steps 3
 * and 4 alike), while a state costs a tenth of a step to write out. */
static bool steps_repeat(sim *S, vp__steady *d, uint32_t step)
{
    const vp_setup *s = S->s;
    if (step < 3 || S->cb || S->hooks || S->dist || S->stop_at)
        return false;
    /* the last phase's peak: no part of the state here (the step's
     * first phase_begin sets it before it is read) */
    S->phase_peak = 0;
    if (!vp__steady_reached(S, d, NULL, 0, NONE, s->steps - step + 1))
        return false;
    for (uint32_t k = step; k <= s->steps; k++)
        S->out->step[k - 1] = S->out->step[step - 2];
    S->out->steps = s->steps;
    return true;
}

static vp_status run(sim *S)
{
    const vp_graph *g = S->g;
    const vp_setup *s = S->s;
    vp_estimate *out = S->out;
    uint32_t *refs_of = calloc(g->n_ops ? g->n_ops : 1, sizeof *refs_of);
    if (!refs_of)
        return vp_error_set(S->err, VP_ENOMEM, "out of memory");
    vp__load_model(S);
    uint32_t loss = NONE;
    for (uint32_t i = 0; i < g->n_ops; i++)
        if (vp__op_table[g->ops[i].kind].traits & VP__TRAIT_LOSS)
            loss = i;
    if (S->training && loss == NONE) {
        free(refs_of);
        return vp_error_set(S->err, VP_EARG,
                            "the model has no loss op to train with; use "
                            "--inference or add a loss");
    }
    uint32_t accum = S->training ? s->accum : 1;
    /* the steady state of accumulation: in closed form, unless every
     * event is to be seen */
    bool closed = (S->cb == NULL || S->hooks != NULL) && S->dist == NULL;
    vp__steady sd, ss;
    memset(&sd, 0, sizeof sd);
    memset(&ss, 0, sizeof ss);
    ss.any_peak = true;
    for (uint32_t step = 1; step <= s->steps && OK(S); step++) {
        if (steps_repeat(S, &ss, step))
            break;
        S->step = step;
        vp_phase_peaks *pk = &out->step[step - 1];
        memset(pk, 0, sizeof *pk);
        uint64_t fwd_peak = 0, bwd_peak = 0;
        uint32_t batch[MAX_BATCH];
        size_t nb = 0;
        uint32_t loss_t = NONE;
        sd.have = false;
        for (uint32_t mb = 0; mb < accum && OK(S); mb++) {
            if (mb > 0 && S->hooks != NULL)
                S->hooks->mb_start(S->ud, step);
            if (mb > 0 && closed &&
                vp__steady_reached(S, &sd, batch, nb, loss_t, accum - mb)) {
                if (S->hooks != NULL)
                    S->hooks->repeat(S->ud, step, accum - mb);
                break;
            }
            if (mb == VP_MAX_ACCUM_UNSTEADY && S->dist != NULL) {
                /* a wrapper's buckets and shards are not in the state the
                 * closed form compares: every micro-batch is simulated */
                S->st = vp_error_set(S->err, VP_ELIMIT,
                                     "a data-parallel run is simulated "
                                     "micro-batch by micro-batch: at most "
                                     "%u per step", VP_MAX_ACCUM_UNSTEADY);
                break;
            }
            if (mb == VP_MAX_ACCUM_UNSTEADY && closed) {
                S->st = vp_error_set(S->err, VP_ELIMIT,
                                     "accumulation reaches no steady state "
                                     "in %u micro-batches",
                                     VP_MAX_ACCUM_UNSTEADY);
                break;
            }
            if (mb == 0) {
                S->phase = VP_PHASE_FORWARD;
                alloc_batch(S, batch, &nb);
                pk->start = vp__allocated(S) - out->baseline;
                if (S->dist)
                    vp__dist_step_begin(S);
            } else {
                vp__tunref(S, loss_t); /* del loss */
                vp__release_graph(S);
                for (size_t k = 0; k < nb; k++)
                    vp__tunref(S, batch[k]);
                alloc_batch(S, batch, &nb);
            }
            if (mb == 0)
                phase_begin(S, VP_PHASE_FORWARD);
            else
                S->phase = VP_PHASE_FORWARD;
            forward_pass(S);
            if (!OK(S))
                break;
            vp__release_held(S);
            loss_t = loss != NONE ? S->out_t[loss] : NONE;
            /* the training loop divides by accum: a new scalar */
            if (S->training) {
                uint32_t l2 = vp__talloc(S, 4, VP_CAT_TEMP);
                vp__tunref(S, loss_t);
                loss_t = l2;
                S->out_t[loss] = NONE;
            }
            vp__clear_cast_cache(S); /* autocast.__exit__ */
            if (!S->training && loss_t != NONE) {
                vp__tunref(S, loss_t);
                loss_t = NONE;
            }
            if (S->phase_peak > fwd_peak)
                fwd_peak = S->phase_peak;
            pk->after_fwd = vp__allocated(S) - out->baseline;
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
            pk->after_bwd = vp__allocated(S) - out->baseline;
            phase_begin(S, VP_PHASE_OPTIMIZER);
            vp__optimizer_step(S);
            if (S->cat_live[VP_CAT_OPTIM] > out->optim_bytes)
                out->optim_bytes = S->cat_live[VP_CAT_OPTIM];
            pk->peak[VP_PHASE_OPTIMIZER] = S->phase_peak - out->baseline;
            zero_grad(S);
            vp__tunref(S, loss_t);
            vp__release_graph(S);
        }
        for (size_t k = 0; k < nb; k++)
            vp__tunref(S, batch[k]);
        pk->end = vp__allocated(S) - out->baseline;
        vp_allocator_stats st;
        vp_allocator_stats_get(S->a, &st);
        pk->reserved = st.reserved;
        out->steps = step;
    }
    vp__steady_free(&sd);
    vp__steady_free(&ss);
    free(refs_of);
    return S->st;
}

/* ---- entry point ----------------------------------------------------------- */

static void sim_destroy(sim *S)
{
    vp__dist_free(S);
    vp_allocator_free(S->a);
    void *arrays[] = {S->t, S->free_ids, S->out_t, S->out_eb,
                      S->lay, S->glay, S->saved, S->n_saved, S->grad_t,
                      S->consumers, S->reload, S->sel, S->int8, S->opc,
                      S->leaf, S->pgrad, S->gview, S->cast, S->st1, S->st2,
                      S->ckpt, S->held, S->ckin, S->ph, S->fp8w};
    vp__free_each(arrays, sizeof arrays / sizeof arrays[0]);
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
    S->ast = vp__allocator_stats(S->a);
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
    S->gview = calloc(np, 1);
    S->cast = malloc(np * sizeof *S->cast);
    S->st1 = malloc(np * sizeof *S->st1);
    S->st2 = malloc(np * sizeof *S->st2);
    S->ckpt = calloc(g->n_segs ? g->n_segs : 1, sizeof *S->ckpt);
    /* the tensor table at a size a step fills (an op's outputs and what
     * it saves, a parameter's gradient and optimizer states), which it
     * would otherwise reach by up to ten doublings from 16 */
    size_t nt0 = 4 * (no + np);
    if (!S->out_t || !S->out_eb || !S->lay || !S->glay || !S->saved ||
        !S->n_saved || !S->grad_t || !S->consumers || !S->reload ||
        !S->pgrad || !S->gview || !S->cast || !S->st1 || !S->st2 || !S->ckpt ||
        !vp__grow((void **)&S->t, &S->capt, nt0, sizeof *S->t) ||
        !vp__grow((void **)&S->free_ids, &S->cap_free, nt0,
                  sizeof *S->free_ids))
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
    S->ph_until_min = INT32_MAX;
    S->sel = calloc(g->n_segs ? g->n_segs : 1, sizeof *S->sel);
    if (!S->sel)
        return vp_error_set(err, VP_ENOMEM, "out of memory");
    for (size_t k = 0; k < g->n_segs && k < s->n_selective; k++)
        S->sel[k] = s->selective ? s->selective[k] : false;
    vp_precision p = s->precision;
    S->amp = p == VP_PREC_AMP_BF16 || p == VP_PREC_AMP_FP16;
    S->half = p == VP_PREC_BF16 || p == VP_PREC_FP16;
    S->A = p == VP_PREC_FP32 ? 4 : 2;
    S->PE = vp__base_bytes(s);
    S->kbit = s->ft.quant != VP_QUANT_NONE;
    S->training = vp__setup_training(s);
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
    S->n_opt = (uint32_t)g->n_params;
    if (s->dist && s->dist->strategy != VP_DIST_NONE)
        return vp__dist_new(S);
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
    S.tail = at != 0;
    if (s->generate.prompt)
        vp__generate_run(&S);
    else
        run(&S);
    size_t nb = g->n_segs + 1;
    uint64_t *bytes = calloc(nb, sizeof *bytes);
    if (bytes) {
        for (size_t i = 0; i < S.nt; i++) {
            const vp__tensor *t = &S.t[i];
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

/* The weights' bytes (quantized ones as stored) and the gradients'. */
static vp_status model_bytes(const vp_graph *g, const vp_setup *s,
                             vp_estimate *out, vp_error *err)
{
    uint8_t base = vp__base_bytes(s);
    for (size_t p = 0; p < g->n_params; p++) {
        const vp_param *pp = &g->params[p];
        uint64_t eb = pp->elem_bytes_override ? pp->elem_bytes_override
                      : pp->fp32_buffer       ? 4
                                              : base;
        uint64_t b, w;
        if (!vp_mul_u64(pp->numel, eb, &b))
            return vp_error_set(err, VP_EOVERFLOW,
                                "parameter bytes overflow 64 bits");
        w = pp->quant ? vp__quant_bytes(g, (uint32_t)p, s->ft.double_quant)
                      : b;
        if (!vp_add_u64(out->param_bytes, w, &out->param_bytes) ||
            (pp->trainable && !s->generate.prompt &&
             !vp_add_u64(out->grad_bytes, b, &out->grad_bytes)))
            return vp_error_set(err, VP_EOVERFLOW,
                                "parameter bytes overflow 64 bits");
    }
    return VP_OK;
}

static vp_status simulate(const vp_graph *g, const vp_setup *s,
                          vp_estimate *out, vp_sim_event_fn on_event,
                          void *ud, const vp__sim_hooks *hooks,
                          vp_error *err)
{
    if (s->batch == 0 || s->accum == 0 || s->steps == 0 ||
        s->steps > VP_MAX_STEPS)
        return vp_error_set(err, VP_EARG,
                            "invalid setup: batch and accum must be >= 1, "
                            "steps 1..%d",
                            VP_MAX_STEPS);
    if (s->sm_count == 0)
        return vp_error_set(err, VP_EARG,
                            "invalid setup: sm_count must be >= 1");
    if ((unsigned)s->precision >= VP_PREC__COUNT ||
        (unsigned)s->optimizer >= VP_OPT__COUNT)
        return vp_error_set(err, VP_EARG, "invalid precision or optimizer");
    sim S;
    vp_status st = sim_init(&S, g, s, out, err);
    if (st == VP_OK) {
        S.cb = on_event;
        S.tail = on_event != NULL;
        S.ud = ud;
        S.hooks = hooks;
        st = s->generate.prompt ? vp__generate_run(&S)
             : s->pipe          ? vp__pipe_run(&S)
                                : run(&S);
    }
    vp_allocator_stats as;
    if (S.a) {
        vp_allocator_stats_get(S.a, &as);
        out->peak_reserved = as.peak_reserved;
        out->num_alloc_retries = as.num_alloc_retries + S.retries_skipped;
    }
    uint64_t peak_event = out->events;
    out->events = S.events;
    if (S.peak_op)
        snprintf(out->peak_op, sizeof out->peak_op, "%s", S.peak_op);
    sim_destroy(&S);
    /* figures relative to the allocations before the model */
    out->peak_alloc = out->peak_alloc >= out->baseline
                          ? out->peak_alloc - out->baseline
                          : 0;
    if (out->by_category[VP_CAT_WORKSPACE] >= out->baseline)
        out->by_category[VP_CAT_WORKSPACE] -= out->baseline;
    (void)vp_graph_num_params(g, &out->params, NULL);
    if (model_bytes(g, s, out, err) != VP_OK)
        return err ? err->code : VP_EOVERFLOW;
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
    if (!vp_add_u64(out->device_used, out->paged_bytes, &out->device_used))
        return vp_error_set(err, VP_EOVERFLOW, "device memory overflows");
    if (out->steps)
        out->host_traffic /= out->steps; /* per step */
    double f = 0;
    for (size_t i = 0; i < g->n_ops && !s->generate.prompt; i++) {
        f += g->ops[i].flops_fwd;
        if (!s->inference)
            f += g->ops[i].flops_bwd;
        if (!s->inference && g->ops[i].segment >= 0 &&
            (size_t)g->ops[i].segment < s->n_checkpoint && s->checkpoint &&
            s->checkpoint[g->ops[i].segment])
            f += g->ops[i].flops_fwd;
    }
    if (!s->generate.prompt) /* generate.c counts its forwards */
        out->flops_per_step = f * (s->inference ? 1 : s->accum);
    if (st == VP_OK && peak_event && !s->skip_breakdown)
        layer_breakdown(g, s, out, peak_event);
    return st;
}

vp_status vp_simulate(const vp_graph *g, const vp_setup *s, vp_estimate *out,
                      vp_sim_event_fn on_event, void *ud, vp_error *err)
{
    return vp__simulate_hooked(g, s, out, on_event, ud, NULL, err);
}

vp_status vp__simulate_hooked(const vp_graph *g, const vp_setup *s,
                              vp_estimate *out, vp_sim_event_fn on_event,
                              void *ud, const vp__sim_hooks *hooks,
                              vp_error *err)
{
    vp_graph *ft = NULL;

    vp_error_clear(err);
    memset(out, 0, sizeof *out);
    vp_status st = vp__finetune_prepare(g, s, &ft, err);
    if (st != VP_OK)
        return st;
    st = vp__simulate_prepared(g, ft, s, out, on_event, ud, hooks, err);
    vp_graph_free(ft);
    return st;
}

vp_status vp__simulate_prepared(const vp_graph *g, const vp_graph *ft,
                                const vp_setup *s, vp_estimate *out,
                                vp_sim_event_fn on_event, void *ud,
                                const vp__sim_hooks *hooks, vp_error *err)
{
    uint64_t total = 0;

    vp_error_clear(err);
    memset(out, 0, sizeof *out);
    (void)vp_graph_num_params(g, &total, NULL);
    vp_status st = simulate(ft ? ft : g, s, out, on_event, ud, hooks, err);
    /* every parameter: the model's, and the adapters */
    for (size_t p = 0; ft && p < ft->n_params; p++)
        if (ft->params[p].adapter &&
            !vp_add_u64(total, ft->params[p].numel, &total))
            total = UINT64_MAX;
    out->total_params = total;
    return st;
}

/* ---- for a pipeline stage's schedule (sim_pipe.c) ------------------------ */

void vp__sim_alloc_batch(sim *S, uint32_t *batch, size_t *nb)
{
    alloc_batch(S, batch, nb);
}

void vp__sim_phase(sim *S, vp_phase ph) { phase_begin(S, ph); }

void vp__sim_forward(sim *S) { forward_pass(S); }

void vp__sim_backward(sim *S, uint32_t *refs_of) { backward_ops(S, refs_of); }

void vp__sim_loss_backward(sim *S, uint32_t loss, uint32_t *refs_of)
{
    backward_pass(S, loss, refs_of);
}

void vp__sim_zero_grad(sim *S) { zero_grad(S); }
