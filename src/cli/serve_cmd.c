/* vramplan serve MODEL --gpu NAME: size a vLLM server (serve.h). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "vramplan/serve.h"

enum {
    O_GPU, O_FAMILY, O_GPU_DIR, O_UTIL, O_MAXLEN, O_SEQS, O_TOKENS, O_BLOCK,
    O_KVDT, O_DTYPE, O_TP, O_EAGER, O_NONTORCH, O_PROMPT, O_OUTPUT, O_CONC,
    O_HF, O_FORMAT
};

static const char *const FORMATS[] = {"table", "json", NULL};

#define STR(i, n, m, h)                                                     \
    {.id = i, .name = n, .metavar = m, .type = CLI_ARG_STRING, .help = h}
#define U64(i, n, lo, hi, h)                                                \
    {.id = i, .name = n, .metavar = "N", .type = CLI_ARG_U64, .min = lo,    \
     .max = hi, .help = h}

static const cli_opt OPTS[] = {
    STR(O_GPU, "gpu", "NAME", "GPU profile (gpus/NAME.yaml or a file)"),
    STR(O_FAMILY, "gpu-family", "NAME",
        "try every MIG slice of NAME, smallest first"),
    CLI_ROW_GPU_DIR(O_GPU_DIR),
    STR(O_UTIL, "gpu-memory-utilization", "F",
        "share of the device vLLM reserves (0.9)"),
    U64(O_MAXLEN, "max-model-len", 1, 1u << 24,
        "longest request (the model's)"),
    U64(O_SEQS, "max-num-seqs", 1, 1u << 20,
        "requests per step (vLLM's default)"),
    U64(O_TOKENS, "max-num-batched-tokens", 1, 1u << 24,
        "tokens per step (vLLM's default)"),
    U64(O_BLOCK, "block-size", 1, 128,
        "tokens per KV block: 1, 8, 16, 32, 64 or 128 (16)"),
    STR(O_KVDT, "kv-cache-dtype", "T", "auto or fp8 (fp8_e4m3, fp8_e5m2)"),
    STR(O_DTYPE, "dtype", "T", "auto, bfloat16, float16 or float32"),
    U64(O_TP, "tensor-parallel-size", 1, 1024,
        "ranks the model is split over"),
    {.id = O_EAGER, .name = "enforce-eager", .type = CLI_ARG_FLAG,
     .help = "no torch.compile, no CUDA graphs"},
    {.id = O_NONTORCH, .name = "non-torch", .metavar = "SIZE",
     .type = CLI_ARG_SIZE,
     .help = "memory outside PyTorch during start-up (measured profile: "
             "context - bare runtime; else 0)"},
    U64(O_PROMPT, "prompt", 1, 1u << 24, "prompt tokens of one request"),
    U64(O_OUTPUT, "output", 0, 1u << 24, "output tokens of one request"),
    U64(O_CONC, "concurrency", 1, 1u << 20,
        "with --gpu-family: requests that must run at once (1)"),
    STR(O_HF, "hf-config", "FILE",
        "KV layout (MLA, sliding windows) from this config.json (default: "
        "MODEL when it is one)"),
    {.id = O_FORMAT, .short_name = 'f', .name = "format", .metavar = "FMT",
     .type = CLI_ARG_ENUM, .choices = FORMATS, .what = "format",
     .help = "table or json"},
    CLI_HELP_ROW,
};

static void serve_help(FILE *f);

static const cli_spec SPEC = {OPTS, sizeof OPTS / sizeof OPTS[0], 0, 1,
                              "serve takes one MODEL", false, serve_help};

static void serve_help(FILE *f)
{
    fputs("Usage: vramplan serve MODEL --gpu NAME [OPTIONS]\n"
          "       vramplan serve MODEL --gpu-family NAME --concurrency N "
          "[OPTIONS]\n"
          "\n"
          "Size a vLLM server (V1 engine) the way vLLM does at start-up: it\n"
          "reserves --gpu-memory-utilization of the device, loads the "
          "weights,\n"
          "runs a dummy forward of max-num-batched-tokens tokens and a "
          "dummy\n"
          "sampling step, and gives the rest to the paged KV cache. Prints "
          "the\n"
          "weights, the profile run's activation peak, the KV blocks and "
          "tokens,\n"
          "the concurrency at a request length, and what CUDA graphs and "
          "the\n"
          "CUDA context need outside the reservation. Figures are per rank.\n"
          "With --gpu-family, the smallest MIG slice that runs --concurrency\n"
          "requests of --prompt + --output tokens (docs/SERVING.md). MODEL\n"
          "may be the name of a shipped model.\n"
          "\n"
          "Options:\n",
          f);
    cli_opts_help(f, &SPEC);
    fputs("\nExit status: 0 it serves, 1 it does not fit, 2 usage error, "
          "3 invalid model.\n",
          f);
}

typedef struct serve_args {
    cli_args args;
    const char *model, *gpu, *family, *hf;
    bool json;
    uint64_t prompt, output, concurrency;
    vp_serve_config cfg;
} serve_args;

static int parse_dtype(const char *v, const char *opt, uint32_t *out)
{
    static const struct {
        const char *name;
        uint32_t bytes;
    } t[] = {{"auto", 2}, {"bfloat16", 2}, {"bf16", 2}, {"float16", 2},
             {"half", 2}, {"fp16", 2},     {"float32", 4}, {"float", 4},
             {"fp8", 1},  {"fp8_e4m3", 1}, {"fp8_e5m2", 1}};
    bool kv = strcmp(opt, "kv-cache-dtype") == 0;

    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (strcmp(v, t[i].name) == 0 && (kv || t[i].bytes != 1) &&
            (!kv || i == 0 || t[i].bytes == 1)) {
            *out = kv && i == 0 ? 0 : t[i].bytes;
            return -1;
        }
    return cli_usage_error("invalid value '%s' for --%s", v, opt);
}

/* The options into the vLLM settings; -1, or CLI_USAGE after the error. */
static int serve_options(const cli_val *v, serve_args *a)
{
    vp_serve_config *c = &a->cfg;
    char *end;
    int rc;

    if (v[O_UTIL].given) {
        errno = 0;
        c->gpu_memory_utilization = strtod(v[O_UTIL].text, &end);
        if (errno || *end || !(c->gpu_memory_utilization > 0.0 &&
                               c->gpu_memory_utilization <= 1.0))
            return cli_usage_error("invalid fraction '%s' for "
                                   "--gpu-memory-utilization (0 to 1)",
                                   v[O_UTIL].text);
    }
    c->max_model_len = v[O_MAXLEN].given ? v[O_MAXLEN].u : c->max_model_len;
    c->max_num_seqs = v[O_SEQS].given ? v[O_SEQS].u : c->max_num_seqs;
    if (v[O_TOKENS].given)
        c->max_num_batched_tokens = v[O_TOKENS].u;
    if (v[O_BLOCK].given) {
        uint64_t u = v[O_BLOCK].u;
        if (u != 1 && (u < 8 || (u & (u - 1)) != 0))
            return cli_usage_error("invalid block size %s (1, 8, 16, 32, "
                                   "64 or 128)", v[O_BLOCK].text);
        c->block_size = (uint32_t)u;
    }
    if (v[O_KVDT].given && (rc = parse_dtype(v[O_KVDT].text,
                                             "kv-cache-dtype",
                                             &c->kv_dtype_bytes)) >= 0)
        return rc;
    if (v[O_DTYPE].given &&
        (rc = parse_dtype(v[O_DTYPE].text, "dtype", &c->dtype_bytes)) >= 0)
        return rc;
    if (v[O_TP].given)
        c->tensor_parallel = (uint32_t)v[O_TP].u;
    c->enforce_eager = v[O_EAGER].given;
    c->non_torch_given = v[O_NONTORCH].given;
    if (v[O_NONTORCH].given)
        c->non_torch_bytes = v[O_NONTORCH].u;
    return -1;
}

/* -1 to go on, else the exit status (CLI_OK after --help). */
static int serve_parse(int argc, char **argv, serve_args *a)
{
    const cli_val *v = a->args.v;
    int rc;

    memset(a, 0, sizeof *a);
    vp_serve_config_init(&a->cfg);
    if ((rc = cli_args_parse(&SPEC, argc, argv, &a->args)) >= 0 ||
        (rc = serve_options(v, a)) >= 0)
        return rc;
    if (v[O_GPU_DIR].given)
        cli_set_gpu_dir(v[O_GPU_DIR].text);
    a->model = a->args.n_operands ? a->args.operands[0] : NULL;
    a->gpu = v[O_GPU].given ? v[O_GPU].text : NULL;
    a->family = v[O_FAMILY].given ? v[O_FAMILY].text : NULL;
    a->hf = v[O_HF].given ? v[O_HF].text : NULL;
    a->json = v[O_FORMAT].given && v[O_FORMAT].choice == 1;
    a->prompt = v[O_PROMPT].given ? v[O_PROMPT].u : 0;
    a->output = v[O_OUTPUT].given ? v[O_OUTPUT].u : 0;
    a->concurrency = v[O_CONC].given ? v[O_CONC].u : 0;
    if (!a->model)
        return cli_usage_error("serve needs a MODEL");
    if (!a->gpu == !a->family)
        return cli_usage_error("serve needs one of --gpu and --gpu-family");
    if (a->concurrency && !a->family)
        return cli_usage_error("--concurrency goes with --gpu-family");
    if (a->output && !a->prompt)
        return cli_usage_error("--output needs --prompt");
    a->cfg.request_tokens = a->prompt + a->output;
    if (!a->concurrency)
        a->concurrency = 1;
    return -1;
}

static json_t *json_settings(const serve_args *a, const vp_serve_result *r)
{
    json_t *o = json_object();

    cli_jset(o, "gpu_memory_utilization",
             cli_jreal(a->cfg.gpu_memory_utilization, "%g"));
    cli_jset(o, "max_model_len", cli_ju64(r->max_model_len));
    cli_jset(o, "max_num_seqs", cli_ju64(r->max_num_seqs));
    cli_jset(o, "max_num_batched_tokens", cli_ju64(r->max_num_batched_tokens));
    cli_jset(o, "block_size", cli_ju64(r->block_size));
    cli_jset(o, "kv_dtype_bytes", cli_ju64(r->kv_dtype_bytes));
    cli_jset(o, "tensor_parallel_size", cli_ju64(r->tensor_parallel));
    cli_jset(o, "enforce_eager", json_boolean(a->cfg.enforce_eager));
    return o;
}

static int print_json(const serve_args *a, const char *gpu,
                      const vp_serve_result *r, vp_status st)
{
    const struct {
        const char *key;
        uint64_t v;
    } bytes[] = {
        {"total", r->total_bytes},       {"requested", r->requested_bytes},
        {"weights", r->weight_bytes},    {"forward_peak", r->forward_peak},
        {"sampler_peak", r->sampler_peak},
        {"activation_peak", r->activation_peak},
        {"non_torch", r->non_torch_bytes}, {"kv_available", r->kv_available},
        {"page_bytes", r->page_bytes},   {"layers", r->n_layers},
        {"groups", r->n_groups},         {"num_blocks", r->num_blocks},
        {"kv_tokens", r->kv_tokens},     {"kv_bytes", r->kv_bytes},
        {"kv_bytes_per_token", r->kv_bytes_per_token},
    };
    json_t *o = json_object();

    cli_jset(o, "model", cli_jstr(a->model, SIZE_MAX));
    cli_jset(o, "gpu", cli_jstr(gpu, SIZE_MAX));
    cli_jset(o, "fits", json_boolean(st == VP_OK));
    cli_jset(o, "settings", json_settings(a, r));
    for (size_t k = 0; k < sizeof bytes / sizeof bytes[0]; k++)
        cli_jset(o, bytes[k].key, cli_ju64(bytes[k].v));
    cli_jset(o, "max_concurrency", cli_jreal(r->max_concurrency, "%.2f"));
    cli_jset(o, "request_tokens", cli_ju64(r->request_tokens));
    cli_jset(o, "concurrency", cli_ju64(r->concurrency));
    cli_jset(o, "cudagraph_sizes", cli_ju64(r->cudagraph_sizes));
    cli_jset(o, "cudagraph_max_size", cli_ju64(r->cudagraph_max_size));
    cli_jset(o, "cudagraph_bytes", cli_ju64(r->cudagraph_bytes));
    cli_jset(o, "context", cli_ju64(r->context_bytes));
    cli_jset(o, "headroom", cli_ju64(r->headroom_bytes));
    cli_jset(o, "headroom_ok", json_boolean(r->headroom_ok));
    return cli_jprint(stdout, o, true);
}

static void row(const char *what, uint64_t bytes, const char *note)
{
    char b[32];
    printf("  %-18s %12s%s%s\n", what, vp_size_format(bytes, b, sizeof b),
           note[0] ? "  " : "", note);
}

static void print_table(const serve_args *a, const vp_gpu_profile *gpu,
                        const vp_serve_result *r, const vp_error *err)
{
    char n1[96], b1[32], b2[32];

    printf("model       %s\n", a->model);
    printf("gpu         %s (%s), total %s\n", vp_gpu_name(gpu),
           vp_gpu_product(gpu), vp_size_format(r->total_bytes, b1, sizeof b1));
    printf("vLLM        utilization %g, max_model_len %" PRIu64
           ", max_num_seqs %" PRIu64 ", max_num_batched_tokens %" PRIu64
           ",\n            block %" PRIu32 ", KV %" PRIu32 " B/element, TP %"
           PRIu32 ", %s\n",
           a->cfg.gpu_memory_utilization, r->max_model_len, r->max_num_seqs,
           r->max_num_batched_tokens, r->block_size, r->kv_dtype_bytes,
           r->tensor_parallel,
           a->cfg.enforce_eager ? "eager" : "compiled, CUDA graphs");
    printf("memory per GPU\n");
    snprintf(n1, sizeof n1, "total x %g", a->cfg.gpu_memory_utilization);
    row("requested", r->requested_bytes, n1);
    row("weights", r->weight_bytes, "");
    snprintf(n1, sizeof n1, "forward %s, sampler %s",
             vp_size_format(r->forward_peak, b1, sizeof b1),
             vp_size_format(r->sampler_peak, b2, sizeof b2));
    row("activation peak", r->activation_peak, n1);
    row("non-torch", r->non_torch_bytes,
        r->non_torch_estimated ? "not measured for this GPU (--non-torch)"
                               : "");
    row("KV cache", r->kv_available, "requested - the three above");
    if (err->code == VP_EOOM) {
        printf("does not serve: %s\n", err->msg);
        return;
    }
    if (r->page_bytes) {
        printf("KV cache\n");
        snprintf(n1, sizeof n1, "%" PRIu32 " tokens, one layer",
                 r->block_size);
        row("page", r->page_bytes, n1);
        printf("  %-18s %12" PRIu64 "  per layer, %" PRIu32 " layers in %"
               PRIu32 " group%s\n",
               "blocks", r->num_blocks, r->n_layers, r->n_groups,
               r->n_groups == 1 ? "" : "s");
        printf("  %-18s %12" PRIu64 "\n", "tokens", r->kv_tokens);
        row("per token", r->kv_bytes_per_token, "all layers");
        printf("  %-18s %11.2fx  at %" PRIu64 " tokens per request\n",
               "max concurrency", r->max_concurrency, r->max_model_len);
        printf("  %-18s %12" PRIu64 "  requests of %" PRIu64
               " tokens at once (max_num_seqs %" PRIu64 ")\n",
               "concurrency", r->concurrency, r->request_tokens,
               r->max_num_seqs);
    }
    printf("outside the reservation\n");
    row("headroom", r->headroom_bytes, "total - requested");
    row("CUDA context", r->context_bytes, "");
    if (r->cudagraph_sizes) {
        snprintf(n1, sizeof n1, "%" PRIu32 " sizes up to %" PRIu32
                 " tokens (forward working set)",
                 r->cudagraph_sizes, r->cudagraph_max_size);
        row("CUDA graphs", r->cudagraph_bytes, n1);
    }
    printf("  %-18s %12s\n", "context and graphs",
           r->headroom_ok ? "fit" : "do not fit");
}

static int serve_one(const serve_args *a, const vp_model *m,
                     const vp_kv_layout *kv, const char *gpu_name)
{
    vp_error err;
    vp_serve_result r;
    int rc = -1;
    vp_gpu_profile *gpu = cli_gpu_load(gpu_name, &rc);
    vp_status st;

    if (!gpu)
        return rc;
    st = vp_serve_plan(m, kv, gpu, &a->cfg, &r, &err);
    if (st != VP_OK && st != VP_EOOM) {
        vp_gpu_free(gpu);
        return cli_report(&err, NULL);
    }
    if (st == VP_OK)
        vp_error_clear(&err);
    rc = st == VP_OK ? CLI_OK : CLI_NOFIT;
    if (a->json) {
        int jrc = print_json(a, vp_gpu_name(gpu), &r, st);
        rc = jrc != CLI_OK ? jrc : rc;
    } else {
        print_table(a, gpu, &r, &err);
    }
    vp_gpu_free(gpu);
    return rc;
}

/* --gpu-family: serve on each slice, smallest first, until one runs
 * --concurrency requests at once. */
typedef struct fam_ctx {
    const serve_args *a;
    const vp_model *m;
    const vp_kv_layout *kv;
} fam_ctx;

static vp_status fam_fits(const vp_gpu_profile *gpu, void *ud, bool *fits,
                          char *note, size_t n, vp_error *err)
{
    const fam_ctx *c = ud;
    vp_serve_result r;
    vp_status st = vp_serve_plan(c->m, c->kv, gpu, &c->a->cfg, &r, err);

    if (st != VP_OK && st != VP_EOOM)
        return st;
    *fits = st == VP_OK && r.concurrency >= c->a->concurrency &&
            r.headroom_ok;
    snprintf(note, n, "%" PRIu64 " requests of %" PRIu64 " tokens, %" PRIu64
             " KV tokens",
             st == VP_OK ? r.concurrency : 0, r.request_tokens, r.kv_tokens);
    return VP_OK;
}

int cli_serve(int argc, char **argv)
{
    serve_args a;
    vp_error err;
    vp_kv_layout kv = {0};
    const char *hf = NULL;
    vp_model *m = NULL;
    int rc = serve_parse(argc, argv, &a);

    if (rc < 0 && (m = cli_model_load(a.model, &rc)) != NULL) {
        size_t len = strlen(a.model);
        hf = a.hf                                                   ? a.hf
             : len > 5 && strcmp(a.model + len - 5, ".json") == 0 ? a.model
                                                                   : NULL;
        if (hf && vp_kv_layout_from_hf(hf, &kv, &err) != VP_OK)
            rc = cli_report(&err, NULL);
    }
    if (rc < 0 && a.family) {
        fam_ctx c = {&a, m, hf ? &kv : NULL};
        rc = cli_mig_smallest(a.family, fam_fits, &c);
    } else if (rc < 0) {
        rc = serve_one(&a, m, hf ? &kv : NULL, a.gpu);
    }
    vp_kv_layout_destroy(&kv);
    vp_model_free(m);
    cli_args_free(&a.args);
    return rc;
}
