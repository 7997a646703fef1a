/* Validation against measured runs in the ground-truth schema
 * (validate.h): the schemas of the lines of a ground-truth file, one-GPU
 * and max-batch cases, the env line and the file reader. Multi-GPU ranks
 * are run in validate_dist.c.
 *
 * Each kind of line has its own table of fields (vp__jschema_check):
 * adding a field is one row, with a generic handler that stores it in
 * vp_case_in, and the code that uses it. */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "validate_impl.h"
#include "vramplan/defaults.h"

const char *const vp__case_attns[] = {"sdpa", "flash", "efficient", "eager",
                                      "math", NULL};
const char *const vp__case_opts[] = {"adamw", "adamw-fused", "adamw-forloop",
                                     "sgd", "adafactor", NULL};
const char *const vp__dist_strategies[] = {
    "ddp", "ddp-bucket-view", "fsdp-full", "fsdp-grad-op", "ddp-zero1",
    "fsdp2", "fsdp-hybrid", "deepspeed-zero1", "deepspeed-zero2",
    "deepspeed-zero3", NULL};
const char *const vp__dist_precs[] = {"fp32", "amp-bf16", "fsdp-mp-bf16",
                                      "bf16", "fp16", NULL};
const char *const vp__dtypes[] = {"fp32", "bf16", "fp16", NULL};
const char *const vp__case_pgs[] = {"nccl", "fake", NULL};

/* One-GPU precisions: collect.py's names; "fp16-pure" is VP_PREC_FP16. */
const char *const vp__case_precs[] = {"fp32", "amp-bf16", "amp-fp16",
                                      "bf16", "fp16-pure", NULL};
const vp_precision vp__case_prec_map[] = {VP_PREC_FP32, VP_PREC_AMP_BF16,
                                          VP_PREC_AMP_FP16, VP_PREC_BF16,
                                          VP_PREC_FP16};
#define CASE_PRECS vp__case_precs
#define PREC_MAP vp__case_prec_map
static const vp_optimizer OPT_MAP[] = {VP_OPT_ADAMW, VP_OPT_ADAMW_FUSED,
                                       VP_OPT_ADAMW_FORLOOP, VP_OPT_SGD,
                                       VP_OPT_ADAFACTOR};
static const char *const AUTOCASTS[] = {"bf16", "fp16", NULL};

/* ---- the schemas ---------------------------------------------------------- */

#define BIG UINT64_MAX
#define ROW_INFO VP_JROW_INFO
#define ROW_LATER VP_JROW_LATER
#define ROW_STR(n, m) VP_JROW_STR(n, false, vp_case_in, m)
#define ROW_U64(n, lo, hi, m) VP_JROW_U64(n, false, lo, hi, vp_case_in, m)
#define ROW_REQ_U64(n, lo, hi, m) VP_JROW_U64(n, true, lo, hi, vp_case_in, m)
#define ROW_BOOL(n, m) VP_JROW_BOOL(n, false, vp_case_in, m)
#define ROW_ENUM(n, ch, m) VP_JROW_ENUM(n, false, ch, vp_case_in, m)

static vp_status not_first_line(void *ctx, const vp_jval *v, vp_error *err)
{
    (void)ctx;
    return vp__jerr(v->doc, v->node, true, VP_ESCHEMA, err,
                    "an env line must be the first line of the file");
}

static vp_status read_steps(void *ctx, const vp_jval *v, vp_error *err);

/* A multi-GPU field on a line without "world". */
static vp_status needs_world(void *ctx, const vp_jval *v, vp_error *err)
{
    (void)ctx;
    return vp__jerr(v->doc, v->node, true, VP_ESCHEMA, err,
                    "'%s' is a field of multi-GPU cases, and the case has no "
                    "\"world\"", v->field->name);
}
#define ROW_RANK_ONLY(n) {.name = n, .type = VP_JT_ANY, .apply = needs_world}

/* Every kind of line: who, what, whether it failed. */
static const vp_jfield ROWS_IDENT[] = {
    VP_JROW_STR("model", true, vp_case_in, model),
    VP_JROW_STR("id", true, vp_case_in, id), /* results are named by it */
    ROW_STR("error", failed),
    ROW_STR("hf_config", hf_config), /* every kind: vp__case_find_model */
    ROW_INFO("tb", VP_JT_STRING),     /* the traceback of a failed case */
    ROW_INFO("fam", VP_JT_STRING),
    ROW_INFO("wall_s", VP_JT_NUMBER),
    /* groundtruth/collect_hostprobe.py's host benchmark beside the case:
     * the step time's host speed (step_time_metric) */
    VP_JROW_NUM("host_probe_us", false, 0, true, 1e9, vp_case_in,
                host_probe_us),
    {.name = "env", .type = VP_JT_ANY, .apply = not_first_line},
};

/* Fields later versions will read: refused by name, never ignored. */
static const vp_jfield ROWS_LATER[] = {
    ROW_LATER("generate"),   ROW_LATER("cache"),
    /* and those of groundtruth/README.md's newer sets */
    ROW_LATER("runs"),
    ROW_LATER("kv_cache_bytes"), ROW_LATER("ms_per_token"),
};

/* Fine-tuning on several GPUs (the one-GPU rows: validate_ft.c). */
static const vp_jfield ROWS_RANK_LATER[] = {
    ROW_LATER("lora"),       ROW_LATER("base_dtype"),
    ROW_LATER("freeze"),     ROW_LATER("quant"),
    ROW_LATER("load"),       ROW_LATER("trainable_params"),
    ROW_LATER("setup_peak"), ROW_LATER("total_params"),
    ROW_LATER("peft"),
    /* and encoder-decoder models' (the one-GPU rows: ROWS_SETUP) */
    ROW_LATER("target"),
};

/* One-GPU setups (training cases and max-batch cases). */
static const vp_jfield ROWS_SETUP[] = {
    ROW_ENUM("prec", CASE_PRECS, prec),
    ROW_ENUM("opt", vp__case_opts, opt),
    ROW_ENUM("attn", vp__case_attns, attn),
    ROW_BOOL("ckpt", ckpt),
    ROW_BOOL("set_to_none", set_to_none),
    ROW_BOOL("infer", infer),
    ROW_U64("accum", 1, UINT32_MAX, accum),
    ROW_U64("seq", 1, BIG, seq),
    ROW_U64("target", 1, BIG, target),
    /* fields of the setups that later versions will model on one GPU */
    ROW_LATER("autocast"), ROW_LATER("fsdp_version"),
    ROW_LATER("param_dtype"), ROW_LATER("reduce_dtype"),
    ROW_LATER("reshard_after_forward"),
    ROW_RANK_ONLY("rank"), ROW_RANK_ONLY("strategy"),
    ROW_RANK_ONLY("local_world"), ROW_RANK_ONLY("mixed_precision"),
    ROW_RANK_ONLY("run"), ROW_RANK_ONLY("pg"), ROW_RANK_ONLY("mesh"),
    ROW_RANK_ONLY("ds_config"), ROW_RANK_ONLY("tp"), ROW_RANK_ONLY("dp"),
    ROW_RANK_ONLY("sequence_parallel"), ROW_RANK_ONLY("loss_parallel"),
    ROW_RANK_ONLY("pp"), ROW_RANK_ONLY("stage"), ROW_RANK_ONLY("schedule"),
    ROW_RANK_ONLY("microbatches"), ROW_RANK_ONLY("stage_layers"),
    ROW_RANK_ONLY("return_outputs"),
};

/* What a training case measured (one GPU or one rank). */
static const vp_jfield ROWS_MEASURED[] = {
    ROW_REQ_U64("batch", 1, BIG, batch),
    {.name = "steps", .type = VP_JT_ARRAY, .apply = read_steps},
    ROW_U64("after_model", 1, BIG, after_model),
    ROW_U64("peak_alloc", 1, BIG, peak_alloc),
    ROW_U64("peak_alloc_steady", 1, BIG, peak_alloc_steady),
    ROW_U64("peak_reserved", 1, BIG, peak_reserved),
    ROW_U64("device_used", 1, BIG, device_used),
    VP_JROW_NUM("step_ms", false, 0, true, 1e9, vp_case_in, step_ms),
    ROW_U64("params", 1, BIG, params),
    {.name = "num_alloc_retries", .type = VP_JT_U64, .max = BIG,
     .apply = vp__jset_node, .offset = offsetof(vp_case_in, retries_node)},
};

/* A max-batch case (collect.py maxbatch). */
static const vp_jfield ROWS_MAXBATCH[] = {
    VP_JROW_NUM("budget_gib", true, 0, true, 1e6, vp_case_in, budget_gib),
    ROW_REQ_U64("max_batch", 1, BIG, max_batch),
    ROW_U64("cap", 1, BIG, cap),
    ROW_INFO("probes", VP_JT_U64),
};

/* An HSDP mesh: [replicate, shard], two positive sizes. */
static vp_status read_mesh(void *ctx, const vp_jval *v, vp_error *err)
{
    vp_case_in *in = ctx;
    size_t n = json_array_size(v->json);
    for (size_t i = 0; i < n && n == 2; i++) {
        json_t *x = json_array_get(v->json, i);
        if (!json_is_integer(x) || json_integer_value(x) < 1 ||
            json_integer_value(x) > (json_int_t)VP_VALIDATE_MAX_WORLD)
            break;
        in->mesh[i] = (uint64_t)json_integer_value(x);
    }
    if (n != 2 || in->mesh[0] == 0 || in->mesh[1] == 0)
        return vp__jerr(v->doc, v->node, false, VP_ESCHEMA, err,
                        "'mesh' must be [replicate, shard]: two integers "
                        "from 1 to %u", VP_VALIDATE_MAX_WORLD);
    return VP_OK;
}

/* The pipeline schedules a rank line may name (vp_tp_layout: 1F1B). */
static const char *const SCHEDULES[] = {"1f1b", NULL};

/* One rank of a multi-GPU run (collect_dist.py). */
static const vp_jfield ROWS_RANK[] = {
    ROW_REQ_U64("world", 1, VP_VALIDATE_MAX_WORLD, world),
    ROW_REQ_U64("rank", 0, VP_VALIDATE_MAX_WORLD - 1, rank),
    ROW_U64("local_world", 1, VP_VALIDATE_MAX_WORLD, local_world),
    VP_JROW_ENUM("strategy", true, vp__dist_strategies, vp_case_in,
                 strategy),
    VP_JROW_BOOL("mixed_precision", true, vp_case_in, mixed_precision),
    ROW_ENUM("prec", vp__dist_precs, prec),
    ROW_ENUM("opt", vp__case_opts, opt),
    ROW_ENUM("attn", vp__case_attns, attn),
    ROW_BOOL("ckpt", ckpt),
    ROW_BOOL("infer", infer),
    ROW_U64("accum", 1, UINT32_MAX, accum),
    ROW_U64("seq", 1, BIG, seq),
    ROW_U64("run", 1, UINT32_MAX, run),
    ROW_ENUM("autocast", AUTOCASTS, autocast),
    ROW_ENUM("param_dtype", vp__dtypes, param_dtype),
    ROW_ENUM("reduce_dtype", vp__dtypes, reduce_dtype),
    ROW_U64("fsdp_version", 1, 2, fsdp_version),
    ROW_INFO("build_peak_alloc", VP_JT_U64),
    ROW_INFO("base_alloc", VP_JT_U64),
    ROW_INFO("local_params", VP_JT_U64),
    ROW_INFO("device_used_start", VP_JT_U64),
    ROW_INFO("error_phase", VP_JT_STRING),
    ROW_INFO("error_alloc", VP_JT_U64),
    ROW_INFO("error_reserved", VP_JT_U64),
    {.name = "reshard_after_forward", .type = VP_JT_ANY,
     .apply = vp__jset_node, .offset = offsetof(vp_case_in, reshard_node)},
    ROW_ENUM("pg", vp__case_pgs, pg),
    {.name = "mesh", .type = VP_JT_ARRAY, .apply = read_mesh},
    {.name = "ds_config", .type = VP_JT_ANY, .apply = vp__jset_node,
     .offset = offsetof(vp_case_in, ds_node)},
    /* FSDP2 + TP (collect_tp_fake.py; validate_dist.c) */
    ROW_U64("tp", 1, VP_VALIDATE_MAX_WORLD, tp),
    ROW_U64("dp", 1, VP_VALIDATE_MAX_WORLD, dp),
    {.name = "sequence_parallel", .type = VP_JT_BOOL, .apply = vp__jset_node,
     .offset = offsetof(vp_case_in, sp_node)},
    {.name = "loss_parallel", .type = VP_JT_BOOL, .apply = vp__jset_node,
     .offset = offsetof(vp_case_in, lp_node)},
    /* + PP (collect_pp_fake.py; validate_dist.c) */
    ROW_U64("pp", 1, VP_VALIDATE_MAX_WORLD, pp),
    {.name = "stage", .type = VP_JT_U64, .max = VP_VALIDATE_MAX_WORLD - 1,
     .apply = vp__jset_node, .offset = offsetof(vp_case_in, stage_node)},
    ROW_ENUM("schedule", SCHEDULES, schedule),
    ROW_U64("microbatches", 1, UINT32_MAX, microbatches),
    ROW_U64("stage_layers", 1, UINT32_MAX, stage_layers),
    /* whether schedule.step kept the last stage's outputs (it had no
     * return_outputs argument): refused on the last stage (validate_dist.c) */
    ROW_BOOL("return_outputs", return_outputs),
};

#define N(rows) (sizeof rows / sizeof rows[0])
#define MAX_ROWS 96

static size_t join(vp_jfield *out, size_t n, const vp_jfield *rows,
                   size_t k)
{
    VP_ASSERT(n + k <= MAX_ROWS);
    memcpy(out + n, rows, k * sizeof *rows);
    return n + k;
}

/* The table of a kind of line, in *rows; its length. */
static size_t schema_of(vp_gt_kind kind, vp_jfield *rows)
{
    size_t n = join(rows, 0, ROWS_IDENT, N(ROWS_IDENT));
    if (kind == VP_GT_GENERATE)
        return join(rows, n, vp__gen_rows, vp__n_gen_rows);
    n = join(rows, n, ROWS_LATER, N(ROWS_LATER));
    if (kind == VP_GT_RANK) {
        n = join(rows, n, ROWS_RANK_LATER, N(ROWS_RANK_LATER));
        return join(rows, join(rows, n, ROWS_MEASURED, N(ROWS_MEASURED)),
                    ROWS_RANK, N(ROWS_RANK));
    }
    n = join(rows, n, vp__case_ft_rows, vp__case_ft_n);
    n = join(rows, n, ROWS_SETUP, N(ROWS_SETUP));
    if (kind == VP_GT_MAXBATCH)
        return join(rows, n, ROWS_MAXBATCH, N(ROWS_MAXBATCH));
    return join(rows, n, ROWS_MEASURED, N(ROWS_MEASURED));
}

#define STEP_ROW(n, lo) VP_JROW_U64(#n, false, lo, BIG, vp_step_in, n)

static const vp_jfield ROWS_STEP[] = {
    STEP_ROW(start, 0),    STEP_ROW(fwd_peak, 1), STEP_ROW(after_fwd, 0),
    STEP_ROW(bwd_peak, 1), STEP_ROW(after_bwd, 0), STEP_ROW(opt_peak, 1),
    STEP_ROW(end, 0),      STEP_ROW(reserved, 0),
};

static vp_status read_steps(void *ctx, const vp_jval *v, vp_error *err)
{
    vp_case_in *in = ctx;
    const vp_jdoc *d = v->doc;

    if (json_array_size(v->json) == 0 ||
        json_array_size(v->json) > VP_MAX_STEPS)
        return vp__jerr(d, v->node, false, VP_ELIMIT, err,
                        "'steps' must hold 1 to %d steps, not %zu",
                        VP_MAX_STEPS, json_array_size(v->json));
    in->n_steps = 0;
    for (int c = d->nodes[v->node].first_child; c >= 0;
         c = d->nodes[c].next) {
        vp_step_in *s = &in->step[in->n_steps++];
        memset(s, 0, sizeof *s);
        vp_status st = vp__jschema_check(d, c, ROWS_STEP, N(ROWS_STEP),
                                         "a step", s, err);
        if (st != VP_OK)
            return st;
    }
    return VP_OK;
}

/* ---- reading a line ------------------------------------------------------- */

/* The measured peaks agree as collect.py records them: peak_alloc is the
 * largest phase peak of all steps, peak_alloc_steady that of the last
 * step, and peak_reserved is at least every step's reserved bytes (their
 * largest when no allocation was retried: the caching allocator releases
 * segments only on empty_cache and on that retry, so reserved never
 * falls). A value edited by hand (or corrupted) shows here even where the
 * model predicts nothing. */
static vp_status check_peaks(const vp_case_in *in, vp_error *err)
{
    uint64_t all = 0, last = 0, res = 0;
    const vp_jdoc *d = in->doc;

    for (uint32_t k = 0; k < in->n_steps; k++) {
        const vp_step_in *s = &in->step[k];
        last = s->fwd_peak > s->bwd_peak ? s->fwd_peak : s->bwd_peak;
        last = s->opt_peak > last ? s->opt_peak : last;
        all = last > all ? last : all;
        res = s->reserved > res ? s->reserved : res;
    }
    if (in->n_steps == 0)
        return VP_OK;
    if (in->peak_alloc && in->peak_alloc != all)
        return vp__jerr(d, vp__jdoc_member(d, 0, "peak_alloc"), false,
                        VP_ERANGE, err, "peak_alloc %" PRIu64 " is not the "
                        "largest phase peak of the steps (%" PRIu64 ")",
                        in->peak_alloc, all);
    if (in->peak_alloc_steady && in->peak_alloc_steady != last)
        return vp__jerr(d, vp__jdoc_member(d, 0, "peak_alloc_steady"), false,
                        VP_ERANGE, err, "peak_alloc_steady %" PRIu64 " is "
                        "not the last step's largest phase peak (%" PRIu64
                        ")", in->peak_alloc_steady, last);
    bool no_retry = in->retries_node >= 0 &&
                    json_integer_value(d->nodes[in->retries_node].value) == 0;
    if (in->peak_reserved && res &&
        (in->peak_reserved < res || (no_retry && in->peak_reserved != res)))
        return vp__jerr(d, vp__jdoc_member(d, 0, "peak_reserved"), false,
                        VP_ERANGE, err, "peak_reserved %" PRIu64 " is not the "
                        "largest reserved bytes of the steps (%" PRIu64 "%s)",
                        in->peak_reserved, res,
                        no_retry ? ", with no allocation retried" : "");
    return VP_OK;
}

static vp_gt_kind kind_of(const json_t *root)
{
    if (json_object_get(root, "world") != NULL)
        return VP_GT_RANK;
    if (json_object_get(root, "generate") != NULL)
        return VP_GT_GENERATE;
    if (json_object_get(root, "budget_gib") != NULL)
        return VP_GT_MAXBATCH;
    return VP_GT_CASE;
}

static void copy_str(char *dst, size_t n, const json_t *v)
{
    snprintf(dst, n, "%s", json_is_string(v) ? json_string_value(v) : "");
}

/* Parse and check a case line into *in (and the kind, id and model of
 * *out). The caller destroys *d when this succeeds. */
static vp_status read_case(const char *json, size_t len,
                           const vp_validate_opts *o, vp_jdoc *d,
                           vp_case_in *in, vp_case_result *out,
                           vp_error *err)
{
    vp_jfield rows[MAX_ROWS];

    vp_status st = vp__jdoc_parse(d, json, len, o->path, o->line, err);
    if (st != VP_OK)
        return st;
    memset(in, 0, sizeof *in);
    in->doc = d;
    in->prec = in->opt = in->attn = in->strategy = in->autocast = -1;
    in->param_dtype = in->reduce_dtype = in->reshard_node = -1;
    in->ds_node = in->sp_node = in->lp_node = in->stage_node = -1;
    in->schedule = -1;
    in->pg = -1;
    in->retries_node = -1;
    in->set_to_none = true;
    vp__case_ft_init(in);
    if (!json_is_object(d->root))
        return vp__jerr(d, 0, false, VP_ESCHEMA, err,
                        "a case must be a JSON object");
    out->kind = kind_of(d->root);
    copy_str(out->id, sizeof out->id, json_object_get(d->root, "id"));
    copy_str(out->model, sizeof out->model,
             json_object_get(d->root, "model"));
    size_t n = schema_of(out->kind, rows);
    in->gen.cache = -1;
    st = vp__jschema_check(d, 0, rows, n,
                           out->kind == VP_GT_RANK ? "a multi-GPU case"
                           : out->kind == VP_GT_MAXBATCH ? "a max-batch case"
                           : out->kind == VP_GT_GENERATE ? "a generate case"
                                                         : "a case",
                           in, err);
    if (st == VP_OK && in->failed != NULL)
        st = vp__jerr(d, vp__jdoc_member(d, 0, "error"), true, VP_EARG, err,
                      "the case failed when it was measured (error: %.64s)",
                      in->failed);
    return st == VP_OK ? check_peaks(in, err) : st;
}

/* ---- one GPU ------------------------------------------------------------- */

/* A case's "hf_config": a Hugging Face config.json, relative to the
 * folder of the case file `file` (or absolute); errors at the field. */
static vp_model *hf_config_model(const vp_case_in *in, const char *file,
                                 vp_error *err)
{
    const char *slash = file ? strrchr(file, '/') : NULL;
    int dl = slash && in->hf_config[0] != '/' ? (int)(slash - file + 1) : 0;
    int at = vp__jdoc_member(in->doc, 0, "hf_config");
    char path[1024];

    int w = snprintf(path, sizeof path, "%.*s%s", dl, file ? file : "",
                     in->hf_config);
    if (w < 0 || (size_t)w >= sizeof path) {
        vp__jerr(in->doc, at, false, VP_ELIMIT, err,
                 "the config's path is too long");
        return NULL;
    }
    if (access(path, R_OK) != 0) {
        vp__jerr(in->doc, at, false, VP_EIO, err, "hf_config '%s' not "
                 "found (looked for %s, beside the case file)",
                 in->hf_config, path);
        return NULL;
    }
    vp_model *m = vp_model_load(path, err);
    if (m == NULL && err != NULL) {
        char msg[sizeof err->msg];
        snprintf(msg, sizeof msg, "%s", err->msg);
        vp__jerr(in->doc, at, false, err->code, err, "hf_config '%s': %s",
                 path, msg);
    }
    return m;
}

vp_model *vp__case_find_model(const vp_case_in *in, const char *const *dirs,
                              size_t n_dirs, const char *file, vp_error *err)
{
    static const char *const exts[] = {".yaml", ".json"};
    const char *name = in->model, *slash = file ? strrchr(file, '/') : NULL;
    char path[1024];

    if (in->hf_config != NULL)
        return hf_config_model(in, file, err);
    for (size_t i = 0; i < n_dirs; i++)
        for (size_t e = 0; e < 2; e++) {
            snprintf(path, sizeof path, "%s/%s%s", dirs[i], name, exts[e]);
            if (access(path, R_OK) == 0)
                return vp_model_load(path, err);
        }
    /* a ground-truth folder's configs (groundtruth/hf_configs/) */
    int w = slash ? snprintf(path, sizeof path, "%.*s/hf_configs/%s.json",
                             (int)(slash - file), file, name)
                  : snprintf(path, sizeof path, "hf_configs/%s.json", name);
    if (w > 0 && (size_t)w < sizeof path && strchr(name, '/') == NULL &&
        access(path, R_OK) == 0)
        return vp_model_load(path, err);
    vp__jerr(in->doc, vp__jdoc_member(in->doc, 0, "model"), false, VP_EIO,
             err, "model '%s' not found (looked for %s.yaml and %s.json in "
             "%zu directories, and in hf_configs/ beside the file)", name,
             name, name, n_dirs);
    return NULL;
}

void vp__case_metric(vp_case_result *r, const char *name, uint64_t pred,
                     uint64_t meas)
{
    VP_ASSERT(r->n_metrics < VP_VALIDATE_MAX_METRICS && meas > 0);
    vp_metric *m = &r->metrics[r->n_metrics++];
    snprintf(m->name, sizeof m->name, "%s", name);
    m->predicted = pred;
    m->measured = meas;
    m->rel_err = ((double)pred - (double)meas) / (double)meas;
}

/* The setup a one-GPU line describes, from o->base. */
static vp_setup case_setup(const vp_case_in *in, const vp_validate_opts *o)
{
    vp_setup s;

    if (o->base != NULL)
        s = *o->base;
    else
        vp_setup_init(&s);
    s.fresh_process = o->first_in_process;
    if (in->prec >= 0)
        s.precision = PREC_MAP[in->prec];
    if (in->opt >= 0)
        s.optimizer = OPT_MAP[in->opt];
    if (in->attn >= 0) {
        s.attn = (vp_attn_impl)in->attn;
        s.attn_set = true;
    }
    s.set_to_none = in->set_to_none;
    s.inference = in->infer;
    s.accum = in->accum ? (uint32_t)in->accum : 1;
    s.batch = in->batch;
    s.seq = in->seq;
    s.target = in->target;
    if (in->n_steps > 0)
        s.steps = in->n_steps;
    vp__case_ft_setup(in, &s);
    return s;
}

/* A max-batch case: collect.py caps the allocator at budget_gib with
 * set_per_process_memory_fraction and runs two steps per trial, in a
 * process that already made its workspaces; its doubling search stops
 * past `cap` (8192 unless the case says). */
static vp_status run_maxbatch(const vp_case_in *in, const vp_validate_opts *o,
                              vp_model *m, vp_case_result *out,
                              vp_error *err)
{
    vp_setup s = case_setup(in, o);
    vp_maxbatch_result mb;

    s.alloc.limit = (uint64_t)(in->budget_gib * (double)VP_GiB);
    s.steps = VP_STEADY_STEPS;
    s.fresh_process = false;
    vp_status st = vp_maxbatch_doubling(m, &s, in->ckpt ? "all" : NULL,
                                        in->cap ? in->cap : 8192, &mb, err);
    if (st == VP_OK)
        vp__case_metric(out, "max_batch", mb.max_batch, in->max_batch);
    return st;
}

static vp_status step_time_metric(const vp_case_in *in, const vp_graph *g,
                                  const vp_setup *s,
                                  const vp_validate_opts *o,
                                  vp_case_result *out, vp_error *err)
{
    vp_step_time t;

    if (!o->step_time || o->hw == NULL || in->step_ms <= 0.0)
        return VP_OK;
    /* the host it ran on, where its benchmark and the profile's are known
     * (docs/STEP_TIME.md "The host's speed") */
    vp_hw hw = *o->hw;
    double probe = o->host_probe_us > 0.0 ? o->host_probe_us
                                          : in->host_probe_us;
    if (in->host_probe_us > 0.0 && hw.host_probe > 0.0)
        hw.host_scale = probe * 1e-6 / hw.host_probe;
    vp_status st = vp_step_time_estimate(g, s, &hw, &t, err);
    if (st == VP_OK)
        vp__case_metric(out, "step_us", (uint64_t)(t.total * 1e6 + 0.5),
                        (uint64_t)(in->step_ms * 1e3 + 0.5));
    return st;
}

/* The totals measured (the step time and the phase peaks follow). */
/* The peaks, and "params": the model's parameters as built, before any
 * adapters (collect.py and collect_more.py count them before peft). */
static void case_metrics(const vp_case_in *in, const vp_estimate *e,
                         const vp_graph *g, vp_case_result *out)
{
    const uint64_t pred[] = {e->peak_alloc, e->peak_reserved, e->after_model,
                             e->device_used};
    const uint64_t meas[] = {in->peak_alloc, in->peak_reserved,
                             in->after_model, in->device_used};
    static const char *const names[] = {"peak_alloc", "peak_reserved",
                                        "after_model", "device_used"};

    for (size_t i = 0; i < 4; i++)
        if (meas[i] > 0)
            vp__case_metric(out, names[i], pred[i], meas[i]);
    uint64_t n = e->params;
    if (in->params > 0 && vp_graph_num_params(g, &n, NULL) == VP_OK)
        vp__case_metric(out, "params", n, in->params);
}

static void step_metrics(const vp_case_in *in, const vp_estimate *e,
                         vp_case_result *out)
{
    static const char *const names[] = {"fwd_peak", "bwd_peak", "opt_peak"};
    static const vp_phase ph[] = {VP_PHASE_FORWARD, VP_PHASE_BACKWARD,
                                  VP_PHASE_OPTIMIZER};

    for (uint32_t k = 0; k < in->n_steps && k < e->steps; k++) {
        const uint64_t meas[] = {in->step[k].fwd_peak, in->step[k].bwd_peak,
                                 in->step[k].opt_peak};
        for (size_t q = 0; q < 3; q++) {
            char name[32];
            if (meas[q] == 0)
                continue;
            snprintf(name, sizeof name, "step%" PRIu32 ".%s", k + 1,
                     names[q]);
            vp__case_metric(out, name, e->step[k].peak[ph[q]], meas[q]);
        }
    }
}

static vp_status run_case(const vp_case_in *in, const vp_validate_opts *o,
                          vp_model *m, vp_case_result *out, vp_error *err)
{
    vp_setup s = case_setup(in, o);
    vp_estimate e;
    bool *ck = NULL;
    vp_status st;

    vp_graph *g = vp_graph_build_target(m, s.batch, s.seq, s.target, err);
    if (g == NULL)
        return err != NULL ? err->code : VP_ESCHEMA;
    if (in->target && vp_graph_target(g) == 0) {
        vp_graph_free(g);
        return vp__jerr(in->doc, vp__jdoc_member(in->doc, 0, "target"),
                        false, VP_ESCHEMA, err,
                        "'target' is the decoder length of an "
                        "encoder-decoder model; '%s' has no decoder of its "
                        "own", in->model);
    }
    size_t ns = vp_graph_segment_count(g);
    ck = calloc(ns ? ns : 1, sizeof *ck);
    if (ck == NULL) {
        st = vp_error_set(err, VP_ENOMEM, "out of memory");
        goto done;
    }
    if (in->ckpt)
        vp_graph_default_checkpoint(g, ck);
    s.checkpoint = ck;
    s.n_checkpoint = ns;
    st = vp_simulate(g, &s, &e, NULL, NULL, err);
    if (st != VP_OK)
        goto done;
    case_metrics(in, &e, g, out);
    vp__case_ft_metrics(in, &e, out);
    st = step_time_metric(in, g, &s, o, out, err);
    if (st == VP_OK)
        step_metrics(in, &e, out);
done:
    free(ck);
    vp_graph_free(g);
    return st;
}

vp_status vp_validate_line(const char *json, size_t len,
                           const vp_validate_opts *o, vp_case_result *out,
                           vp_error *err)
{
    vp_case_in in;
    vp_jdoc d;
    vp_model *m = NULL;

    memset(out, 0, sizeof *out);
    vp_error_clear(err);
    vp_status st = read_case(json, len, o, &d, &in, out, err);
    if (st != VP_OK && d.root == NULL)
        return st; /* nothing to destroy */
    out->run = (uint32_t)in.run;
    if (out->kind == VP_GT_RANK) {
        out->world = (uint32_t)in.world;
        out->rank = (uint32_t)in.rank;
    }
    if (st == VP_OK && out->kind == VP_GT_RANK)
        st = vp__validate_rank(&in, o, out, err);
    else if (st == VP_OK && out->kind == VP_GT_GENERATE)
        st = vp__validate_generate(&in, o, out, err);
    else if (st == VP_OK &&
             (m = vp__case_find_model(&in, o->dirs, o->n_dirs, o->path,
                                      err)) == NULL)
        st = err != NULL ? err->code : VP_EIO;
    else if (st == VP_OK && out->kind == VP_GT_MAXBATCH)
        st = run_maxbatch(&in, o, m, out, err);
    else if (st == VP_OK)
        st = run_case(&in, o, m, out, err);
    vp_model_free(m);
    vp__jdoc_destroy(&d);
    return st;
}

/* ---- the env line and files ---------------------------------------------- */

typedef struct env_ctx {
    vp_gt_env *env;
    const char *gpu, *torch;
} env_ctx;

static vp_status env_fields(void *ctx, const vp_jval *v, vp_error *err)
{
    static const vp_jfield rows[] = {
        VP_JROW_STR("gpu", false, env_ctx, gpu),
        VP_JROW_STR("torch", false, env_ctx, torch),
        ROW_INFO("cuda", VP_JT_STRING),
        ROW_INFO("transformers", VP_JT_STRING),
        ROW_INFO("nccl", VP_JT_STRING),
        ROW_INFO("nccl_env", VP_JT_OBJECT),
        ROW_INFO("host", VP_JT_STRING),
        /* groundtruth/collect_hostprobe.py's host benchmark {probe_us,
           launch_us} at the start of the set */
        ROW_INFO("host_probe", VP_JT_OBJECT),
        ROW_INFO("peft", VP_JT_STRING),
        ROW_INFO("pg", VP_JT_STRING),
        {.name = "rank", .type = VP_JT_U64, .max = VP_VALIDATE_MAX_WORLD},
        {.name = "local_world_size", .type = VP_JT_U64, .min = 1,
         .max = VP_VALIDATE_MAX_WORLD},
        {.name = "total", .type = VP_JT_U64, .min = 1, .max = BIG},
        {.name = "context_used_after_init", .type = VP_JT_U64, .max = BIG},
        {.name = "world_size", .type = VP_JT_U64, .min = 1,
         .max = VP_VALIDATE_MAX_WORLD},
    };
    env_ctx *c = ctx;
    vp_status st = vp__jschema_check(v->doc, v->node, rows, N(rows),
                                     "the env line", c, err);
    json_t *j = v->json;

    if (st != VP_OK)
        return st;
    snprintf(c->env->gpu, sizeof c->env->gpu, "%s", c->gpu ? c->gpu : "");
    snprintf(c->env->torch, sizeof c->env->torch, "%s",
             c->torch ? c->torch : "");
    c->env->total_bytes = (uint64_t)json_integer_value(
        json_object_get(j, "total"));
    c->env->context_bytes = (uint64_t)json_integer_value(
        json_object_get(j, "context_used_after_init"));
    c->env->world_size = (uint64_t)json_integer_value(
        json_object_get(j, "world_size"));
    c->env->warmed_up = json_object_get(j, "peft") != NULL;
    return VP_OK;
}

vp_status vp_validate_env(const char *json, size_t len, const char *path,
                          uint32_t line, vp_gt_env *out, vp_error *err)
{
    static const vp_jfield rows[] = {
        {.name = "env", .type = VP_JT_OBJECT, .required = true,
         .apply = env_fields},
    };
    env_ctx c = {out, NULL, NULL};
    vp_jdoc d;

    memset(out, 0, sizeof *out);
    vp_status st = vp__jdoc_parse(&d, json, len, path, line, err);
    if (st != VP_OK)
        return st;
    st = vp__jschema_check(&d, 0, rows, N(rows), "the env line", &c, err);
    vp__jdoc_destroy(&d);
    return st;
}

struct vp_gt_file {
    vp_jlines lines;
    bool has_env, pending;
    vp_gt_env env;
};

/* Whether a line is an object with the key "env" (not checked further). */
static bool is_env_line(const char *text, size_t len)
{
    json_t *j = json_loadb(text, len, 0, NULL);
    bool env = json_is_object(j) && json_object_get(j, "env") != NULL;

    json_decref(j);
    return env;
}

/* One line's host_probe_us, or 0 (a line that does not parse is left to
 * the main pass, which reports it). */
static double line_probe(const char *text, size_t len)
{
    json_t *j = json_loadb(text, len, 0, NULL);
    json_t *p = json_is_object(j) ? json_object_get(j, "host_probe_us") : NULL;
    double v = json_is_number(p) ? json_number_value(p) : 0.0;

    json_decref(j);
    return v > 0.0 && v < 1e9 ? v : 0.0;
}

/* The session's host speed: the median of the file's host_probe_us
 * (collect_hostprobe.py's benchmark before each case; docs/STEP_TIME.md
 * "The host's speed"). One benchmark is 0.4 s of a host whose speed moves
 * from step to step; their median over a set measured in one process is
 * the machine's. 0 where no line has one. */
static double session_probe(const char *path)
{
    vp_jlines l;
    vp_error e;
    double *v = NULL, med = 0.0;
    size_t n = 0, cap = 0;

    if (vp__jlines_open(&l, path, VP_VALIDATE_MAX_LINE, &e) != VP_OK)
        return 0.0;
    for (;;) {
        const char *text;
        size_t len;
        bool end;
        if (vp__jlines_next(&l, &text, &len, &end, &e) != VP_OK || end)
            break;
        double p = line_probe(text, len);
        if (p <= 0.0)
            continue;
        if (!vp__grow((void **)&v, &cap, n + 1, sizeof *v))
            break;
        v[n++] = p;
    }
    vp__jlines_close(&l);
    med = n > 0 ? vp__median_sort(v, n) : 0.0;
    free(v);
    return med;
}

vp_gt_file *vp_gt_open(const char *path, vp_error *err)
{
    vp_gt_file *f = calloc(1, sizeof *f);
    const char *text;
    size_t len;
    bool end;

    if (f == NULL) {
        vp_error_set(err, VP_ENOMEM, "out of memory");
        return NULL;
    }
    vp_status st = vp__jlines_open(&f->lines, path, VP_VALIDATE_MAX_LINE,
                                   err);
    if (st == VP_OK)
        st = vp__jlines_next(&f->lines, &text, &len, &end, err);
    if (st == VP_OK && !end) {
        f->pending = true;
        if (is_env_line(text, len)) {
            f->pending = false;
            f->has_env = true;
            st = vp_validate_env(text, len, path, f->lines.line, &f->env,
                                 err);
        }
    }
    if (st != VP_OK) {
        vp_gt_close(f);
        return NULL;
    }
    f->env.host_probe_us = session_probe(path);
    return f;
}

const vp_gt_env *vp_gt_file_env(const vp_gt_file *f)
{
    return f->has_env ? &f->env : NULL;
}

vp_status vp_gt_next(vp_gt_file *f, const char **json, size_t *len,
                     uint32_t *line, bool *end, vp_error *err)
{
    vp_status st = VP_OK;

    *end = false;
    if (f->pending) {
        f->pending = false;
        *json = f->lines.buf;
        *len = strlen(f->lines.buf);
    } else {
        st = vp__jlines_next(&f->lines, json, len, end, err);
    }
    *line = f->lines.line;
    return st;
}

void vp_gt_close(vp_gt_file *f)
{
    if (f == NULL)
        return;
    vp__jlines_close(&f->lines);
    free(f);
}
