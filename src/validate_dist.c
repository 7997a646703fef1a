/* Validation of multi-GPU cases (scripts/collect_dist.py) against the
 * cluster planner's per-GPU memory model (cluster.h, docs/CLUSTER.md).
 *
 * A case line is one rank of one data-parallel run: the ground-truth
 * schema plus `world`, `rank`, `strategy` and `mixed_precision`. The run
 * is evaluated as the cluster configuration dp = world (tp = pp = cp = ep
 * = 1, one micro-batch of `batch` sequences per rank) on H200s, and the
 * most loaded GPU's figures are compared with the rank's measurements:
 *
 *   peak_alloc    = weights + grads + optimizer + buffers + activations
 *                   + transient   (the caching allocator's bytes, at the
 *                   larger of the forward/backward peak and the optimizer
 *                   step's, docs/CLUSTER.md "Two peaks")
 *   peak_reserved = peak_alloc + overhead (alloc_overhead, 5 %)
 *   device_used   = peak_reserved + NCCL buffers + CUDA context
 *
 * Data parallelism loads every rank alike, so every rank gets the same
 * prediction; the metrics carry the rank ("rank3.peak_alloc"). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "yaml_doc.h"
#include "vramplan/cluster.h"

/* The strategies collect_dist.py runs, and the cluster's shardings. */
static const char *const DIST_STRATEGIES[] = {
    "ddp", "ddp-bucket-view", "fsdp-full", "fsdp-grad-op", NULL};
static const vp_sharding DIST_SHARDING[] = {
    VP_SHARD_DDP, VP_SHARD_DDP, VP_SHARD_FSDP_FULL, VP_SHARD_FSDP_GRAD_OP};
static const bool DIST_BUCKET_VIEW[] = {false, true, false, false};

/* The cluster model counts AdamW's two fp32 moments and, for PyTorch's
 * engines, the foreach implementation's step temporary (PyTorch's
 * default, what collect_dist.py runs): the fused and for-loop forms,
 * which lack it, are not modelled. */
static const char *const DIST_OPTS[] = {"adamw", "adamw-fused",
                                        "adamw-forloop", "sgd", "adafactor",
                                        NULL};
#define DIST_N_ADAM 1

static const char *const DIST_ATTNS[] = {"sdpa", "flash", "efficient",
                                         "eager", "math", NULL};

/* The largest world a case may name: the cluster planner's GPU counts are
 * 32-bit, and a data-parallel run of more ranks is not measured here. */
#define DIST_MAX_WORLD 65536u

#define TRY(x)                                                             \
    do {                                                                   \
        st = (x);                                                          \
        if (st != VP_OK)                                                   \
            goto done;                                                     \
    } while (0)

static void dist_metric(vp_case_result *r, uint64_t rank, const char *what,
                        uint64_t pred, uint64_t meas)
{
    if (r->n_metrics >= VP_VALIDATE_MAX_METRICS)
        return;
    vp_metric *m = &r->metrics[r->n_metrics++];
    snprintf(m->name, sizeof m->name, "rank%llu.%s", (unsigned long long)rank,
             what);
    m->predicted = pred;
    m->measured = meas;
    m->rel_err = meas ? ((double)pred - (double)meas) / (double)meas : 0.0;
}

static vp_model *dist_find_model(const char *name, const char *const *dirs,
                                 size_t n_dirs, vp_error *err)
{
    char path[1024];
    static const char *const exts[] = {".yaml", ".json"};
    for (size_t i = 0; i < n_dirs; i++) {
        for (size_t e = 0; e < 2; e++) {
            snprintf(path, sizeof path, "%s/%s%s", dirs[i], name, exts[e]);
            if (access(path, R_OK) == 0)
                return vp_model_load(path, err);
        }
    }
    vp_error_set(err, VP_EIO,
                 "model '%s' not found (looked for %s.yaml and %s.json in %zu "
                 "directories)",
                 name, name, name, n_dirs);
    return NULL;
}

/* An optional unsigned field: false when absent (or null); *st gets the
 * parse status when present. */
static bool dist_u64(vp_ydoc *d, yaml_node_t *m, const char *k,
                     uint64_t *out, vp_status *st, vp_error *err)
{
    yaml_node_t *n = vp__ymap_get(d, m, k, NULL);
    if (!n || vp__yis_null(n))
        return false;
    *st = vp__yget_u64(d, n, 0, UINT64_MAX, out, err);
    return *st == VP_OK;
}

/* An H200 SXM as gpus/h200.yaml describes it (usable bytes and context
 * measured); only the memory figures matter here, the rates only have to
 * be there for vp_par_check. */
static void dist_h200(vp_hw *hw)
{
    memset(hw, 0, sizeof *hw);
    snprintf(hw->name, sizeof hw->name, "h200");
    hw->memory = 150109880320ull;
    hw->context = 718077952ull;
    hw->fp32 = 67e12;
    hw->tf32 = 494.7e12;
    hw->bf16 = 989.4e12;
    hw->fp16 = 989.4e12;
    hw->fp8 = 1978.9e12;
    hw->hbm = 4.8e12;
    hw->host = 63e9;
    hw->nvlink = 450e9;
    vp_hw_fill_defaults(hw);
}

vp_status vp_validate_dist_case(const char *json, size_t len,
                                const char *where, const char *const *dirs,
                                size_t n_dirs, vp_case_result *out,
                                vp_error *err)
{
    memset(out, 0, sizeof *out);
    vp_error_clear(err);
    vp_ydoc d;
    memset(&d, 0, sizeof d);
    d.path = where;
    vp_model *m = NULL;
    vp_cluster_model *cm = NULL;
    vp_status st = vp__ydoc_load(&d, json, len, err);
    if (st != VP_OK)
        goto done;
    yaml_node_t *root = vp__ydoc_root(&d);
    if (!root || root->type != YAML_MAPPING_NODE) {
        st = root ? vp__yerr(&d, root, VP_ESCHEMA, err,
                             "a case must be an object")
                  : vp_error_set(err, VP_ESCHEMA, "%s: empty case", where);
        goto done;
    }
    const char *id = "", *model = NULL;
    yaml_node_t *n;
    if ((n = vp__ymap_get(&d, root, "id", NULL)))
        TRY(vp__yget_str(&d, n, &id, err));
    snprintf(out->id, sizeof out->id, "%s", id);
    if (!(n = vp__ymap_get(&d, root, "model", NULL))) {
        st = vp__yerr(&d, root, VP_ESCHEMA, err, "the case has no \"model\"");
        goto done;
    }
    TRY(vp__yget_str(&d, n, &model, err));
    snprintf(out->model, sizeof out->model, "%s", model);

    /* the multi-GPU fields */
    uint64_t world = 0, rank = 0, local_world = 0;
    if (!(n = vp__ymap_get(&d, root, "world", NULL))) {
        st = vp__yerr(&d, root, VP_ESCHEMA, err, "the case has no \"world\"");
        goto done;
    }
    TRY(vp__yget_u64(&d, n, 0, UINT64_MAX, &world, err));
    if (world < 2 || world > DIST_MAX_WORLD) {
        st = vp__yerr(&d, n, VP_ERANGE, err,
                      "world %llu: a multi-GPU case has 2 to %u ranks",
                      (unsigned long long)world, DIST_MAX_WORLD);
        goto done;
    }
    if (!(n = vp__ymap_get(&d, root, "rank", NULL))) {
        st = vp__yerr(&d, root, VP_ESCHEMA, err, "the case has no \"rank\"");
        goto done;
    }
    TRY(vp__yget_u64(&d, n, 0, UINT64_MAX, &rank, err));
    if (rank >= world) {
        st = vp__yerr(&d, n, VP_ERANGE, err,
                      "rank %llu is not below the world size %llu",
                      (unsigned long long)rank, (unsigned long long)world);
        goto done;
    }
    if ((n = vp__ymap_get(&d, root, "local_world", NULL)) &&
        !vp__yis_null(n)) {
        TRY(vp__yget_u64(&d, n, 0, UINT64_MAX, &local_world, err));
        if (local_world < 1 || local_world > world) {
            st = vp__yerr(&d, n, VP_ERANGE, err,
                          "local_world %llu must be 1 to the world size %llu",
                          (unsigned long long)local_world,
                          (unsigned long long)world);
            goto done;
        }
    } else {
        local_world = world < 8 ? world : 8;
    }
    if (!(n = vp__ymap_get(&d, root, "strategy", NULL))) {
        st = vp__yerr(&d, root, VP_ESCHEMA, err,
                      "the case has no \"strategy\"");
        goto done;
    }
    int strat;
    TRY(vp__yget_enum(&d, n, DIST_STRATEGIES, &strat, err));
    bool mp = false;
    if (!(n = vp__ymap_get(&d, root, "mixed_precision", NULL))) {
        st = vp__yerr(&d, root, VP_ESCHEMA, err,
                      "the case has no \"mixed_precision\"");
        goto done;
    }
    TRY(vp__yget_bool(&d, n, &mp, err));

    /* a case that failed on the GPU has nothing to compare */
    if ((n = vp__ymap_get(&d, root, "error", NULL))) {
        st = vp__yerr(&d, n, VP_EARG, err,
                      "case '%s' failed on rank %llu when it was measured",
                      id, (unsigned long long)rank);
        goto done;
    }

    /* what the cluster model covers */
    int v;
    if ((n = vp__ymap_get(&d, root, "opt", NULL))) {
        TRY(vp__yget_enum(&d, n, DIST_OPTS, &v, err));
        if (v >= DIST_N_ADAM) {
            st = vp__yerr(&d, n, VP_EUNSUPPORTED, err,
                          "the cluster model counts foreach AdamW (PyTorch's "
                          "default): its state and its step's temporary; "
                          "optimizer '%s' is not modelled for multi-GPU cases",
                          DIST_OPTS[v]);
            goto done;
        }
    }
    bool flag = false;
    if ((n = vp__ymap_get(&d, root, "infer", NULL))) {
        TRY(vp__yget_bool(&d, n, &flag, err));
        if (flag) {
            st = vp__yerr(&d, n, VP_EUNSUPPORTED, err,
                          "multi-GPU cases are training steps; inference is "
                          "not modelled");
            goto done;
        }
    }
    bool ckpt = false;
    if ((n = vp__ymap_get(&d, root, "ckpt", NULL)))
        TRY(vp__yget_bool(&d, n, &ckpt, err));
    int attn = -1;
    if ((n = vp__ymap_get(&d, root, "attn", NULL)))
        TRY(vp__yget_enum(&d, n, DIST_ATTNS, &attn, err));
    uint64_t batch = 0, seq = 0, accum = 1;
    if (!dist_u64(&d, root, "batch", &batch, &st, err)) {
        if (st == VP_OK)
            st = vp__yerr(&d, root, VP_ESCHEMA, err,
                          "the case has no \"batch\"");
        goto done;
    }
    if (batch < 1) {
        st = vp__yerr(&d, vp__ymap_get(&d, root, "batch", NULL), VP_ERANGE,
                      err, "batch must be at least 1");
        goto done;
    }
    dist_u64(&d, root, "seq", &seq, &st, err);
    TRY(st);
    if (dist_u64(&d, root, "accum", &accum, &st, err) && accum < 1)
        accum = 1;
    TRY(st);

    m = dist_find_model(model, dirs, n_dirs, err);
    if (!m) {
        st = err ? err->code : VP_EIO;
        goto done;
    }
    if (attn >= 0 && m->form == 0)
        m->tf.attn = (vp_attn_impl)attn;
    cm = vp_cluster_model_new(m, seq, err);
    if (!cm) {
        st = err ? err->code : VP_EUNSUPPORTED;
        goto done;
    }

    vp_hw hw;
    dist_h200(&hw);
    vp_cluster c;
    vp_cluster_init(&c, &hw, (uint32_t)world, (uint32_t)local_world);
    vp_par p;
    memset(&p, 0, sizeof p);
    p.dp = (uint32_t)world;
    p.tp = p.pp = p.cp = p.ep = p.vpp = 1;
    p.schedule = VP_SCHED_1F1B;
    p.micro_batch = batch;
    p.accum = accum;
    /* DDP: autocast over fp32 parameters; FSDP: MixedPrecision with bf16
     * parameters, reductions and buffers; without either, fp32 */
    p.dtype = mp ? VP_DT_BF16 : VP_DT_FP32;
    p.recompute = ckpt ? VP_RC_FULL : VP_RC_NONE;
    p.sharding = DIST_SHARDING[strat];
    p.offload = VP_OFFLOAD_NONE;
    p.bucket_view = DIST_BUCKET_VIEW[strat];
    vp_cluster_mem mem;
    TRY(vp_cluster_eval(cm, &c, &p, &mem, NULL, err));

    uint64_t alloc = mem.weights + mem.grads + mem.optimizer + mem.buffers +
                     mem.activations + mem.transient;
    uint64_t reserved = alloc + mem.overhead;
    uint64_t meas;
    if (dist_u64(&d, root, "peak_alloc", &meas, &st, err))
        dist_metric(out, rank, "peak_alloc", alloc, meas);
    TRY(st);
    if (dist_u64(&d, root, "peak_reserved", &meas, &st, err))
        dist_metric(out, rank, "peak_reserved", reserved, meas);
    TRY(st);
    if (dist_u64(&d, root, "device_used", &meas, &st, err))
        dist_metric(out, rank, "device_used", mem.total, meas);
    TRY(st);
done:
    vp_cluster_model_free(cm);
    vp_model_free(m);
    vp__ydoc_destroy(&d);
    return st;
}
