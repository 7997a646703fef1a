/* FSDP2 composed with tensor parallelism (2-D) and pipeline stages (3-D)
 * as torchtitan composes them, one rank simulated (include/vramplan/
 * tp.h; docs/DISTRIBUTED.md "FSDP2 + TP (2-D) and + PP (3-D)"):
 *
 *  - torchtitan/models/llama3/infra/parallelize.py apply_tp: every
 *    layer's norms SequenceParallel (the residual stream on S/tp tokens),
 *    attention and feed_forward behind PrepareModuleInput (Shard(1) to
 *    Replicate: one all-gather their column-parallel wq/wk/wv, w1/w3
 *    share and save), wo and w2 RowwiseParallel with output_layouts
 *    Shard(1) (reduce-scatter), tok_embeddings RowwiseParallel
 *    (Replicate in, Shard(1) out), norm SequenceParallel, output
 *    ColwiseParallel to Shard(-1) logits (loss_parallel: vocab/tp
 *    columns, the cross entropy tensor/parallel/loss.py's), or with
 *    disable_loss_parallel to Replicate() (the whole logits gathered on
 *    every rank, HF's loss over them). The rank's graph is the transformer form's local share
 *    (heads/tp, kv_heads/tp, ffn/tp, vocab/tp: vp__local_tf) with
 *    vp_tf.dtensor's redistributions (graph_transformer.c,
 *    ops/redistribute.c);
 *  - apply_fsdp after it: fully_shard over the data-parallel mesh of the
 *    TP-local parameters (FSDPParam._init_sharded_param chunks a DTensor's
 *    _local_tensor on dim 0): the fsdp2 rules of dist_fsdp2.c over this
 *    graph;
 *  - pipeline_llm (torchtitan/distributed/pipeline_parallel.py): the
 *    stage's modules from generate_llm_fqn_per_model_part, 1F1B
 *    (sim_pipe.c), FSDP2 per stage with reshard_after_forward False and
 *    the gradients kept unsharded across micro-batches (dist_fsdp2.c,
 *    nosync). */
#include <stdlib.h>
#include <string.h>

#include "cluster_impl.h"
#include "graph_internal.h"
#include "vramplan/tp.h"

uint32_t vp_tp_stage_layers(uint64_t layers, uint32_t pp, uint32_t stage)
{
    if (pp <= 1)
        return layers > UINT32_MAX ? 0 : (uint32_t)layers;
    uint64_t eff = layers + 2, per = eff / pp, extra = eff % pp;
    /* torchtitan's assertions: no stage empty, the weights within it */
    if (stage >= pp || per < 1 || pp > eff)
        return 0;
    uint64_t n = per + (stage < extra);
    if (stage == 0 || stage + 1 == pp)
        n -= 1;
    return n > UINT32_MAX ? 0 : (uint32_t)n;
}

/* What the composition does not model, named; NULL if it does. */
static const char *unsupported(const vp_model *m, const vp_tp_layout *l)
{
    const vp_tf *t = &m->tf;
    if (m->form != 0)
        return "a graph-form model (torchtitan parallelizes transformers)";
    if (t->type != VP_TF_DECODER)
        return "a model other than a decoder";
    if (t->experts)
        return "mixture-of-experts layers (torchtitan's expert "
               "parallelism)";
    if (t->x.mla.kv_lora)
        return "latent attention";
    if (l->tp > 1 && (t->heads % l->tp || t->kv_heads % l->tp))
        return "heads or key/value heads not divisible by the "
               "tensor-parallel degree (the local attention's view)";
    return NULL;
}

void vp_tp_pipeline(const vp_tp_layout *l, vp_pipeline *out)
{
    out->stages = l->pp;
    out->stage = l->stage;
    out->chunks = 1;
    out->torch = true; /* torchtitan: PipelineStage, Schedule1F1B */
}

vp_graph *vp_tp_graph_build(const vp_model *m, const vp_tp_layout *l,
                            uint64_t batch, uint64_t seq, vp_error *err)
{
    if (!m || !l || l->tp < 1 || l->pp < 1) {
        vp_error_set(err, VP_EARG, "a layout needs tp and pp of 1 or more");
        return NULL;
    }
    const char *why = unsupported(m, l);
    if (why) {
        vp_error_set(err, VP_EUNSUPPORTED,
                     "FSDP2 with tensor or pipeline parallelism over %s is "
                     "not modelled", why);
        return NULL;
    }
    uint32_t layers = vp_tp_stage_layers(m->tf.layers, l->pp, l->stage);
    if (layers == 0) {
        vp_error_set(err, VP_EARG,
                     "%u pipeline stages of %llu layers leave stage %u "
                     "no layers (torchtitan's generate_llm_fqn_per_model_"
                     "part refuses it)",
                     l->pp, (unsigned long long)m->tf.layers, l->stage);
        return NULL;
    }
    vp_tf tf;
    vp__local_tf(&tf, m, l->tp);
    tf.layers = layers;
    tf.stage_in = l->stage > 0;
    tf.stage_out = l->stage + 1 < l->pp;
    tf.sp = l->tp > 1 ? l->tp : 1;
    tf.dtensor = true;
    tf.replicate_logits = l->tp > 1 && l->disable_loss_parallel;
    if (tf.stage_in)
        tf.tied = false;
    return vp__graph_build_tf(&tf, m, batch, seq, err);
}

vp_status vp_tp_checkpoint(const vp_tp_layout *l, const vp_graph *g,
                           vp_setup *setup, bool **flags, vp_error *err)
{
    *flags = NULL;
    size_t n = vp_graph_segment_count(g);
    if (!l->ac_full || n == 0)
        return VP_OK;
    *flags = malloc(n * sizeof **flags);
    if (!*flags)
        return vp_error_set(err, VP_ENOMEM, "out of memory");
    for (size_t k = 0; k < n; k++)
        (*flags)[k] = true;
    setup->checkpoint = *flags;
    setup->n_checkpoint = n;
    return VP_OK;
}

/* The stages that differ: the first, the second (a middle one with the
 * most micro-batches in flight) and the last. */
static uint32_t stages_of(const vp_tp_layout *l, uint32_t st[3])
{
    if (l->stage != VP_TP_WORST) {
        st[0] = l->stage;
        return 1;
    }
    return vp__stages_that_differ(l->pp, st);
}

static bool heavier(const vp_estimate *a, const vp_estimate *b)
{
    return a->peak_alloc > b->peak_alloc ||
           (a->peak_alloc == b->peak_alloc &&
            a->peak_reserved > b->peak_reserved);
}

/* One stage: its graph, its pipeline and its roles. */
static vp_status run_stage(const vp_model *m, const vp_tp_layout *l,
                           const vp_setup *setup, vp_rank_estimate **roles,
                           size_t *n, size_t *worst, vp_error *err)
{
    vp_graph *g = vp_tp_graph_build(m, l, setup->batch, setup->seq, err);
    if (!g)
        return err ? err->code : VP_EARG;
    vp_setup s = *setup;
    vp_pipeline pl;
    vp_tp_pipeline(l, &pl);
    s.pipe = l->pp > 1 ? &pl : NULL;
    bool *flags;
    vp_status st = vp_tp_checkpoint(l, g, &s, &flags, err);
    if (st == VP_OK)
        st = vp_simulate_ranks(g, &s, roles, n, worst, err);
    free(flags);
    vp_graph_free(g);
    return st;
}

vp_status vp_tp_simulate(const vp_model *m, vp_tp_layout *l,
                         const vp_setup *setup, vp_rank_estimate **roles,
                         size_t *n, size_t *worst, vp_error *err)
{
    *roles = NULL;
    if (!setup->dist || setup->dist->strategy != VP_DIST_FSDP2)
        return vp_error_set(err, VP_EARG,
                            "tensor and pipeline parallelism compose with "
                            "fsdp2 (torchtitan's apply_fsdp)");
    if (setup->pipe)
        return vp_error_set(err, VP_EARG,
                            "the layout sets the pipeline itself");
    if (l->stage != VP_TP_WORST && l->stage >= l->pp)
        return vp_error_set(err, VP_EARG, "stage %u is not one of %u",
                            l->stage, l->pp);
    uint32_t st[3], k = stages_of(l, st), best = st[0];
    vp_status s = VP_OK;
    for (uint32_t i = 0; i < k && s == VP_OK; i++) {
        vp_tp_layout one = *l;
        one.stage = st[i];
        vp_rank_estimate *r;
        size_t rn, rw;
        s = run_stage(m, &one, setup, &r, &rn, &rw, err);
        if (s != VP_OK)
            break;
        if (*roles == NULL || heavier(&r[rw].est, &(*roles)[*worst].est)) {
            free(*roles);
            *roles = r;
            *n = rn;
            *worst = rw;
            best = st[i];
        } else {
            free(r);
        }
    }
    if (s != VP_OK) {
        free(*roles);
        *roles = NULL;
        return s;
    }
    l->stage = best;
    return VP_OK;
}
