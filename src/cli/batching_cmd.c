/* vramplan batching MODEL --lengths FILE --gpu NAME: tokens per batch and
 * the batch of each length bucket, padded or packed (batching.h). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "vramplan/batching.h"
#include "vramplan/vramplan.h"

enum {
    B_LENGTHS = CLI_O__SETUP, B_GPU, B_GPU_DIR, B_INFER, B_BUCKETS, B_FORMAT
};

static const char *const FORMATS[] = {"table", "json", NULL};

static const cli_opt OPTS[] = {
    {.id = B_LENGTHS, .name = "lengths", .metavar = "FILE",
     .type = CLI_ARG_STRING,
     .help = "one length a line, or 'LENGTH COUNT' lines (a histogram)"},
    {.id = B_GPU, .name = "gpu", .metavar = "NAME", .type = CLI_ARG_STRING,
     .help = "GPU profile: budget and step times"},
    CLI_ROW_GPU_DIR(B_GPU_DIR),
    {.id = CLI_O_BUDGET, .name = "budget", .metavar = "SIZE|F",
     .type = CLI_ARG_STRING,
     .help = "bytes the allocator may reserve, or a share of the GPU "
             "(default: all but the CUDA context)"},
    {.id = B_INFER, .name = "inference", .type = CLI_ARG_FLAG,
     .help = "forward passes only, under no_grad"},
    CLI_ROW_PRECISION("fp32, amp-bf16, amp-fp16, bf16, fp16"),
    CLI_ROW_OPTIMIZER("adamw, adamw-fused, sgd, ..., none"),
    CLI_ROW_ATTENTION("padded batches: sdpa, flash, efficient, eager, math"),
    {.id = B_BUCKETS, .name = "buckets", .metavar = "N,N,...",
     .type = CLI_ARG_STRING,
     .help = "bucket bounds in tokens, ascending (powers of two)"},
    {.id = B_FORMAT, .short_name = 'f', .name = "format", .metavar = "FMT",
     .type = CLI_ARG_ENUM, .choices = FORMATS, .what = "format",
     .help = "table or json"},
    CLI_HELP_ROW,
};

/* The setup and --gpu, as the setup commands keep them (cli_setup_gpu),
 * and what batching adds. */
typedef struct batching_args {
    cli_setup_args s;
    const char *lengths, *buckets;
    bool json;
} batching_args;

static void batching_help(FILE *f);

static const cli_spec SPEC = {OPTS, sizeof OPTS / sizeof OPTS[0], 0, 1,
                              "batching takes one MODEL", false,
                              batching_help};

static void batching_help(FILE *f)
{
    fputs("Usage: vramplan batching MODEL --lengths FILE --gpu NAME "
          "[OPTIONS]\n\n"
          "Dynamic batching by length under a memory budget, for training "
          "or\n(--inference) inference. Padded: sequences are bucketed by "
          "length and\npadded to the bucket's longest; one tokens-per-batch "
          "budget T sets each\nbucket's batch, floor(T / padded length), "
          "and T is the largest for\nwhich every bucket fits (simulated). "
          "Packed: sequences are concatenated\nand attended one by one "
          "(flash-attention varlen, cu_seqlens): memory\nfollows the total "
          "tokens, attention work each sequence's length.\nReports each "
          "bucket's batch, the padding waste and the expected\nthroughput "
          "of both.\n\nOptions:\n",
          f);
    cli_opts_help(f, &SPEC);
    fputs("\nExit status: 0 done, 1 the longest sequence does not fit, 2 "
          "usage error,\n3 invalid model or lengths file.\n",
          f);
}

/* -1 to go on, else the exit status (CLI_OK after --help). */
static int batching_parse(int argc, char **argv, batching_args *a)
{
    const cli_val *v = a->s.args.v;
    vp_setup *s = &a->s.setup;
    int rc;

    memset(a, 0, sizeof *a);
    vp_setup_init(s);
    s->steps = VP_STEADY_STEPS;
    if ((rc = cli_args_parse(&SPEC, argc, argv, &a->s.args)) >= 0 ||
        (rc = cli_setup_common(v, false, s)) >= 0)
        return rc;
    if (v[B_INFER].given) {
        s->inference = true;
        if (!v[CLI_O_OPTIMIZER].given)
            s->optimizer = VP_OPT_NONE;
    }
    if (v[B_GPU_DIR].given)
        cli_set_gpu_dir(v[B_GPU_DIR].text);
    a->s.model_path = a->s.args.n_operands ? a->s.args.operands[0] : NULL;
    a->s.gpu = v[B_GPU].given ? v[B_GPU].text : NULL;
    a->lengths = v[B_LENGTHS].given ? v[B_LENGTHS].text : NULL;
    a->buckets = v[B_BUCKETS].given ? v[B_BUCKETS].text : NULL;
    a->json = v[B_FORMAT].given && v[B_FORMAT].choice == 1;
    if (!a->s.model_path || !a->lengths)
        return cli_usage_error("batching needs MODEL and --lengths FILE");
    if (!a->s.gpu)
        return cli_usage_error("batching needs --gpu NAME (budget and step "
                               "times)");
    if (v[CLI_O_BUDGET].given &&
        (rc = cli_setup_budget(&a->s, v[CLI_O_BUDGET].text)) >= 0)
        return rc;
    return -1;
}

/* --buckets 128,256,...: at most VP_BATCHING_MAX_BUCKETS bounds. */
static int parse_buckets(const char *text, uint64_t *out, size_t *n)
{
    char buf[32], *end = buf;

    *n = 0;
    while (text && *text) {
        const char *comma = strchr(text, ',');
        size_t len = comma ? (size_t)(comma - text) : strlen(text);
        if (len == 0 || len >= sizeof buf)
            return cli_usage_error("invalid --buckets '%s'", text);
        if (*n == VP_BATCHING_MAX_BUCKETS)
            return cli_usage_error("--buckets: at most %d bounds",
                                   VP_BATCHING_MAX_BUCKETS);
        memcpy(buf, text, len);
        buf[len] = '\0';
        errno = 0;
        out[*n] = buf[0] >= '0' && buf[0] <= '9' ? strtoull(buf, &end, 10)
                                                 : 0;
        if (out[*n] < 1 || out[*n] > VP_LENGTHS_MAX_LEN || errno || *end)
            return cli_usage_error("invalid value '%s' for --buckets: "
                                   "expected lengths from 1 to %u", buf,
                                   VP_LENGTHS_MAX_LEN);
        (*n)++;
        text = comma ? comma + 1 : NULL;
    }
    return -1;
}

static void print_table(const batching_args *a, const vp_lengths *l,
                        const vp_setup *s, const vp_batching_result *r)
{
    char b[32];

    printf("model        %s\n", a->s.model_path);
    printf("lengths      %s: %" PRIu64 " sequences, %" PRIu64
           " tokens, longest %" PRIu64 ", mean %.1f\n",
           a->lengths, l->sequences, l->tokens, l->max_len,
           (double)l->tokens / (double)l->sequences);
    printf("budget       %s on %s, %s, %s\n",
           vp_size_format(s->alloc.limit, b, sizeof b), a->s.gpu,
           s->inference ? "inference" : "training",
           vp_precision_name(s->precision));
    printf("padded       tokens per batch %" PRIu64 " (set by the bucket "
           "of %" PRIu64 "), padding %.1f %%\n",
           r->token_budget, r->bucket[r->limiting].padded_len,
           100.0 * r->padding_waste);
    printf("  %8s %8s %12s %12s %9s %7s %9s %10s\n", "bucket", "pad to",
           "sequences", "tokens", "max batch", "batch", "batches",
           "step ms");
    for (size_t k = 0; k < r->n_buckets; k++) {
        const vp_bucket *u = &r->bucket[k];
        printf("  %8" PRIu64 " %8" PRIu64 " %12" PRIu64 " %12" PRIu64
               " %9" PRIu64 " %7" PRIu64 " %9" PRIu64 " %10.2f\n",
               u->upper, u->padded_len, u->sequences, u->tokens,
               u->max_batch, u->batch, u->batches, 1e3 * u->step_s);
    }
    printf("  one pass %.3g s, %.0f tokens/s\n", r->padded_time_s,
           r->padded_tokens_per_s);
    printf("packed       tokens per batch %" PRIu64 " (varlen flash "
           "attention, cu_seqlens), %" PRIu64 " batches\n",
           r->packed_tokens, r->packed_batches);
    printf("  step %.2f ms, one pass %.3g s, %.0f tokens/s (%.2fx padded)\n",
           1e3 * r->packed_step_s, r->packed_time_s, r->packed_tokens_per_s,
           r->padded_tokens_per_s > 0.0
               ? r->packed_tokens_per_s / r->padded_tokens_per_s
               : 0.0);
    printf("simulations  %" PRIu32 "\n", r->simulations);
}

static json_t *json_bucket(const vp_bucket *u)
{
    json_t *o = json_object();

    cli_jset(o, "upper", cli_ju64(u->upper));
    cli_jset(o, "padded_len", cli_ju64(u->padded_len));
    cli_jset(o, "sequences", cli_ju64(u->sequences));
    cli_jset(o, "tokens", cli_ju64(u->tokens));
    cli_jset(o, "max_batch", cli_ju64(u->max_batch));
    cli_jset(o, "batch", cli_ju64(u->batch));
    cli_jset(o, "batches", cli_ju64(u->batches));
    cli_jset(o, "step_s", cli_jreal(u->step_s, "%.6g"));
    return o;
}

static int print_json(const batching_args *a, const vp_lengths *l,
                      const vp_setup *s, const vp_batching_result *r)
{
    json_t *o = json_object(), *pad = json_object(), *pack = json_object(),
           *buckets = json_array();

    cli_jset(o, "model", cli_jstr(a->s.model_path, SIZE_MAX));
    cli_jset(o, "lengths", cli_jstr(a->lengths, SIZE_MAX));
    cli_jset(o, "sequences", cli_ju64(l->sequences));
    cli_jset(o, "tokens", cli_ju64(l->tokens));
    cli_jset(o, "max_len", cli_ju64(l->max_len));
    cli_jset(o, "budget", cli_ju64(s->alloc.limit));
    cli_jset(o, "inference", json_boolean(s->inference));
    cli_jset(pad, "token_budget", cli_ju64(r->token_budget));
    cli_jset(pad, "padding_waste", cli_jreal(r->padding_waste, "%.6f"));
    cli_jset(pad, "time_s", cli_jreal(r->padded_time_s, "%.6g"));
    cli_jset(pad, "tokens_per_s", cli_jreal(r->padded_tokens_per_s, "%.6g"));
    for (size_t k = 0; k < r->n_buckets; k++)
        cli_jpush(buckets, json_bucket(&r->bucket[k]));
    cli_jset(pad, "buckets", buckets);
    cli_jset(o, "padded", pad);
    cli_jset(pack, "tokens_per_batch", cli_ju64(r->packed_tokens));
    cli_jset(pack, "batches", cli_ju64(r->packed_batches));
    cli_jset(pack, "step_s", cli_jreal(r->packed_step_s, "%.6g"));
    cli_jset(pack, "time_s", cli_jreal(r->packed_time_s, "%.6g"));
    cli_jset(pack, "tokens_per_s", cli_jreal(r->packed_tokens_per_s, "%.6g"));
    cli_jset(o, "packed", pack);
    cli_jset(o, "simulations", cli_ju64(r->simulations));
    return cli_jprint(stdout, o, true);
}

/* Plan the batches of the lengths in a->lengths; -1 with *r filled, or
 * the exit status. */
static int plan(batching_args *a, const vp_hw *hw, const uint64_t *bounds,
                size_t n_bounds, const vp_lengths *l, vp_batching_result *r)
{
    vp_error err;
    int rc = -1;
    vp_model *m = cli_model_load(a->s.model_path, &rc);

    if (m == NULL)
        return rc;
    vp_status st = vp_batching_plan(m, &a->s.setup, hw, l, bounds, n_bounds,
                                    r, &err);
    if (st == VP_EARG)
        rc = cli_usage_error("%s", err.msg);
    else if (st != VP_OK)
        rc = cli_report(&err, NULL);
    vp_model_free(m);
    return rc;
}

int cli_batching(int argc, char **argv)
{
    batching_args a;
    uint64_t bounds[VP_BATCHING_MAX_BUCKETS];
    size_t n_bounds = 0;
    vp_lengths l;
    vp_batching_result *r = NULL;
    vp_error err;
    bool have_hw, have_l = false;
    vp_hw hw;
    int rc = batching_parse(argc, argv, &a);

    if (rc < 0)
        rc = parse_buckets(a.buckets, bounds, &n_bounds);
    if (rc < 0)
        rc = cli_setup_gpu(&a.s, &hw, &have_hw);
    if (rc < 0 && vp_lengths_load(a.lengths, &l, &err) != VP_OK)
        rc = cli_report(&err, NULL);
    else if (rc < 0)
        have_l = true;
    if (rc < 0 && (r = malloc(sizeof *r)) == NULL)
        rc = cli_fail("out of memory");
    if (rc < 0 && (rc = plan(&a, &hw, bounds, n_bounds, &l, r)) < 0) {
        if (a.json)
            rc = print_json(&a, &l, &a.s.setup, r);
        else
            print_table(&a, &l, &a.s.setup, r);
        rc = rc < 0 ? CLI_OK : rc;
    }
    free(r);
    if (have_l)
        vp_lengths_destroy(&l);
    cli_args_free(&a.s.args);
    return rc;
}
