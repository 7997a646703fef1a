/* Multi-GPU case lines (scripts/collect_dist.py, collect_dist_more.py)
 * through vp_validate_line on the synthetic lines of tests/data/dist/:
 * each line is simulated as its rank of its run (dist.h; the rules of each
 * wrapper are tested in test_dist.c), its measured figures compared, and
 * malformed or unsupported lines refused at their field. */
#define _POSIX_C_SOURCE 200809L

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vramplan/cluster.h"
#include "vramplan/validate.h"
#include "vramplan/vramplan.h"

#define CASES "tests/data/dist/cases.jsonl"
#define BAD "tests/data/dist/bad.jsonl"

#define P 110336ull
#define PU 49984ull
#define PR 10368ull
#define LAYERS 2ull

static const char *const DIRS[] = {"tests/data/dist", "models"};

/* The runs' GPU: gpus/h200.yaml, as validate finds it from the env line. */
static vp_hw h200(void)
{
    vp_error err;
    vp_gpu_profile *p = vp_gpu_load("h200", &err);
    vp_hw hw;

    cr_assert_not_null(p, "%s", err.msg);
    memset(&hw, 0, sizeof hw);
    vp_gpu_hw(p, VP_GPU_BF16, &hw);
    vp_hw_fill_defaults(&hw);
    vp_gpu_free(p);
    return hw;
}

/* One line of a multi-GPU file, as validate runs it. */
static vp_status dist_line(const char *json, size_t len, vp_case_result *r,
                           vp_error *err)
{
    vp_hw hw = h200();
    vp_validate_opts o = {"dist", 1, DIRS, 2, true, NULL, &hw, false, 0, 0.0};

    return vp_validate_line(json, len, &o, r, err);
}

/* The first line of path containing needle (and needle2 if given);
 * malloc'ed. */
static char *line_with(const char *path, const char *needle,
                       const char *needle2)
{
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "cannot open %s", path);
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    char *found = NULL;
    while ((len = getline(&line, &cap, f)) > 0) {
        if (strstr(line, needle) && (!needle2 || strstr(line, needle2))) {
            found = strdup(line);
            break;
        }
    }
    free(line);
    fclose(f);
    cr_assert_not_null(found, "%s: no line with %s %s", path, needle,
                       needle2 ? needle2 : "");
    return found;
}

static vp_status run(const char *path, const char *id, int rank,
                     vp_case_result *r, vp_error *err)
{
    char n1[160], n2[40];
    snprintf(n1, sizeof n1, "\"id\": \"%s\"", id);
    snprintf(n2, sizeof n2, "\"rank\": %d,", rank);
    char *line = line_with(path, n1, rank >= 0 ? n2 : NULL);
    vp_status st = dist_line(line, strlen(line), r, err);
    free(line);
    return st;
}

static const vp_metric *metric(const vp_case_result *r, const char *name)
{
    for (size_t i = 0; i < r->n_metrics; i++)
        if (!strcmp(r->metrics[i].name, name))
            return &r->metrics[i];
    cr_assert_fail("case %s has no metric %s", r->id, name);
    return NULL;
}

/* ---- the parameter counts the derivations rest on ------------------- */

Test(validate_dist, tiny_model_counts_match_hand_count)
{
    vp_error err;
    vp_model *m = vp_model_load("tests/data/dist/tiny-gpt.yaml", &err);
    cr_assert_not_null(m, "%s", err.msg);
    vp_cluster_model *cm = vp_cluster_model_new(m, 32, &err);
    cr_assert_not_null(cm, "%s", err.msg);
    vp_cluster_model_info in;
    vp_cluster_model_info_get(cm, &in);
    /* 12 h^2 + 13 h per GPT-2 layer with h = 64 */
    cr_assert_eq(in.layer_params, 12 * 64 * 64 + 13 * 64);
    cr_assert_eq(in.layer_params, PU);
    cr_assert_eq(in.embed_params, 128 * 64 + 32 * 64);
    cr_assert_eq(in.head_params, 2 * 64); /* final norm; the output is tied */
    cr_assert_eq(in.embed_params + in.head_params, PR);
    cr_assert_eq(in.params, LAYERS * PU + PR);
    cr_assert_eq(in.params, P);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

/* ---- reserved, device, metrics ---------------------------------------- */

Test(validate_dist, a_rank_line_reports_its_rank)
{
    /* the simulated rank's peaks; the device adds the context to the
     * reserved peak */
    vp_case_result r;
    vp_error err;
    cr_assert_eq(run(CASES, "ddp-fp32-w2", 0, &r, &err), VP_OK, "%s",
                 err.msg);
    cr_assert_eq(r.world, 2);
    cr_assert_eq(r.rank, 0);
    uint64_t a = metric(&r, "rank0.peak_alloc")->predicted;
    uint64_t res = metric(&r, "rank0.peak_reserved")->predicted;
    uint64_t dev = metric(&r, "rank0.device_used")->predicted;
    cr_assert_geq(res, a);
    cr_assert_gt(dev, res);
    /* two nodes of 4: DDP's rank 6 plays rank 0's role */
    vp_case_result r6;
    cr_assert_eq(run(CASES, "ddp-fp32-w8-2nodes", 6, &r6, &err), VP_OK,
                 "%s", err.msg);
    cr_assert_eq(metric(&r6, "rank6.peak_alloc")->predicted, a);
}

Test(validate_dist, every_rank_gets_the_same_prediction)
{
    vp_case_result r0, r1;
    vp_error err;
    cr_assert_eq(run(CASES, "ddp-fp32-w2", 0, &r0, &err), VP_OK, "%s",
                 err.msg);
    cr_assert_eq(run(CASES, "ddp-fp32-w2", 1, &r1, &err), VP_OK, "%s",
                 err.msg);
    cr_assert_str_eq(r0.id, "ddp-fp32-w2");
    cr_assert_str_eq(r0.model, "tiny-gpt");
    cr_assert_eq(r0.n_metrics, r1.n_metrics);
    static const char *const what[] = {"peak_alloc", "peak_reserved",
                                       "device_used"};
    for (int i = 0; i < 3; i++) {
        char n0[32], n1[32];
        snprintf(n0, sizeof n0, "rank0.%s", what[i]);
        snprintf(n1, sizeof n1, "rank1.%s", what[i]);
        cr_assert_eq(metric(&r0, n0)->predicted, metric(&r1, n1)->predicted);
    }
}

Test(validate_dist, relative_error_against_the_measurement)
{
    vp_case_result r;
    vp_error err;
    cr_assert_eq(run(CASES, "ddp-fp32-w2", 1, &r, &err), VP_OK, "%s",
                 err.msg);
    const vp_metric *m = metric(&r, "rank1.peak_alloc");
    cr_assert_eq(m->measured, 3500000);
    double want = ((double)m->predicted - 3500000.0) / 3500000.0;
    cr_assert_float_eq(m->rel_err, want, 1e-12);
    m = metric(&r, "rank1.device_used");
    cr_assert_eq(m->measured, 1060000000);
    /* only what was measured is compared */
    cr_assert_eq(run(CASES, "fsdp-full-fp32-w4", 3, &r, &err), VP_OK, "%s",
                 err.msg);
    cr_assert_eq(r.n_metrics, 1);
    cr_assert_str_eq(r.metrics[0].name, "rank3.peak_alloc");
    cr_assert_eq(run(CASES, "no-measurement", 0, &r, &err), VP_OK, "%s",
                 err.msg);
    cr_assert_eq(r.n_metrics, 0);
}

Test(validate_dist, every_line_of_the_synthetic_file_validates)
{
    FILE *f = fopen(CASES, "r");
    cr_assert_not_null(f);
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int n = 0;
    while ((len = getline(&line, &cap, f)) > 0) {
        if (strstr(line, "\"env\""))
            continue;
        /* the routing condition of `vramplan validate` */
        cr_assert_not_null(strstr(line, "\"world\""));
        vp_case_result r;
        vp_error err;
        vp_status st = dist_line(line, (size_t)len, &r, &err);
        cr_assert_eq(st, VP_OK, "%s", err.msg);
        n++;
    }
    free(line);
    fclose(f);
    cr_assert_eq(n, 17);
}

/* ---- errors ------------------------------------------------------------ */

typedef struct {
    const char *id;
    vp_status st;
    const char *msg; /* a part of the message */
} bad_case;

static const bad_case BAD_CASES[] = {
    {"unknown-strategy", VP_ESCHEMA, "unknown value 'zero3'"},
    {"typo-strategy", VP_ESCHEMA, "did you mean 'fsdp-full'"},
    {"world-0", VP_ERANGE, "from 1 to 65536, not 0"},
    {"world-negative", VP_ERANGE, "not -2"},
    {"world-huge", VP_ERANGE, "not 100000"},
    {"rank-out", VP_ERANGE, "rank 2 is not below the world size 2"},
    {"no-world", VP_ESCHEMA, "no \"world\""},
    {"no-rank", VP_ESCHEMA, "no \"rank\""},
    {"no-strategy", VP_ESCHEMA, "no \"strategy\""},
    {"no-mp", VP_ESCHEMA, "no \"mixed_precision\""},
    {"mp-not-bool", VP_ESCHEMA, "must be true or false"},
    {"local-world-big", VP_ERANGE, "local_world 3"},
    {"measured-error", VP_EARG, "failed when it was measured"},
    {"infer", VP_EUNSUPPORTED, "inference"},
    {"no-model-file", VP_EIO, "not found"},
    {"no-model", VP_ESCHEMA, "no \"model\""},
    {"no-batch", VP_ESCHEMA, "no \"batch\""},
    {"batch-0", VP_ERANGE, "at least 1"},
    {"peak-not-int", VP_ESCHEMA, "must be an integer"},
    /* FSDP2 + TP (collect_tp_fake.py) */
    {"tp-ddp", VP_ESCHEMA, "composes with fsdp2"},
    {"tp-mesh", VP_ERANGE, "dp 3 x tp 2 is not the world of 4"},
    {"lp-no-tp", VP_ESCHEMA, "'loss_parallel' needs 'tp'"},
    {"tp-no-sp", VP_EUNSUPPORTED, "without sequence-parallel norms"},
    {"tp-unknown", VP_ESCHEMA, "tp_mesh"},
    /* + PP (collect_pp_fake.py) */
    {"pp-stage", VP_ERANGE,
     "stage 0 contradicts rank 4 of dp 2 x tp 2 x pp 2 (stage 1)"},
    {"pp-few-micro", VP_ERANGE, "at least as many micro-batches as stages"},
    {"pp-no-micro", VP_ESCHEMA, "needs 'microbatches'"},
    {"pp-uneven", VP_ERANGE, "batch 3 is not split evenly into 2"},
    {"pp-accum", VP_ESCHEMA, "'microbatches', not 'accum'"},
    {"pp-gpipe", VP_ESCHEMA, "unknown value 'gpipe' for 'schedule'"},
    {"stage-no-pp", VP_ESCHEMA, "'stage' needs 'pp'"},
    {"pp-world", VP_ERANGE, "dp 2 x tp 2 x pp 2 is not the world of 4"},
    {"pp-ddp", VP_ESCHEMA, "pipeline parallelism composes with fsdp2"},
    {"pp-layers", VP_ERANGE, "stage_layers 2 is not stage 0's share"},
    {"pp-unknown", VP_ESCHEMA, "virtual_stages"},
    {"pp-outputs", VP_EUNSUPPORTED, "last stage's outputs kept"},
    {"outputs-no-pp", VP_ESCHEMA, "'return_outputs' needs 'pp'"},
};

Test(validate_dist, malformed_and_unsupported_cases)
{
    for (size_t i = 0; i < sizeof BAD_CASES / sizeof BAD_CASES[0]; i++) {
        const bad_case *b = &BAD_CASES[i];
        vp_case_result r;
        vp_error err;
        vp_status st = run(BAD, b->id, -1, &r, &err);
        cr_expect_eq(st, b->st, "%s: status %s (%s), want %s", b->id,
                     vp_err_name(st), err.msg, vp_err_name(b->st));
        cr_expect_eq(err.code, st, "%s", b->id);
        cr_expect_not_null(strstr(err.msg, b->msg), "%s: message '%s'",
                           b->id, err.msg);
        cr_expect_eq(r.n_metrics, 0, "%s", b->id);
    }
}

/* Lines the formula could not take and the simulator runs: world 1 (the
 * wrapper's own buffers still exist), SGD, a model that is not a
 * transformer, and AdamW's fused and for-loop forms. */
Test(validate_dist, simulated_setups_beyond_the_formula)
{
    static const char *const ids[] = {"world-1", "opt-sgd",
                                      "not-transformer"};
    for (size_t i = 0; i < 3; i++) {
        vp_case_result r;
        vp_error err;
        cr_assert_eq(run(BAD, ids[i], -1, &r, &err), VP_OK, "%s: %s",
                     ids[i], err.msg);
        cr_assert_gt(r.n_metrics, 0, "%s", ids[i]);
    }
    static const char *const opts[] = {"adamw", "adamw-fused",
                                       "adamw-forloop"};
    uint64_t peak[3];
    for (int i = 0; i < 3; i++) {
        char line[320];
        snprintf(line, sizeof line,
                 "{\"id\": \"opt\", \"model\": \"tiny-gpt\", "
                 "\"batch\": 2, \"seq\": 32, \"opt\": \"%s\", "
                 "\"world\": 2, \"rank\": 0, \"strategy\": \"ddp\", "
                 "\"mixed_precision\": false, \"peak_alloc\": 1}",
                 opts[i]);
        vp_case_result r;
        vp_error err;
        cr_assert_eq(dist_line(line, strlen(line), &r, &err), VP_OK, "%s: %s",
                     opts[i], err.msg);
        peak[i] = metric(&r, "rank0.peak_alloc")->predicted;
    }
    /* the optimizer's form is the one-GPU simulator's (test_sim.c): each
     * is simulated, the rank's peak at least its weights and buckets */
    for (int i = 0; i < 3; i++)
        cr_assert_geq(peak[i], 8 * P, "%s", opts[i]);
}

Test(validate_dist, errors_point_at_the_field)
{
    vp_case_result r;
    vp_error err;
    cr_assert_eq(run(BAD, "world-0", -1, &r, &err), VP_ERANGE);
    cr_assert_str_eq(err.path, "dist");
    cr_assert_eq(err.line, 1);
    /* the value of "world" */
    char *line = line_with(BAD, "\"id\": \"world-0\"", NULL);
    const char *at = strstr(line, "\"world\": ") + strlen("\"world\": ");
    cr_assert_eq(err.col, (uint32_t)(at - line) + 1);
    free(line);
    /* the id is known before the failure */
    cr_assert_str_eq(r.id, "world-0");
}

Test(validate_dist, not_an_object_or_not_json)
{
    vp_case_result r;
    vp_error err;
    char *line = line_with(BAD, "[\"not-object\"]", NULL);
    vp_status st = dist_line(line, strlen(line), &r, &err);
    free(line);
    cr_assert_eq(st, VP_ESCHEMA, "%s", err.msg);
    line = line_with(BAD, "syntax-error", NULL);
    st = dist_line(line, strlen(line), &r, &err);
    free(line);
    cr_assert_eq(st, VP_ESYNTAX, "%s: %s", vp_err_name(st), err.msg);
    st = dist_line("", 0, &r, &err);
    cr_assert_neq(st, VP_OK);
}

Test(validate_dist, world_one_smoke_run_is_simulated)
{
    /* tests/data/dist/h200-w1-smoke.jsonl: collect_dist.py under torchrun
     * with one process on one H200; world 1 is simulated (DDP's buckets and
     * FSDP's flat parameters exist there too), and the recorded OOM failed
     * when it was measured */
    FILE *f = fopen("tests/data/dist/h200-w1-smoke.jsonl", "r");
    cr_assert_not_null(f);
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int n = 0;
    while ((len = getline(&line, &cap, f)) > 0) {
        if (strstr(line, "\"env\""))
            continue;
        vp_case_result r;
        vp_error err;
        vp_status st = dist_line(line, (size_t)len, &r, &err);
        if (strstr(line, "\"error\"") != NULL) {
            cr_assert_eq(st, VP_EARG, "%s: %s", vp_err_name(st), err.msg);
        } else {
            cr_assert_eq(st, VP_OK, "%s: %s", vp_err_name(st), err.msg);
            cr_assert_eq(r.world, 1);
            cr_assert_gt(r.n_metrics, 0);
        }
        n++;
    }
    free(line);
    fclose(f);
    cr_assert_eq(n, 4);
}

/* The bytes after the model and at the peak of the rank of layout l
 * (tp 2, dp 2) that the library simulates (dist_tp.c), a micro-batch of
 * `batch` and `accum` of them; FSDP2's reshard_after_forward `raf` (-1:
 * its default). */
static void layout_peaks(const vp_tp_layout *l, uint64_t batch,
                         uint32_t accum, int32_t raf, uint64_t *after,
                         uint64_t *peak)
{
    vp_error err;
    vp_model *m = vp_model_load("tests/data/dist/tiny-llama.yaml", &err);
    cr_assert_not_null(m, "%s", err.msg);
    vp_graph *g = vp_tp_graph_build(m, l, batch, 32, &err);
    cr_assert_not_null(g, "%s", err.msg);
    vp_dist d;
    vp_dist_init(&d);
    d.strategy = VP_DIST_FSDP2;
    d.world = 2;
    d.param_dtype = VP_MP_BF16;
    d.reduce_dtype = VP_MP_FP32;
    d.empty_cache_after_wrap = true;
    if (raf >= 0)
        d.reshard_after_forward = raf;
    vp_setup s;
    vp_setup_init(&s);
    s.dist = &d;
    s.batch = batch;
    s.accum = accum;
    s.seq = 32;
    s.fresh_process = false;
    vp_pipeline pl;
    vp_tp_pipeline(l, &pl);
    s.pipe = l->pp > 1 ? &pl : NULL;
    vp_estimate e;
    cr_assert_eq(vp_simulate(g, &s, &e, NULL, NULL, &err), VP_OK, "%s",
                 err.msg);
    *after = e.after_model;
    *peak = 0;
    for (uint32_t k = 0; k < e.steps; k++)
        for (int ph = VP_PHASE_FORWARD; ph < VP_PHASE__COUNT; ph++)
            *peak = e.step[k].peak[ph] > *peak ? e.step[k].peak[ph] : *peak;
    vp_graph_free(g);
    vp_model_free(m);
}

/* An FSDP2 + TP line (collect_tp_fake.py): its rank is dist_tp.c's
 * tensor-parallel rank (tp 2) of FSDP2 over the dp ranks (2), as the
 * library simulates it: the same bytes after the model and at the peak;
 * loss_parallel false is torchtitan's disable_loss_parallel. */
static void tp_pair(bool lp, uint64_t *after, uint64_t *peak)
{
    vp_tp_layout l = {2, 1, 0, false, !lp};
    layout_peaks(&l, 1, 1, -1, after, peak);
}

Test(validate_dist, a_tp_line_is_its_tensor_parallel_rank)
{
    for (int lp = 0; lp < 2; lp++) {
        char line[512];
        snprintf(line, sizeof line,
                 "{\"id\": \"tp\", \"model\": \"tiny-llama\", "
                 "\"batch\": 1, \"seq\": 32, \"world\": 4, \"rank\": 1, "
                 "\"strategy\": \"fsdp2\", \"mixed_precision\": true, "
                 "\"param_dtype\": \"bf16\", \"reduce_dtype\": \"fp32\", "
                 "\"tp\": 2, \"dp\": 2, \"sequence_parallel\": true, "
                 "\"loss_parallel\": %s, \"after_model\": 1, "
                 "\"peak_alloc\": 1}", lp ? "true" : "false");
        vp_case_result r;
        vp_error err;
        cr_assert_eq(dist_line(line, strlen(line), &r, &err), VP_OK, "%s",
                     err.msg);
        uint64_t after, peak;
        tp_pair(lp, &after, &peak);
        cr_assert_eq(metric(&r, "rank1.after_model")->predicted, after);
        cr_assert_eq(metric(&r, "rank1.peak_alloc")->predicted, peak);
    }
}

/* An FSDP2 + TP + PP line (collect_pp_fake.py): rank 6 of dp 2 x tp 2 x
 * pp 2 is stage 6 / (dp x tp) = 1, and rank 1 stage 0; each is simulated
 * as its stage's graph under 1F1B with the step's batch of 4 split into
 * 2 micro-batches of 2, as the library simulates that stage. */
Test(validate_dist, a_pp_line_is_its_pipeline_stage)
{
    static const int rank[] = {1, 6};
    for (uint32_t stage = 0; stage < 2; stage++) {
        char line[640], name[32];
        snprintf(line, sizeof line,
                 "{\"id\": \"pp\", \"model\": \"tiny-llama\", "
                 "\"batch\": 4, \"seq\": 32, \"world\": 8, \"rank\": %d, "
                 "\"strategy\": \"fsdp2\", \"mixed_precision\": true, "
                 "\"param_dtype\": \"bf16\", \"reduce_dtype\": \"fp32\", "
                 "\"reshard_after_forward\": false, \"tp\": 2, \"dp\": 2, "
                 "\"pp\": 2, \"stage\": %u, \"stage_layers\": 1, "
                 "\"schedule\": \"1f1b\", \"microbatches\": 2, "
                 "\"return_outputs\": false, \"sequence_parallel\": true, "
                 "\"loss_parallel\": true, \"after_model\": 1, "
                 "\"peak_alloc\": 1}", rank[stage], stage);
        vp_case_result r;
        vp_error err;
        cr_assert_eq(dist_line(line, strlen(line), &r, &err), VP_OK, "%s",
                     err.msg);
        vp_tp_layout l = {2, 2, stage, false, false};
        uint64_t after, peak;
        layout_peaks(&l, 2, 2, 0, &after, &peak);
        snprintf(name, sizeof name, "rank%d.after_model", rank[stage]);
        cr_assert_eq(metric(&r, name)->predicted, after, "stage %u", stage);
        snprintf(name, sizeof name, "rank%d.peak_alloc", rank[stage]);
        cr_assert_eq(metric(&r, name)->predicted, peak, "stage %u", stage);
    }
}

/* The pipeline fields belong to multi-GPU lines: on a one-GPU line each
 * is an error that names it. */
Test(validate_dist, pipeline_fields_need_a_world)
{
    static const char *const fields[] = {"\"pp\": 2", "\"stage\": 0",
                                         "\"microbatches\": 2",
                                         "\"schedule\": \"1f1b\""};
    for (size_t i = 0; i < 4; i++) {
        char line[256];
        snprintf(line, sizeof line,
                 "{\"id\": \"one\", \"model\": \"tiny-llama\", "
                 "\"batch\": 1, \"seq\": 32, \"peak_alloc\": 1, %s}",
                 fields[i]);
        vp_case_result r;
        vp_error err;
        cr_expect_eq(dist_line(line, strlen(line), &r, &err), VP_ESCHEMA,
                     "%s", fields[i]);
        cr_expect_not_null(strstr(err.msg, "is a field of multi-GPU cases"),
                           "%s: %s", fields[i], err.msg);
    }
}
