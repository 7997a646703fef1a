/* vramplan batching MODEL --lengths FILE --gpu NAME: tokens per batch and
 * the batch of each length bucket, padded or packed (batching.h). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "vramplan/batching.h"
#include "vramplan/vramplan.h"

enum {
    B_LENGTHS, B_GPU, B_BUDGET, B_INFER, B_PREC, B_OPT, B_ATTN, B_BUCKETS,
    B_FORMAT, B_HELP
};

static const cli_opt batching_opts[] = {
    [B_LENGTHS] = {"lengths", "FILE", "one length a line, or 'LENGTH COUNT' "
                                      "lines (a histogram)"},
    [B_GPU] = {"gpu", "NAME", "GPU profile: budget and step times"},
    [B_BUDGET] = {"budget", "SIZE|F", "bytes the allocator may reserve, or "
                                      "a share of the GPU (default: all "
                                      "but the CUDA context)"},
    [B_INFER] = {"inference", NULL, "forward passes only, under no_grad"},
    [B_PREC] = {"precision", "P", "fp32, amp-bf16, amp-fp16, bf16, fp16"},
    [B_OPT] = {"optimizer", "O", "adamw, adamw-fused, sgd, ..., none"},
    [B_ATTN] = {"attention", "IMPL", "padded batches: sdpa, flash, "
                                     "efficient, eager, math"},
    [B_BUCKETS] = {"buckets", "N,N,...", "bucket bounds in tokens, "
                                         "ascending (powers of two)"},
    [B_FORMAT] = {"format", "FMT", "table or json"},
    [B_HELP] = {"help", NULL, "this help"},
};
#define N_BATCHING_OPTS (sizeof batching_opts / sizeof batching_opts[0])

typedef struct batching_args {
    const char *model, *lengths, *gpu, *budget, *buckets, *format;
    vp_setup setup;
} batching_args;

static void batching_help(void)
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
          stdout);
    cli_opts_help(stdout, batching_opts, N_BATCHING_OPTS);
    fputs("\nExit status: 0 done, 1 the longest sequence does not fit, 2 "
          "usage error,\n3 invalid model or lengths file.\n",
          stdout);
}

static int batching_option(void *ud, int id, const char *v)
{
    batching_args *a = ud;

    switch (id) {
    case B_LENGTHS: a->lengths = v; return 0;
    case B_GPU: a->gpu = v; return 0;
    case B_BUDGET: a->budget = v; return 0;
    case B_BUCKETS: a->buckets = v; return 0;
    case B_FORMAT: a->format = v; return 0;
    }
    return cli_setup_option(&a->setup, batching_opts[id].name, v);
}

static int batching_parse(int argc, char **argv, batching_args *a)
{
    int rc;

    memset(a, 0, sizeof *a);
    vp_setup_init(&a->setup);
    a->setup.steps = 2;
    a->format = "table";
    rc = cli_parse(argc, argv, batching_opts, N_BATCHING_OPTS,
                   batching_option, a, &a->model);
    if (rc < 0)
        batching_help();
    if (rc)
        return rc;
    if (!a->model || !a->lengths)
        return cli_usage_error("batching needs MODEL and --lengths FILE");
    if (!a->gpu)
        return cli_usage_error("batching needs --gpu NAME (budget and step "
                               "times)");
    if (strcmp(a->format, "table") && strcmp(a->format, "json"))
        return cli_usage_error("invalid format '%s' (table or json)",
                               a->format);
    return 0;
}

/* --buckets 128,256,...: at most VP_BATCHING_MAX_BUCKETS bounds. */
static int parse_buckets(const char *text, uint64_t *out, size_t *n)
{
    char buf[32];

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
        if (!cli_u64("buckets", buf, 1, VP_LENGTHS_MAX_LEN, &out[(*n)++]))
            return 2;
        text = comma ? comma + 1 : NULL;
    }
    return 0;
}

/* --budget SIZE, or a share of the GPU; default all but the context. */
static int apply_budget(const batching_args *a, const vp_hw *hw,
                        vp_setup *s)
{
    vp_error err;
    char *end;

    s->context_bytes = hw->context;
    s->alloc.device_total = hw->memory;
    s->alloc.limit = hw->memory > hw->context ? hw->memory - hw->context : 0;
    if (!a->budget)
        return 0;
    double f = strtod(a->budget, &end);
    if (*end == '\0' && f > 0.0 && f <= 1.0) {
        s->alloc.limit = (uint64_t)(f * (double)hw->memory);
        return 0;
    }
    if (vp_size_parse(a->budget, &s->alloc.limit, &err) != VP_OK ||
        s->alloc.limit == 0)
        return cli_usage_error("invalid --budget '%s' (a size such as 70GiB "
                               "or a share such as 0.9)",
                               a->budget);
    return 0;
}

static void print_table(const batching_args *a, const vp_lengths *l,
                        const vp_setup *s, const vp_batching_result *r)
{
    char b[32];

    printf("model        %s\n", a->model);
    printf("lengths      %s: %" PRIu64 " sequences, %" PRIu64
           " tokens, longest %" PRIu64 ", mean %.1f\n",
           a->lengths, l->sequences, l->tokens, l->max_len,
           (double)l->tokens / (double)l->sequences);
    printf("budget       %s on %s, %s, %s\n",
           vp_size_format(s->alloc.limit, b, sizeof b), a->gpu,
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

static void print_json(const batching_args *a, const vp_lengths *l,
                       const vp_setup *s, const vp_batching_result *r)
{
    printf("{\"model\": \"%s\", \"lengths\": \"%s\", \"sequences\": %" PRIu64
           ", \"tokens\": %" PRIu64 ", \"max_len\": %" PRIu64
           ", \"budget\": %" PRIu64 ", \"inference\": %s,\n",
           a->model, a->lengths, l->sequences, l->tokens, l->max_len,
           s->alloc.limit, s->inference ? "true" : "false");
    printf(" \"padded\": {\"token_budget\": %" PRIu64
           ", \"padding_waste\": %.6f, \"time_s\": %.6g, \"tokens_per_s\": "
           "%.6g, \"buckets\": [",
           r->token_budget, r->padding_waste, r->padded_time_s,
           r->padded_tokens_per_s);
    for (size_t k = 0; k < r->n_buckets; k++) {
        const vp_bucket *u = &r->bucket[k];
        printf("%s\n  {\"upper\": %" PRIu64 ", \"padded_len\": %" PRIu64
               ", \"sequences\": %" PRIu64 ", \"tokens\": %" PRIu64
               ", \"max_batch\": %" PRIu64 ", \"batch\": %" PRIu64
               ", \"batches\": %" PRIu64 ", \"step_s\": %.6g}",
               k ? "," : "", u->upper, u->padded_len, u->sequences,
               u->tokens, u->max_batch, u->batch, u->batches, u->step_s);
    }
    printf("]},\n \"packed\": {\"tokens_per_batch\": %" PRIu64
           ", \"batches\": %" PRIu64 ", \"step_s\": %.6g, \"time_s\": %.6g"
           ", \"tokens_per_s\": %.6g},\n \"simulations\": %" PRIu32 "}\n",
           r->packed_tokens, r->packed_batches, r->packed_step_s,
           r->packed_time_s, r->packed_tokens_per_s, r->simulations);
}

int cli_batching(int argc, char **argv)
{
    batching_args a;
    uint64_t bounds[VP_BATCHING_MAX_BUCKETS];
    size_t n_bounds = 0;
    vp_lengths l;
    vp_batching_result *r;
    vp_error err;
    vp_model *m;
    vp_hw hw;
    vp_status st;
    int rc = batching_parse(argc, argv, &a);

    if (rc)
        return rc < 0 ? 0 : rc;
    if ((rc = parse_buckets(a.buckets, bounds, &n_bounds)) != 0)
        return rc;
    if (cli_gpu_hw(a.gpu, &hw) != 0)
        return 2;
    if ((rc = apply_budget(&a, &hw, &a.setup)) != 0)
        return rc;
    if (vp_lengths_load(a.lengths, &l, &err) != VP_OK)
        return cli_lib_error(&err);
    m = vp_model_load(a.model, &err);
    r = malloc(sizeof *r);
    if (!m || !r) {
        rc = m ? (fputs("vramplan: error: out of memory\n", stderr), 2)
               : cli_lib_error(&err);
        goto done;
    }
    st = vp_batching_plan(m, &a.setup, &hw, &l, bounds, n_bounds, r, &err);
    if (st != VP_OK) {
        rc = st == VP_EARG ? cli_usage_error("%s", err.msg)
                           : cli_lib_error(&err);
        goto done;
    }
    if (strcmp(a.format, "json") == 0)
        print_json(&a, &l, &a.setup, r);
    else
        print_table(&a, &l, &a.setup, r);
done:
    free(r);
    vp_model_free(m);
    vp_lengths_destroy(&l);
    return rc;
}
