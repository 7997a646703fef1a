/* Validation against measured runs in the ground-truth schema. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "yaml_doc.h"

static const char *const CASE_PRECS[] = {"fp32", "amp-bf16", "amp-fp16",
                                         "bf16", "fp16-pure", NULL};
static const char *const CASE_OPTS[] = {"adamw", "adamw-fused",
                                        "adamw-forloop", "sgd", "adafactor",
                                        NULL};
static const vp_optimizer OPT_MAP[] = {VP_OPT_ADAMW, VP_OPT_ADAMW_FUSED,
                                       VP_OPT_ADAMW_FORLOOP, VP_OPT_SGD,
                                       VP_OPT_ADAFACTOR};
static const char *const CASE_ATTNS[] = {"sdpa", "flash", "efficient",
                                         "eager", "math", NULL};

#define TRY(x)                                                             \
    do {                                                                   \
        vp_status st_ = (x);                                               \
        if (st_ != VP_OK)                                                  \
            goto done;                                                     \
    } while (0)

static bool get_u64(vp_ydoc *d, yaml_node_t *m, const char *k, uint64_t *out,
                    vp_status *st, vp_error *err)
{
    yaml_node_t *n = vp__ymap_get(d, m, k, NULL);
    if (!n || vp__yis_null(n))
        return false;
    *st = vp__yget_u64(d, n, 0, UINT64_MAX, out, err);
    return *st == VP_OK;
}

static void add_metric(vp_case_result *r, const char *name, uint64_t pred,
                       uint64_t meas)
{
    if (r->n_metrics >= VP_VALIDATE_MAX_METRICS)
        return;
    vp_metric *m = &r->metrics[r->n_metrics++];
    snprintf(m->name, sizeof m->name, "%s", name);
    m->predicted = pred;
    m->measured = meas;
    m->rel_err = meas ? ((double)pred - (double)meas) / (double)meas : 0.0;
}

static vp_model *find_model(const char *name, const char *const *dirs,
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

vp_status vp_validate_case(const char *json, size_t len, const char *where,
                           const char *const *dirs, size_t n_dirs,
                           bool first_in_process, vp_case_result *out,
                           vp_error *err)
{
    return vp_validate_case_on(json, len, where, dirs, n_dirs,
                               first_in_process, NULL, NULL, out, err);
}

vp_status vp_validate_case_on(const char *json, size_t len,
                              const char *where, const char *const *dirs,
                              size_t n_dirs, bool first_in_process,
                              const vp_setup *base, const vp_hw *hw,
                              vp_case_result *out, vp_error *err)
{
    memset(out, 0, sizeof *out);
    vp_error_clear(err);
    vp_ydoc d;
    memset(&d, 0, sizeof d);
    d.path = where;
    vp_model *m = NULL;
    vp_graph *g = NULL;
    bool *ck = NULL;
    vp_status st = vp__ydoc_load(&d, json, len, err);
    if (st != VP_OK)
        goto done;
    yaml_node_t *root = vp__ydoc_root(&d);
    if (root->type != YAML_MAPPING_NODE) {
        st = vp__yerr(&d, root, VP_ESCHEMA, err, "a case must be an object");
        goto done;
    }
    const char *id = "", *model = NULL;
    yaml_node_t *n;
    if ((n = vp__ymap_get(&d, root, "id", NULL)))
        TRY(st = vp__yget_str(&d, n, &id, err));
    n = vp__ymap_get(&d, root, "model", NULL);
    if (!n) {
        st = vp__yerr(&d, root, VP_ESCHEMA, err, "the case has no \"model\"");
        goto done;
    }
    TRY(st = vp__yget_str(&d, n, &model, err));
    snprintf(out->id, sizeof out->id, "%s", id);
    snprintf(out->model, sizeof out->model, "%s", model);
    if ((n = vp__ymap_get(&d, root, "error", NULL))) {
        st = vp__yerr(&d, n, VP_EARG, err,
                      "case '%s' failed when it was measured", id);
        goto done;
    }
    vp_setup s;
    if (base)
        s = *base;
    else
        vp_setup_init(&s);
    s.fresh_process = first_in_process;
    int v;
    if ((n = vp__ymap_get(&d, root, "prec", NULL))) {
        TRY(st = vp__yget_enum(&d, n, CASE_PRECS, &v, err));
        s.precision = v == 4 ? VP_PREC_FP16 : (vp_precision)v;
    }
    if ((n = vp__ymap_get(&d, root, "opt", NULL))) {
        TRY(st = vp__yget_enum(&d, n, CASE_OPTS, &v, err));
        s.optimizer = OPT_MAP[v];
    }
    if ((n = vp__ymap_get(&d, root, "attn", NULL))) {
        TRY(st = vp__yget_enum(&d, n, CASE_ATTNS, &v, err));
        s.attn = (vp_attn_impl)v;
        s.attn_set = true;
    }
    bool ckpt = false;
    if ((n = vp__ymap_get(&d, root, "ckpt", NULL)))
        TRY(st = vp__yget_bool(&d, n, &ckpt, err));
    if ((n = vp__ymap_get(&d, root, "set_to_none", NULL)))
        TRY(st = vp__yget_bool(&d, n, &s.set_to_none, err));
    if ((n = vp__ymap_get(&d, root, "infer", NULL)))
        TRY(st = vp__yget_bool(&d, n, &s.inference, err));
    uint64_t u;
    st = VP_OK;
    if (get_u64(&d, root, "accum", &u, &st, err))
        s.accum = (uint32_t)(u ? u : 1);
    TRY(st);
    yaml_node_t *sn0 = vp__ymap_get(&d, root, "steps", NULL);
    if (sn0 && sn0->type == YAML_SEQUENCE_NODE) {
        u = (uint64_t)(sn0->data.sequence.items.top -
                       sn0->data.sequence.items.start);
        s.steps = (uint32_t)(u > VP_MAX_STEPS ? VP_MAX_STEPS : u ? u : 1);
    } else if (get_u64(&d, root, "steps", &u, &st, err)) {
        s.steps = (uint32_t)(u > VP_MAX_STEPS ? VP_MAX_STEPS : u ? u : 1);
    }
    TRY(st);
    if (!get_u64(&d, root, "batch", &s.batch, &st, err) &&
        !vp__ymap_get(&d, root, "budget_gib", NULL)) {
        if (st == VP_OK)
            st = vp__yerr(&d, root, VP_ESCHEMA, err,
                          "the case has no \"batch\"");
        goto done;
    }
    TRY(st);
    uint64_t seq = 0;
    get_u64(&d, root, "seq", &seq, &st, err);
    TRY(st);
    m = find_model(model, dirs, n_dirs, err);
    if (!m) {
        st = err ? err->code : VP_EIO;
        goto done;
    }
    yaml_node_t *bg = vp__ymap_get(&d, root, "budget_gib", NULL);
    if (bg) {
        /* a max-batch case: collect.py caps the allocator at budget_gib
         * with set_per_process_memory_fraction and runs two steps per
         * trial, in a process that already made its workspaces */
        double gib;
        const char *txt = vp__yscalar(bg);
        char *end = NULL;
        gib = txt ? strtod(txt, &end) : -1.0;
        if (!txt || *end || !(gib > 0.0) || gib > 1e6) {
            st = vp__yerr(&d, bg, VP_ESCHEMA, err,
                          "budget_gib must be a positive number");
            goto done;
        }
        s.alloc.limit = (uint64_t)(gib * (double)VP_GiB);
        s.steps = 2;
        s.fresh_process = false;
        s.seq = seq;
        uint64_t meas_mb;
        if (!get_u64(&d, root, "max_batch", &meas_mb, &st, err)) {
            if (st == VP_OK)
                st = vp__yerr(&d, root, VP_ESCHEMA, err,
                              "a budget_gib case needs \"max_batch\"");
            goto done;
        }
        uint64_t cap = 8192;
        get_u64(&d, root, "cap", &cap, &st, err);
        TRY(st);
        vp_maxbatch_result mb;
        /* the measurement's own search: doubling stops past cap */
        TRY(st = vp_maxbatch_doubling(m, &s, ckpt ? "all" : NULL, cap, &mb,
                                      err));
        add_metric(out, "max_batch", mb.max_batch, meas_mb);
        goto done;
    }
    g = vp_graph_build(m, s.batch, seq, err);
    if (!g) {
        st = err ? err->code : VP_ESCHEMA;
        goto done;
    }
    size_t ns = vp_graph_segment_count(g);
    ck = calloc(ns ? ns : 1, sizeof *ck);
    if (!ck) {
        st = vp_error_set(err, VP_ENOMEM, "out of memory");
        goto done;
    }
    if (ckpt)
        vp_graph_default_checkpoint(g, ck);
    s.checkpoint = ck;
    s.n_checkpoint = ns;
    vp_estimate e;
    TRY(st = vp_simulate(g, &s, &e, NULL, NULL, err));
    uint64_t meas;
    if (get_u64(&d, root, "peak_alloc", &meas, &st, err))
        add_metric(out, "peak_alloc", e.peak_alloc, meas);
    TRY(st);
    if (get_u64(&d, root, "peak_reserved", &meas, &st, err))
        add_metric(out, "peak_reserved", e.peak_reserved, meas);
    TRY(st);
    if (get_u64(&d, root, "after_model", &meas, &st, err))
        add_metric(out, "after_model", e.after_model, meas);
    TRY(st);
    if (get_u64(&d, root, "device_used", &meas, &st, err))
        add_metric(out, "device_used", e.device_used, meas);
    TRY(st);
    yaml_node_t *msn = vp__ymap_get(&d, root, "step_ms", NULL);
    if (hw && msn) {
        const char *txt = vp__yscalar(msn);
        char *end = NULL;
        double ms = txt ? strtod(txt, &end) : -1.0;
        if (txt && !*end && ms > 0.0) {
            vp_step_time t;
            TRY(st = vp_step_time_estimate(g, &s, hw, &t, err));
            add_metric(out, "step_us", (uint64_t)(t.total * 1e6 + 0.5),
                       (uint64_t)(ms * 1e3 + 0.5));
        }
    }
    yaml_node_t *steps = vp__ymap_get(&d, root, "steps", NULL);
    if (steps && steps->type == YAML_SEQUENCE_NODE) {
        size_t k = 0;
        size_t total = (size_t)(steps->data.sequence.items.top -
                                steps->data.sequence.items.start);
        for (yaml_node_item_t *it = steps->data.sequence.items.start;
             it < steps->data.sequence.items.top; it++, k++) {
            /* step 1 and the last step */
            if (k != 0 && k + 1 != total)
                continue;
            if (k >= e.steps)
                break;
            yaml_node_t *sn = vp__ynode(&d, *it);
            static const char *const keys[] = {"fwd_peak", "bwd_peak",
                                               "opt_peak"};
            static const vp_phase ph[] = {VP_PHASE_FORWARD, VP_PHASE_BACKWARD,
                                          VP_PHASE_OPTIMIZER};
            for (int q = 0; q < 3; q++) {
                if (get_u64(&d, sn, keys[q], &meas, &st, err)) {
                    char name[32];
                    snprintf(name, sizeof name, "step%zu.%s", k + 1, keys[q]);
                    add_metric(out, name, e.step[k].peak[ph[q]], meas);
                }
                TRY(st);
            }
        }
    }
done:
    free(ck);
    vp_graph_free(g);
    vp_model_free(m);
    vp__ydoc_destroy(&d);
    return st;
}
