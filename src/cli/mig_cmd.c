/* The smallest MIG slice that fits a job: `maxbatch` and `plan` with
 * --gpu-family FAMILY (main.c hands them here), and the report that
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
        return cli_lib_error(&err);
    printf("MIG slices of %s, smallest first\n", family);
    printf("  %-26s %10s %5s  %s\n", "slice", "memory", "SMs", "fits");
    for (size_t i = 0; i < r.n; i++)
        printf("  %-26s %10s %5" PRIu32 "  %-4s  %s\n", r.trial[i].name,
               vp_size_format(r.trial[i].memory_bytes, b, sizeof b),
               r.trial[i].sm_count, r.trial[i].fits ? "yes" : "no",
               r.trial[i].note);
    if (r.smallest < 0) {
        printf("no slice of %s fits, not even the whole GPU's\n", family);
        return 1;
    }
    printf("smallest slice that fits: %s (MIG %s)\n",
           r.trial[r.smallest].name, r.trial[r.smallest].profile);
    return 0;
}

/* ------------------------------------------------------------------ */
/* The training setup these commands take                               */
/* ------------------------------------------------------------------ */

enum {
    M_FAMILY, M_BATCH, M_SEQ, M_PREC, M_OPT, M_CKPT, M_INFER, M_ATTN,
    M_BUDGET, M_GLOBAL, M_HELP
};

static const cli_opt mig_opts[] = {
    [M_FAMILY] = {"gpu-family", "NAME",
                  "a100-40g, a100-80g, h100-80g or h200: try its MIG slices"},
    [M_BATCH] = {"batch", "N", "maxbatch: the micro-batch the job needs (1)"},
    [M_SEQ] = {"seq", "N", "sequence length (the model's)"},
    [M_PREC] = {"precision", "P", "fp32, amp-bf16, amp-fp16, bf16, fp16"},
    [M_OPT] = {"optimizer", "O", "adamw, adamw-fused, sgd, ..., none"},
    [M_CKPT] = {"checkpoint", "SPEC", "none, all or segment names"},
    [M_INFER] = {"inference", NULL, "forward passes only, under no_grad"},
    [M_ATTN] = {"attention", "IMPL", "sdpa, flash, efficient, eager, math"},
    [M_BUDGET] = {"budget", "F", "share of each slice's memory (default: "
                                 "all of it but the CUDA context)"},
    [M_GLOBAL] = {"global-batch", "N", "plan: samples per optimizer step "
                                       "(32)"},
    [M_HELP] = {"help", NULL, "this help"},
};
#define N_MIG_OPTS (sizeof mig_opts / sizeof mig_opts[0])

typedef struct mig_args {
    const char *cmd, *model, *family, *ckpt;
    uint64_t batch, global_batch;
    double budget;
    bool prec_set, opt_set;
    vp_setup setup;
    vp_model *m;
} mig_args;

static void mig_help(const char *cmd)
{
    printf("Usage: vramplan %s MODEL --gpu-family NAME [OPTIONS]\n\n"
           "The smallest MIG slice of NAME that fits the job: the slices "
           "are tried\nfrom the least memory up (gpus/NAME-mig-*.yaml) "
           "and the first that fits\nis reported. %s\n\nOptions:\n",
           cmd,
           strcmp(cmd, "plan") == 0
               ? "plan: a setup reaching --global-batch must fit."
               : "maxbatch: the largest micro-batch must reach --batch.");
    cli_opts_help(stdout, mig_opts, N_MIG_OPTS);
    printf("\nExit status: 0 a slice fits, 1 none fits, 2 usage error, "
           "3 invalid model.\n");
}

int cli_setup_option(vp_setup *s, const char *opt, const char *v)
{
    if (strcmp(opt, "inference") == 0) {
        s->inference = true;
        s->optimizer = VP_OPT_NONE;
        return 0;
    }
    if (strcmp(opt, "precision") == 0)
        return vp_precision_parse(v, &s->precision) == VP_OK
                   ? 0
                   : cli_usage_error("invalid precision '%s'", v);
    if (strcmp(opt, "optimizer") == 0)
        return vp_optimizer_parse(v, &s->optimizer) == VP_OK
                   ? 0
                   : cli_usage_error("invalid optimizer '%s'", v);
    if (strcmp(opt, "attention") == 0) {
        s->attn_set = true;
        return vp_attn_impl_parse(v, &s->attn) == VP_OK
                   ? 0
                   : cli_usage_error("invalid attention '%s'", v);
    }
    if (strcmp(opt, "seq") == 0)
        return cli_u64("seq", v, 1, 1u << 24, &s->seq) ? 0 : 2;
    return cli_usage_error("option --%s is not a setup option", opt);
}

static int mig_option(void *ud, int id, const char *v)
{
    mig_args *a = ud;
    char *end;

    switch (id) {
    case M_FAMILY: a->family = v; return 0;
    case M_CKPT: a->ckpt = v; return 0;
    case M_BATCH: return cli_u64("batch", v, 1, 1u << 24, &a->batch) ? 0 : 2;
    case M_GLOBAL: return cli_u64("global-batch", v, 1, 1u << 24,
                                  &a->global_batch) ? 0 : 2;
    case M_PREC: a->prec_set = true; break;
    case M_OPT: a->opt_set = true; break;
    case M_BUDGET:
        a->budget = strtod(v, &end);
        if (*end || !(a->budget > 0.0 && a->budget <= 1.0))
            return cli_usage_error("invalid fraction '%s' for --budget (0 "
                                   "to 1)", v);
        return 0;
    }
    return cli_setup_option(&a->setup, mig_opts[id].name, v);
}

/* 0 parsed, -1 help printed, else an exit code. */
static int mig_parse(int argc, char **argv, mig_args *a)
{
    int rc;

    memset(a, 0, sizeof *a);
    a->cmd = argv[0];
    vp_setup_init(&a->setup);
    rc = cli_parse(argc, argv, mig_opts, N_MIG_OPTS, mig_option, a,
                   &a->model);
    if (rc < 0)
        mig_help(a->cmd);
    if (rc)
        return rc;
    if (!a->model || !a->family)
        return cli_usage_error("%s needs MODEL and --gpu-family", a->cmd);
    if (strcmp(a->cmd, "plan") == 0 ? a->batch != 0 : a->global_batch != 0)
        return cli_usage_error("%s does not take --%s", a->cmd,
                               strcmp(a->cmd, "plan") == 0 ? "batch"
                                                          : "global-batch");
    if (!a->batch)
        a->batch = 1;
    if (!a->global_batch)
        a->global_batch = 32;
    a->setup.steps = 2; /* two steps reach the steady state */
    return 0;
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
    vp_error err;
    int rc = mig_parse(argc, argv, &a);

    if (rc)
        return rc < 0 ? 0 : rc;
    a.m = vp_model_load(a.model, &err);
    if (!a.m)
        return cli_lib_error(&err);
    if (a.ckpt && strcmp(a.ckpt, "auto") == 0) {
        vp_model_free(a.m);
        return cli_usage_error("--gpu-family takes a fixed --checkpoint");
    }
    rc = cli_mig_smallest(a.family, fn, &a);
    vp_model_free(a.m);
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
