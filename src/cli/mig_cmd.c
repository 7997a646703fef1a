/* The smallest MIG slice that fits a job: `maxbatch` and `plan` with
 * --gpu-family FAMILY (search_cmd.c hands them here), and the report that
 * `serve --gpu-family` shares. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "vramplan/vramplan.h"

int cli_mig_smallest(const char *family, vp_mig_fit_fn fits, void *ud)
{
    vp_mig_result r;
    vp_error err;
    char b[32];

    if (vp_mig_smallest(family, fits, ud, &r, &err) != VP_OK)
        return cli_report(&err, NULL);
    printf("MIG slices of %s, smallest first\n", family);
    printf("  %-26s %10s %5s  %s\n", "slice", "memory", "SMs", "fits");
    for (size_t i = 0; i < r.n; i++)
        printf("  %-26s %10s %5" PRIu32 "  %-4s  %s\n", r.trial[i].name,
               vp_size_format(r.trial[i].memory_bytes, b, sizeof b),
               r.trial[i].sm_count, r.trial[i].fits ? "yes" : "no",
               r.trial[i].note);
    if (r.smallest < 0) {
        printf("no slice of %s fits, not even the whole GPU's\n", family);
        return CLI_NOFIT;
    }
    printf("smallest slice that fits: %s (MIG %s)\n",
           r.trial[r.smallest].name, r.trial[r.smallest].profile);
    return CLI_OK;
}

/* ------------------------------------------------------------------ */
/* The training setup these commands take                               */
/* ------------------------------------------------------------------ */

enum {
    M_FAMILY = CLI_O__SETUP, M_BATCH, M_INFER, M_BUDGET, M_GLOBAL
};

static const cli_opt OPTS[] = {
    {.id = M_FAMILY, .name = "gpu-family", .metavar = "NAME",
     .type = CLI_ARG_STRING,
     .help = "a100-40g, a100-80g, h100-80g or h200: try its MIG slices"},
    {.id = M_BATCH, .name = "batch", .metavar = "N", .type = CLI_ARG_U64,
     .min = 1, .max = 1u << 24,
     .help = "maxbatch: the micro-batch the job needs (1)"},
    CLI_ROW_SEQ,
    CLI_ROW_PRECISION("fp32, amp-bf16, amp-fp16, bf16, fp16"),
    CLI_ROW_OPTIMIZER("adamw, adamw-fused, sgd, ..., none"),
    CLI_ROW_CHECKPOINT("none, all or segment names"),
    {.id = M_INFER, .name = "inference", .type = CLI_ARG_FLAG,
     .help = "forward passes only, under no_grad"},
    CLI_ROW_ATTENTION("sdpa, flash, efficient, eager, math"),
    {.id = M_BUDGET, .name = "budget", .metavar = "F",
     .type = CLI_ARG_STRING,
     .help = "share of each slice's memory (default: all of it but the "
             "CUDA context)"},
    {.id = M_GLOBAL, .name = "global-batch", .metavar = "N",
     .type = CLI_ARG_U64, .min = 1, .max = 1u << 24,
     .help = "plan: samples per optimizer step (32)"},
    CLI_HELP_ROW,
};

typedef struct mig_args {
    cli_args args;
    const char *cmd, *model, *family, *ckpt;
    uint64_t batch, global_batch;
    double budget;
    bool prec_set, opt_set;
    vp_setup setup;
    vp_model *m;
} mig_args;

static void mig_help_for(FILE *f, const char *cmd)
{
    cli_spec spec = {OPTS, sizeof OPTS / sizeof OPTS[0], 0, 1, NULL, false,
                     NULL};

    fprintf(f, "Usage: vramplan %s MODEL --gpu-family NAME [OPTIONS]\n\n"
            "The smallest MIG slice of NAME that fits the job: the slices "
            "are tried\nfrom the least memory up (gpus/NAME-mig-*.yaml) "
            "and the first that fits\nis reported. %s\n\nOptions:\n",
            cmd,
            strcmp(cmd, "plan") == 0
                ? "plan: a setup reaching --global-batch must fit."
                : "maxbatch: the largest micro-batch must reach --batch.");
    cli_opts_help(f, &spec);
    fputs("\nExit status: 0 a slice fits, 1 none fits, 2 usage error, "
          "3 invalid model.\n", f);
}

static void maxbatch_help(FILE *f) { mig_help_for(f, "maxbatch"); }
static void plan_help(FILE *f) { mig_help_for(f, "plan"); }

/* The options after the table's checks; -1, or CLI_USAGE after the
 * error. */
static int mig_options(const cli_val *v, mig_args *a)
{
    char *end;
    int rc = cli_setup_common(v, false, &a->setup);

    if (rc >= 0)
        return rc;
    if (v[M_INFER].given) {
        a->setup.inference = true;
        if (!v[CLI_O_OPTIMIZER].given)
            a->setup.optimizer = VP_OPT_NONE;
    }
    if (v[M_BUDGET].given) {
        a->budget = strtod(v[M_BUDGET].text, &end);
        if (*end || !(a->budget > 0.0 && a->budget <= 1.0))
            return cli_usage_error("invalid fraction '%s' for --budget (0 "
                                   "to 1)", v[M_BUDGET].text);
    }
    a->family = v[M_FAMILY].given ? v[M_FAMILY].text : NULL;
    a->ckpt = v[CLI_O_CHECKPOINT].given ? v[CLI_O_CHECKPOINT].text : NULL;
    a->batch = v[M_BATCH].given ? v[M_BATCH].u : 0;
    a->global_batch = v[M_GLOBAL].given ? v[M_GLOBAL].u : 0;
    a->prec_set = v[CLI_O_PRECISION].given;
    a->opt_set = v[CLI_O_OPTIMIZER].given;
    return -1;
}

/* -1 to go on, else the exit status (CLI_OK after --help). */
static int mig_parse(int argc, char **argv, mig_args *a)
{
    bool plan = strcmp(argv[0], "plan") == 0;
    cli_spec spec = {OPTS, sizeof OPTS / sizeof OPTS[0], 0, 1,
                     "one MODEL only", false,
                     plan ? plan_help : maxbatch_help};
    int rc;

    memset(a, 0, sizeof *a);
    a->cmd = argv[0];
    vp_setup_init(&a->setup);
    if ((rc = cli_args_parse(&spec, argc, argv, &a->args)) >= 0 ||
        (rc = mig_options(a->args.v, a)) >= 0)
        return rc;
    a->model = a->args.n_operands ? a->args.operands[0] : NULL;
    if (!a->model || !a->family)
        return cli_usage_error("%s needs MODEL and --gpu-family", a->cmd);
    if (plan ? a->batch != 0 : a->global_batch != 0)
        return cli_usage_error("%s does not take --%s", a->cmd,
                               plan ? "batch" : "global-batch");
    if (!a->batch)
        a->batch = 1;
    if (!a->global_batch)
        a->global_batch = 32;
    a->setup.steps = VP_STEADY_STEPS;
    return -1;
}

/* The slice's constants and budget in the setup, as --gpu does. */
static void apply_slice(const mig_args *a, const vp_gpu_profile *gpu,
                        vp_setup *s)
{
    uint64_t total = vp_gpu_usable_bytes(gpu);

    *s = a->setup;
    vp_gpu_apply(gpu, s);
    s->alloc.limit = a->budget > 0.0 ? (uint64_t)(a->budget * (double)total)
                     : total > s->context_bytes ? total - s->context_bytes
                                                : 0;
}

static vp_status maxbatch_fits(const vp_gpu_profile *gpu, void *ud,
                               bool *fits, char *note, size_t n,
                               vp_error *err)
{
    const mig_args *a = ud;
    vp_maxbatch_result r;
    vp_setup s;
    vp_status st;

    apply_slice(a, gpu, &s);
    st = vp_maxbatch(a->m, &s, a->ckpt, 0, &r, err);
    if (st != VP_OK)
        return st;
    *fits = r.max_batch >= a->batch;
    snprintf(note, n, "max batch %" PRIu64 " (needs %" PRIu64 ")",
             r.max_batch, a->batch);
    return VP_OK;
}

static vp_status plan_fits(const vp_gpu_profile *gpu, void *ud, bool *fits,
                           char *note, size_t n, vp_error *err)
{
    const mig_args *a = ud;
    vp_plan_request req;
    vp_plan_result *res = malloc(sizeof *res);
    vp_status st;

    if (!res)
        return vp_error_set(err, VP_ENOMEM, "out of memory");
    memset(&req, 0, sizeof req);
    apply_slice(a, gpu, &req.base);
    vp_gpu_hw(gpu, VP_GPU_BF16, &req.hw);
    vp_hw_fill_defaults(&req.hw);
    req.global_batch = a->global_batch;
    if (a->prec_set)
        req.precisions[a->setup.precision] = true;
    if (a->opt_set)
        req.optimizers[a->setup.optimizer] = true;
    st = vp_plan_single(a->m, &req, res, err);
    if (st == VP_OK) {
        const vp_plan_candidate *c = &res->cand[0];
        *fits = res->n > 0 && c->fits;
        if (*fits)
            snprintf(note, n, "%s, micro-batch %" PRIu64 " x %" PRIu32
                     ", %.1f samples/s",
                     vp_precision_name(c->precision), c->micro_batch,
                     c->accum, c->samples_per_s);
        else
            snprintf(note, n, "no setup fits");
    }
    free(res);
    return st;
}

static int mig_run(int argc, char **argv, vp_mig_fit_fn fn)
{
    mig_args a;
    int rc = mig_parse(argc, argv, &a);

    if (rc < 0 && a.ckpt && strcmp(a.ckpt, "auto") == 0)
        rc = cli_usage_error("--gpu-family takes a fixed --checkpoint");
    if (rc < 0 && (a.m = cli_model_load(a.model, &rc)) != NULL)
        rc = cli_mig_smallest(a.family, fn, &a);
    vp_model_free(a.m);
    cli_args_free(&a.args);
    return rc;
}

int cli_mig_maxbatch(int argc, char **argv)
{
    return mig_run(argc, argv, maxbatch_fits);
}

int cli_mig_plan(int argc, char **argv)
{
    return mig_run(argc, argv, plan_fits);
}
