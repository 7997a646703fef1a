/* FSDP2 with tensor parallelism (2-D) and pipeline stages (3-D) as
 * torchtitan composes them (src/dist_tp.c, include/vramplan/tp.h;
 * docs/DISTRIBUTED.md "FSDP2 + TP (2-D) and + PP (3-D)"), on
 * tests/data/dist/tiny-llama.yaml: hidden 64, 2 layers, 4 heads of 16 (2
 * KV heads), SwiGLU ffn 128, vocab 128, untied head, RMSNorm, no biases.
 * Every figure is derived from the rule (torchtitan's plan, FSDP2's
 * pipeline path) and the model's dimensions, never read back from a run. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "vramplan/vramplan.h"

#include "cli_golden.h"

#define LLAMA "tests/data/dist/tiny-llama.yaml"
#define H 64ull
#define HD 16ull
#define HEADS 4ull
#define KV 2ull
#define FFN 128ull
#define VOCAB 128ull

/* The trainable elements one tensor-parallel rank of t holds: per layer
 * q and o (heads/t of HD), k and v (KV/t of HD), gate, up and down
 * (FFN/t), the two SequenceParallel norms whole; the embedding's rows and
 * the output's columns vocab/t (RowwiseParallel / ColwiseParallel), the
 * final norm whole. */
static uint64_t layer_local(uint64_t t)
{
    return 2 * H * (HEADS / t * HD) + 2 * H * (KV / t * HD) +
           3 * H * (FFN / t) + 2 * H;
}

static vp_model *model(void)
{
    vp_error err;
    vp_model *m = vp_model_load(LLAMA, &err);
    cr_assert_not_null(m, "%s", err.msg);
    return m;
}

static vp_graph *rank_graph(uint32_t tp, uint32_t pp, uint32_t stage)
{
    vp_model *m = model();
    vp_tp_layout l = {tp, pp, stage, false, false};
    vp_error err;
    vp_graph *g = vp_tp_graph_build(m, &l, 1, 32, &err);
    cr_assert_not_null(g, "%s", err.msg);
    vp_model_free(m);
    return g;
}

static uint64_t trainable(const vp_graph *g)
{
    uint64_t n = 0;
    for (size_t i = 0; i < vp_graph_param_count(g); i++)
        if (vp_graph_param(g, i)->trainable)
            n += vp_graph_param(g, i)->numel;
    return n;
}

Test(dist_tp, rank_holds_the_tensor_parallel_share_of_every_weight)
{
    vp_graph *g = rank_graph(2, 1, 0);
    uint64_t want = 2 * layer_local(2) + 2 * (VOCAB / 2) * H + H;
    cr_assert_eq(trainable(g), want);
    vp_graph_free(g);
}

Test(dist_tp, stages_split_as_torchtitan_generate_llm_fqn_per_model_part)
{
    /* 32 layers on 2 stages: 34 slots, 17 each, the embedding and the
     * output one slot each */
    cr_assert_eq(vp_tp_stage_layers(32, 2, 0), 16);
    cr_assert_eq(vp_tp_stage_layers(32, 2, 1), 16);
    /* 27 on 4: 29 slots, 7 each and the remainder on stage 0 */
    const uint32_t want[4] = {7, 7, 7, 6};
    for (uint32_t s = 0; s < 4; s++)
        cr_assert_eq(vp_tp_stage_layers(27, 4, s), want[s], "stage %u", s);
    /* more stages than slots: refused */
    cr_assert_eq(vp_tp_stage_layers(2, 5, 0), 0);
}

Test(dist_tp, stage_graphs_hold_their_layers_embedding_and_head)
{
    /* tiny-llama on 2 stages: 4 slots, 2 each: the embedding and layer 0,
     * then layer 1, the final norm and the output */
    vp_graph *first = rank_graph(2, 2, 0), *last = rank_graph(2, 2, 1);
    cr_assert_eq(trainable(first), layer_local(2) + (VOCAB / 2) * H);
    cr_assert_eq(trainable(last), layer_local(2) + H + (VOCAB / 2) * H);
    vp_graph_free(first);
    vp_graph_free(last);
}

/* apply_tp's plan: per layer one all-gather before the attention
 * (PrepareModuleInput) that wq, wk and wv share, one reduce-scatter after
 * wo, one all-gather before the feed-forward (w1, w3), one reduce-scatter
 * after w2; the embedding's reduce-scatter and the output's all-gather. */
Test(dist_tp, sequence_parallel_redistributes_once_per_module)
{
    vp_graph *g = rank_graph(2, 1, 0);
    size_t n = 0;
    for (size_t i = 0; i < vp_graph_op_count(g); i++)
        n += vp_graph_op(g, i)->kind == VP_OP_REDISTRIBUTE;
    cr_assert_eq(n, 2 * 4 + 2);
    /* the column-parallel linears of a module read one gathered tensor,
     * of the whole sequence */
    uint32_t in = UINT32_MAX;
    size_t sharing = 0;
    for (size_t i = 0; i < vp_graph_op_count(g); i++) {
        const vp_op *o = vp_graph_op(g, i);
        if (o->kind != VP_OP_LINEAR || !strstr(o->name, "layers.0.attn."))
            continue;
        if (strstr(o->name, "o_proj"))
            continue;
        if (in == UINT32_MAX)
            in = o->inputs[0];
        sharing += o->inputs[0] == in;
    }
    cr_assert_eq(sharing, 3);
    const vp_op *gathered = vp_graph_op(g, in);
    cr_assert_eq(gathered->kind, VP_OP_REDISTRIBUTE);
    cr_assert_eq(gathered->shape[1], 32);
    cr_assert_eq(vp_graph_op(g, gathered->inputs[0])->shape[1], 32 / 2);
    vp_graph_free(g);
}

/* The allocations of one step under an op name: their count and bytes. */
typedef struct seen {
    const char *op;
    uint32_t step;
    vp_category cat;
    size_t n;
    uint64_t bytes;
} seen;

static void on_event(const vp_sim_event *ev, void *ud)
{
    seen *s = ud;
    if (!ev->is_free && ev->step == s->step && ev->category == s->cat &&
        strcmp(ev->op, s->op) == 0) {
        s->n++;
        s->bytes += ev->bytes;
    }
}

/* Stage `stage` of tp 2 x pp (1: no pipeline) under FSDP2 over 2 ranks,
 * bf16 parameters, fp32 reduction (torchtitan's MixedPrecisionPolicy), 4
 * micro-batches, 2 steps, every event to fn; torch: PipelineStage's
 * rules (vp_pipeline.torch), else Megatron's stage. */
static void run_stage_events(uint32_t pp, uint32_t stage, bool torch,
                             vp_sim_event_fn fn, void *ud)
{
    vp_graph *g = rank_graph(2, pp, stage);
    vp_dist d;
    vp_dist_init(&d);
    d.strategy = VP_DIST_FSDP2;
    d.world = 2;
    d.param_dtype = VP_MP_BF16;
    d.reduce_dtype = VP_MP_FP32;
    vp_setup s;
    vp_setup_init(&s);
    s.dist = &d;
    s.batch = 1;
    s.seq = 32;
    s.accum = 4;
    s.steps = 2;
    vp_pipeline pl = {pp, stage, 1, torch};
    s.pipe = pp > 1 ? &pl : NULL;
    vp_estimate e;
    vp_error err;
    cr_assert_eq(vp_simulate(g, &s, &e, fn, ud, &err), VP_OK, "%s", err.msg);
    vp_graph_free(g);
}

/* ... torchtitan's (torch's PipelineStage), watching w's step. */
static void run_stage(uint32_t pp, uint32_t stage, seen *w)
{
    run_stage_events(pp, stage, true, on_event, w);
}

/* PipelineStage.backward_maybe_with_nosync: no gradient sync until the
 * last micro-batch, each unsharded gradient accumulated in reduce_dtype
 * (FSDPParam.to_accumulated_grad_if_needed): one fp32 copy of every
 * parameter of the stage a step. */
Test(dist_tp, pipeline_stage_accumulates_unsharded_fp32_gradients)
{
    seen w = {"fsdp2 to_accumulated_grad_if_needed", 2, VP_CAT_GRAD, 0, 0};
    run_stage(2, 0, &w);
    cr_assert_eq(w.n, 9 + 1); /* a layer's 9 tensors, the embedding */
    /* the embedding's gradient is a Replicate DTensor of the whole
     * vocabulary: grad.to(reduce_dtype) upcasts all of it */
    cr_assert_eq(w.bytes, (layer_local(2) + VOCAB * H) * 4);
}

/* RowwiseParallel's embedding: embedding_dense_backward under DTensor
 * makes the whole vocabulary's gradient (Replicate), and FSDP2 reads the
 * rank's rows (_get_grad_inner_tensor: Shard._replicate_to_shard's
 * clone) before each reduce-scatter: without a pipeline one bf16 clone
 * a micro-batch ... */
Test(dist_tp, embedding_gradient_is_cloned_to_the_rank_s_rows_per_reduce)
{
    seen w = {"fsdp2 _replicate_to_shard", 2, VP_CAT_GRAD, 0, 0};
    run_stage(1, 0, &w);
    cr_assert_eq(w.n, 4);
    cr_assert_eq(w.bytes, 4 * (VOCAB / 2) * H * 2);
}

/* ... on a pipeline stage one fp32 clone of the accumulated gradient a
 * step, at the reduce after the last micro-batch. */
Test(dist_tp, pipeline_stage_clones_the_accumulated_embedding_gradient_once)
{
    seen w = {"fsdp2 _replicate_to_shard", 2, VP_CAT_GRAD, 0, 0};
    run_stage(2, 0, &w);
    cr_assert_eq(w.n, 1);
    cr_assert_eq(w.bytes, (VOCAB / 2) * H * 4);
}

/* torch's PipelineStage's buffers of category cat: at the first step
 * one per micro-batch, of the hidden states' shape (1 x 32/2 tokens x H,
 * bf16), on stage `with` of 2; kept, so never made again; none on stage
 * `without`. */
static void buffers_made(vp_category cat, uint32_t with, uint32_t without)
{
    seen first = {"pipeline buffers", 1, cat, 0, 0};
    run_stage(2, with, &first);
    cr_assert_eq(first.n, 4);
    cr_assert_eq(first.bytes, 4 * (32 / 2) * H * 2);
    seen second = {"pipeline buffers", 2, cat, 0, 0};
    run_stage(2, with, &second);
    cr_assert_eq(second.n, 0);
    seen none = {"pipeline buffers", 1, cat, 0, 0};
    run_stage(2, without, &none);
    cr_assert_eq(none.n, 0);
}

/* _prepare_forward_infra: a receive buffer per micro-batch on a stage
 * after the first ... */
Test(dist_tp, torch_stage_makes_a_receive_buffer_per_micro_batch_once)
{
    buffers_made(VP_CAT_INPUT, 1, 0);
}

/* ... _create_grad_recv_info: a gradient-receive buffer per micro-batch
 * on a stage before the last. */
Test(dist_tp, torch_stage_makes_a_gradient_buffer_per_micro_batch_once)
{
    buffers_made(VP_CAT_TEMP, 0, 1);
}

/* The phases in which the stage output's tensors (the op named `op`,
 * made in a forward) are freed, and how many in the forward that made
 * them (same). */
typedef struct {
    const char *op;
    uint64_t ids[64], fwd_of[64];
    size_t n_ids, freed[VP_PHASE__COUNT], same;
    uint64_t fwd_no;
    vp_phase last;
} out_watch;

static void on_output(const vp_sim_event *ev, void *ud)
{
    out_watch *o = ud;
    if (ev->phase == VP_PHASE_FORWARD && o->last != VP_PHASE_FORWARD)
        o->fwd_no++;
    o->last = ev->phase;
    if (!ev->is_free) {
        if (ev->phase == VP_PHASE_FORWARD && strcmp(ev->op, o->op) == 0 &&
            o->n_ids < sizeof o->ids / sizeof o->ids[0]) {
            o->fwd_of[o->n_ids] = o->fwd_no;
            o->ids[o->n_ids++] = ev->tensor;
        }
        return;
    }
    for (size_t i = 0; i < o->n_ids; i++)
        if (o->ids[i] == ev->tensor) {
            o->freed[ev->phase]++;
            o->same += ev->phase == VP_PHASE_FORWARD &&
                       o->fwd_of[i] == o->fwd_no;
            o->n_ids--;
            o->ids[i] = o->ids[o->n_ids];
            o->fwd_of[i] = o->fwd_of[o->n_ids];
            return;
        }
}

/* forward_one_chunk keeps the stage's output in fwd_cache until
 * backward_one_chunk pops it: every output of stage 0 is freed in a
 * backward phase, where Megatron's deallocate_output_tensor frees it
 * once sent, in its forward. */
Test(dist_tp, torch_stage_keeps_each_output_until_its_backward)
{
    vp_graph *g = rank_graph(2, 2, 0);
    const char *last = vp_graph_op(g, vp_graph_op_count(g) - 1)->name;
    out_watch torch = {.op = last}, megatron = torch;
    run_stage_events(2, 0, true, on_output, &torch);
    run_stage_events(2, 0, false, on_output, &megatron);
    cr_assert_eq(torch.freed[VP_PHASE_BACKWARD], 2 * 4);
    cr_assert_eq(torch.freed[VP_PHASE_FORWARD], 0);
    cr_assert_eq(megatron.freed[VP_PHASE_FORWARD], 2 * 4);
    cr_assert_eq(megatron.freed[VP_PHASE_BACKWARD], 0);
    vp_graph_free(g);
}

/* ... the last stage's too: the logits its loss is computed from, which
 * Megatron's stage drops in their forward once the loss has made its
 * own fp32 copy. Past their backward the schedule's `output` variable
 * holds them until the next forward's logits are made: each step's
 * first three go in the next forward, the last at the step's end. */
Test(dist_tp, torch_last_stage_keeps_its_logits_until_their_backward)
{
    out_watch torch = {.op = "lm_head"}, megatron = torch;
    run_stage_events(2, 1, true, on_output, &torch);
    run_stage_events(2, 1, false, on_output, &megatron);
    cr_assert_eq(torch.same, 0);
    cr_assert_eq(torch.freed[VP_PHASE_FORWARD], 2 * 3);
    cr_assert_eq(torch.freed[VP_PHASE_BACKWARD], 2 * 1);
    cr_assert_eq(megatron.same, 2 * 4);
}

/* ... and reduce-scatters once a step, after the last micro-batch's
 * backward (run_post_backward: the root's group and the layer's), where
 * without a pipeline every micro-batch's backward does. */
Test(dist_tp, pipeline_stage_reduce_scatters_once_a_step)
{
    seen w = {"fsdp2 reduce_scatter", 2, VP_CAT_TEMP, 0, 0};
    run_stage(2, 0, &w);
    cr_assert_eq(w.n, 2);
    seen one = {"fsdp2 reduce_scatter", 2, VP_CAT_TEMP, 0, 0};
    run_stage(1, 0, &one);
    cr_assert_eq(one.n, 4 * 3); /* root and 2 layers, 4 micro-batches */
}

/* torchtitan's apply_fsdp under pp: reshard_after_forward False, and no
 * reshard after the micro-batches' backwards: each parameter of the
 * stage unsharded (copied out of the all-gather) once a step. */
Test(dist_tp, pipeline_stage_unshards_each_parameter_once_a_step)
{
    seen w = {"fsdp2 copy_out", 2, VP_CAT_PARAM, 0, 0};
    run_stage(2, 1, &w);
    cr_assert_eq(w.n, 9 + 2); /* a layer's 9, the final norm, the output */
    cr_assert_eq(w.bytes, (layer_local(2) + H + (VOCAB / 2) * H) * 2);
}

Test(dist_tp, expert_and_graph_models_are_refused_by_name)
{
    vp_error err;
    vp_model *m = vp_model_load("models/mixtral-8x7b.yaml", &err);
    cr_assert_not_null(m, "%s", err.msg);
    vp_tp_layout l = {2, 1, 0, false, false};
    cr_assert_null(vp_tp_graph_build(m, &l, 1, 64, &err));
    cr_assert_eq(err.code, VP_EUNSUPPORTED);
    cr_assert(strstr(err.msg, "mixture-of-experts"), "%s", err.msg);
    vp_model_free(m);
}

/* The peak allocated of the most loaded stage of tiny-llama under layout
 * *l, fsdp2 over 2 ranks (torchtitan's mixed precision when mp), batch 1
 * of 32 tokens, accum micro-batches, steps steps; l->stage the stage. */
static uint64_t tp_peak(vp_tp_layout *l, bool mp, uint32_t accum,
                        uint32_t steps)
{
    vp_model *m = model();
    vp_dist d;
    vp_dist_init(&d);
    d.strategy = VP_DIST_FSDP2;
    d.world = 2;
    if (mp) {
        d.param_dtype = VP_MP_BF16;
        d.reduce_dtype = VP_MP_FP32;
    }
    vp_setup s;
    vp_setup_init(&s);
    s.dist = &d;
    s.batch = 1;
    s.seq = 32;
    s.accum = accum;
    s.steps = steps;
    vp_rank_estimate *r;
    size_t n, worst;
    vp_error err;
    cr_assert_eq(vp_tp_simulate(m, l, &s, &r, &n, &worst, &err), VP_OK,
                 "%s", err.msg);
    uint64_t peak = r[worst].est.peak_alloc;
    free(r);
    vp_model_free(m);
    return peak;
}

/* The peak allocated of the most loaded stage of tiny-llama at tp 2 x pp
 * 2, fsdp2 over 2 ranks (torchtitan's mixed precision), 4 micro-batches,
 * every layer checkpointed; *stage the stage. */
static uint64_t library_peak(uint32_t *stage)
{
    vp_tp_layout l = {2, 2, VP_TP_WORST, true, false};
    uint64_t peak = tp_peak(&l, true, 4, 3);
    *stage = l.stage;
    return peak;
}

Test(dist_tp, json_api_runs_the_layout_the_library_does)
{
    uint32_t stage;
    uint64_t want = library_peak(&stage);
    char *resp;
    vp_error err;
    cr_assert_eq(vp_api_call("{\"command\": \"estimate\", \"model\": \"" LLAMA
                             "\", \"batch\": 1, \"seq\": 32, \"accum\": 4, "
                             "\"steps\": 3, \"checkpoint\": \"all\", "
                             "\"strategy\": \"fsdp2\", \"world\": 2, "
                             "\"param_dtype\": \"bf16\", \"reduce_dtype\": "
                             "\"fp32\", \"tp\": 2, \"pp\": 2}",
                             &resp, &err),
                 VP_OK, "%s", err.msg);
    char key[64];
    snprintf(key, sizeof key, "\"stage\":%u", stage);
    cr_assert(strstr(resp, key), "%s", resp);
    const char *at = strstr(resp, "\"peak_alloc\":");
    cr_assert_not_null(at);
    cr_assert_eq(strtoull(at + 13, NULL, 10), want, "%s", resp);
    vp_api_free(resp);
}

Test(dist_tp, json_api_refuses_a_layout_without_fsdp2)
{
    char *resp;
    vp_error err;
    cr_assert_eq(vp_api_call("{\"command\": \"estimate\", \"model\": \"" LLAMA
                             "\", \"strategy\": \"ddp\", \"world\": 2, "
                             "\"tp\": 2}",
                             &resp, &err),
                 VP_EARG);
    cr_assert(strstr(err.msg, "fsdp2"), "%s", err.msg);
}

/* estimate's report of the layout: the roles of the most loaded stage,
 * named on the line after them (golden file). */
Test(dist_tp, estimate_reports_the_most_loaded_stage)
{
    GOLDEN("estimate_fsdp2_tp2_pp2", 0, "estimate", LLAMA, "--strategy",
           "fsdp2", "--world", "2", "--tp", "2", "--pp", "2",
           "--param-dtype", "bf16", "--reduce-dtype", "fp32", "--accum", "4",
           "--steps", "3", "--checkpoint", "all", "--batch", "1");
}

Test(dist_tp, estimate_refuses_a_schedule_it_does_not_model)
{
    GOLDEN("estimate_fsdp2_pp_zbv", 2, "estimate", LLAMA, "--strategy",
           "fsdp2", "--world", "2", "--pp", "2", "--schedule", "zbv");
}

Test(dist_tp, estimate_refuses_tp_without_fsdp2)
{
    GOLDEN("estimate_ddp_tp2", 2, "estimate", LLAMA, "--strategy", "ddp",
           "--world", "2", "--tp", "2");
}

/* apply_tp before fully_shard (collect_tp_fake.py, torchtitan): each
 * sharded weight is built whole (fp32), then distribute_tensor makes the
 * rank's share: per layer q, k, v, gate, up (ColwiseParallel, Shard(0)),
 * o and down (RowwiseParallel, Shard(1)), and the embedding and output
 * (Shard(0)); the norms are replicated, not copied. */
Test(dist_tp, apply_tp_makes_each_sharded_weight_s_share)
{
    seen w = {"apply_tp", 0, VP_CAT_PARAM, 0, 0};
    run_stage(1, 0, &w);
    cr_assert_eq(w.n, 2 * 7 + 2);
    cr_assert_eq(w.bytes, (2 * (layer_local(2) - 2 * H) + 2 * (VOCAB / 2) * H) *
                              4);
}

/* ... and Shard(1)'s _split_tensor(contiguous=True) copies the tp column
 * chunks of o and down first (Shard(0)'s chunks are views). */
Test(dist_tp, apply_tp_copies_the_column_chunks_of_rowwise_weights)
{
    seen w = {"apply_tp", 0, VP_CAT_TEMP, 0, 0};
    run_stage(1, 0, &w);
    cr_assert_eq(w.n, 2 * 2 * 2);
    cr_assert_eq(w.bytes,
                 2 * 2 * (H * (HEADS / 2 * HD) + H * (FFN / 2)) * 4);
}

/* The head's placements: loss_parallel (the default) keeps the vocab/tp
 * logits and runs loss.py's cross entropy on them; torchtitan's
 * disable_loss_parallel all-gathers them (Shard(-1) to Replicate) and
 * HF's loss takes the whole vocabulary. */
static const vp_op *loss_of(const vp_graph *g)
{
    for (size_t i = 0; i < vp_graph_op_count(g); i++)
        if (vp_graph_op(g, i)->kind == VP_OP_CROSS_ENTROPY)
            return vp_graph_op(g, i);
    cr_assert_fail("no loss");
    return NULL;
}

Test(dist_tp, loss_parallel_takes_the_vocab_shard)
{
    vp_graph *g = rank_graph(2, 1, 0);
    const vp_op *l = loss_of(g);
    cr_assert(l->flags & VP_OPF_LOSS_PARALLEL);
    cr_assert_eq(l->classes, VOCAB / 2);
    vp_graph_free(g);
}

Test(dist_tp, disable_loss_parallel_gathers_the_whole_vocabulary)
{
    vp_model *m = model();
    vp_tp_layout lay = {2, 1, 0, false, true};
    vp_error err;
    vp_graph *g = vp_tp_graph_build(m, &lay, 1, 32, &err);
    cr_assert_not_null(g, "%s", err.msg);
    const vp_op *l = loss_of(g);
    cr_assert_not(l->flags & VP_OPF_LOSS_PARALLEL);
    cr_assert_eq(l->classes, VOCAB);
    const vp_op *in = vp_graph_op(g, l->inputs[0]);
    cr_assert_eq(in->kind, VP_OP_REDISTRIBUTE);
    cr_assert(in->flags & VP_OPF_GATHER_LAST);
    cr_assert_eq(vp_graph_op(g, in->inputs[0])->shape[2], VOCAB / 2);
    vp_graph_free(g);
    vp_model_free(m);
}

/* The fp32 logits-sized temporaries of the loss in step 2. */
static void on_logits(const vp_sim_event *ev, void *ud)
{
    seen *s = ud;
    if (!ev->is_free && ev->step == s->step && ev->category == s->cat &&
        ev->bytes == s->bytes && strcmp(ev->op, s->op) == 0)
        s->n++;
}

/* loss.py's _log_softmax: shifted and exp(shifted) beside the fp32
 * logits; the backward's grad_input, exp(x), their sum and the product
 * it returns: six a micro-batch, where HF's fused kernels make two (the
 * backward's). */
Test(dist_tp, loss_parallel_makes_loss_py_s_temporaries)
{
    vp_graph *g = rank_graph(2, 1, 0);
    vp_dist d;
    vp_dist_init(&d);
    d.strategy = VP_DIST_FSDP2;
    d.world = 2;
    vp_setup s;
    vp_setup_init(&s);
    s.dist = &d;
    s.batch = 1;
    s.seq = 32;
    s.steps = 2;
    seen w = {"loss", 2, VP_CAT_TEMP, 0, 32 * (VOCAB / 2) * 4};
    vp_estimate e;
    vp_error err;
    cr_assert_eq(vp_simulate(g, &s, &e, on_logits, &w, &err), VP_OK, "%s",
                 err.msg);
    cr_assert_eq(w.n, 6);
    vp_graph_free(g);
}

/* The JSON API's "disable_loss_parallel" (and estimate's
 * --disable-loss-parallel) is the layout's: the same bytes as the
 * library's tp 2 rank with the logits gathered. */
Test(dist_tp, json_api_disable_loss_parallel_is_the_layout_s)
{
    vp_tp_layout l = {2, 1, VP_TP_WORST, false, true};
    uint64_t want = tp_peak(&l, false, 1, 2);
    vp_error err;
    char *resp;
    cr_assert_eq(vp_api_call("{\"command\": \"estimate\", \"model\": \"" LLAMA
                             "\", \"batch\": 1, \"seq\": 32, \"steps\": 2, "
                             "\"strategy\": \"fsdp2\", \"world\": 2, "
                             "\"tp\": 2, \"disable_loss_parallel\": true}",
                             &resp, &err),
                 VP_OK, "%s", err.msg);
    const char *at = strstr(resp, "\"peak_alloc\":");
    cr_assert_not_null(at);
    cr_assert_eq(strtoull(at + 13, NULL, 10), want, "%s", resp);
    vp_api_free(resp);
}

Test(dist_tp, estimate_refuses_disable_loss_parallel_without_tp)
{
    GOLDEN("estimate_fsdp2_nolp_tp1", 2, "estimate", LLAMA, "--strategy",
           "fsdp2", "--world", "2", "--disable-loss-parallel");
}
