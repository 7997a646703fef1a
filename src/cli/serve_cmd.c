/* vramplan serve MODEL --gpu NAME: size a vLLM server (serve.h), and the
 * small option scanner and error printer that the serve, batching and mig
 * command files share (cli.h). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "vramplan/serve.h"

/* ------------------------------------------------------------------ */
/* Shared: options, numbers, errors                                    */
/* ------------------------------------------------------------------ */

enum { SCAN_END, SCAN_OPTION, SCAN_OPERAND, SCAN_ERROR };

typedef struct scan_state {
    int argc;
    char **argv;
    int i; /* next argument */
} scan_state;

/* The next option (--name VALUE or --name=VALUE) or operand; a usage error
 * is printed before SCAN_ERROR. */
static int scan(scan_state *s, const cli_opt *opts, size_t n,
                const cli_opt **opt, const char **val)
{
    const char *a, *eq;
    size_t len;

    *opt = NULL;
    *val = NULL;
    if (s->i >= s->argc)
        return SCAN_END;
    a = s->argv[s->i++];
    if (strncmp(a, "--", 2) != 0 || a[2] == '\0') {
        *val = a;
        return SCAN_OPERAND;
    }
    eq = strchr(a, '=');
    len = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
    for (size_t k = 0; k < n; k++) {
        if (strlen(opts[k].name) != len || strncmp(opts[k].name, a + 2, len))
            continue;
        *opt = &opts[k];
        if (!opts[k].arg) {
            if (eq)
                return cli_usage_error("option --%s takes no value",
                                       opts[k].name),
                       SCAN_ERROR;
            return SCAN_OPTION;
        }
        if (eq) {
            *val = eq + 1;
        } else if (s->i < s->argc) {
            *val = s->argv[s->i++];
        } else {
            cli_usage_error("option --%s needs a value (%s)", opts[k].name,
                            opts[k].arg);
            return SCAN_ERROR;
        }
        return SCAN_OPTION;
    }
    cli_usage_error("unknown option '%.*s'", (int)(len + 2), a);
    return SCAN_ERROR;
}

int cli_parse(int argc, char **argv, const cli_opt *opts, size_t n,
              cli_opt_fn fn, void *ud, const char **operand)
{
    scan_state s = {argc, argv, 1};
    const cli_opt *o;
    const char *v;
    int r, rc;

    *operand = NULL;
    while ((r = scan(&s, opts, n, &o, &v)) != SCAN_END) {
        if (r == SCAN_ERROR)
            return 2;
        if (r == SCAN_OPERAND) {
            if (*operand)
                return cli_usage_error("unexpected argument '%s'", v);
            *operand = v;
        } else if (strcmp(o->name, "help") == 0) {
            return -1;
        } else if ((rc = fn(ud, (int)(o - opts), v)) != 0) {
            return rc;
        }
    }
    return 0;
}

void cli_opts_help(FILE *f, const cli_opt *opts, size_t n)
{
    for (size_t k = 0; k < n; k++) {
        char head[64];
        snprintf(head, sizeof head, "--%s%s%s", opts[k].name,
                 opts[k].arg ? " " : "", opts[k].arg ? opts[k].arg : "");
        fprintf(f, "  %-28s %s\n", head, opts[k].help);
    }
}

bool cli_u64(const char *opt, const char *text, uint64_t min, uint64_t max,
             uint64_t *out)
{
    char *end;

    errno = 0;
    if (text[0] < '0' || text[0] > '9') {
        cli_usage_error("invalid number '%s' for --%s", text, opt);
        return false;
    }
    unsigned long long v = strtoull(text, &end, 10);
    if (errno || *end || v < min || v > max) {
        cli_usage_error("invalid value '%s' for --%s (%" PRIu64 " to %" PRIu64
                        ")",
                        text, opt, min, max);
        return false;
    }
    *out = v;
    return true;
}

int cli_lib_error(const vp_error *err)
{
    const char *msg = err->msg[0] ? err->msg : vp_strerror(err->code);

    if (err->path[0] && err->line && err->col)
        fprintf(stderr, "%s:%" PRIu32 ":%" PRIu32 ": error: %s\n", err->path,
                err->line, err->col, msg);
    else if (err->path[0] && err->line)
        fprintf(stderr, "%s:%" PRIu32 ": error: %s\n", err->path, err->line,
                msg);
    else if (err->path[0])
        fprintf(stderr, "%s: error: %s\n", err->path, msg);
    else
        fprintf(stderr, "vramplan: error: %s\n", msg);
    switch (err->code) {
    case VP_EOOM:
        return 1;
    case VP_ESYNTAX:
    case VP_ESCHEMA:
    case VP_ERANGE:
    case VP_EUNSUPPORTED:
    case VP_ELIMIT:
    case VP_EOVERFLOW:
    case VP_EUNIT:
        return 3;
    default:
        return 2;
    }
}

/* ------------------------------------------------------------------ */
/* serve                                                               */
/* ------------------------------------------------------------------ */

enum {
    O_GPU, O_FAMILY, O_UTIL, O_MAXLEN, O_SEQS, O_TOKENS, O_BLOCK, O_KVDT,
    O_DTYPE, O_TP, O_EAGER, O_NONTORCH, O_PROMPT, O_OUTPUT, O_CONC, O_HF,
    O_FORMAT, O_HELP
};

static const cli_opt serve_opts[] = {
    [O_GPU] = {"gpu", "NAME", "GPU profile (gpus/NAME.yaml or a file)"},
    [O_FAMILY] = {"gpu-family", "NAME",
                  "try every MIG slice of NAME, smallest first"},
    [O_UTIL] = {"gpu-memory-utilization", "F",
                "share of the device vLLM reserves (0.9)"},
    [O_MAXLEN] = {"max-model-len", "N", "longest request (the model's)"},
    [O_SEQS] = {"max-num-seqs", "N", "requests per step (vLLM's default)"},
    [O_TOKENS] = {"max-num-batched-tokens", "N",
                  "tokens per step (vLLM's default)"},
    [O_BLOCK] = {"block-size", "N", "tokens per KV block: 1, 8, 16, 32, "
                                     "64 or 128 (16)"},
    [O_KVDT] = {"kv-cache-dtype", "T", "auto or fp8 (fp8_e4m3, fp8_e5m2)"},
    [O_DTYPE] = {"dtype", "T", "auto, bfloat16, float16 or float32"},
    [O_TP] = {"tensor-parallel-size", "N", "ranks the model is split over"},
    [O_EAGER] = {"enforce-eager", NULL, "no torch.compile, no CUDA graphs"},
    [O_NONTORCH] = {"non-torch", "SIZE",
                    "memory outside PyTorch during start-up (measured "
                    "profile: context - bare runtime; else 0)"},
    [O_PROMPT] = {"prompt", "N", "prompt tokens of one request"},
    [O_OUTPUT] = {"output", "N", "output tokens of one request"},
    [O_CONC] = {"concurrency", "N",
                "with --gpu-family: requests that must run at once (1)"},
    [O_HF] = {"hf-config", "FILE",
              "KV layout (MLA, sliding windows) from this config.json "
              "(default: MODEL when it is one)"},
    [O_FORMAT] = {"format", "FMT", "table or json"},
    [O_HELP] = {"help", NULL, "this help"},
};
#define N_SERVE_OPTS (sizeof serve_opts / sizeof serve_opts[0])

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
          "requests of --prompt + --output tokens (docs/SERVING.md).\n"
          "\n"
          "Options:\n",
          f);
    cli_opts_help(f, serve_opts, N_SERVE_OPTS);
    fputs("\nExit status: 0 it serves, 1 it does not fit, 2 usage error, "
          "3 invalid model.\n",
          f);
}

typedef struct serve_args {
    const char *model, *gpu, *family, *hf, *format;
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
            return 0;
        }
    return cli_usage_error("invalid value '%s' for --%s", v, opt);
}

static int serve_option(void *ud, int id, const char *v)
{
    serve_args *a = ud;
    uint64_t u;
    char *end;
    vp_error err;

    switch (id) {
    case O_GPU: a->gpu = v; return 0;
    case O_FAMILY: a->family = v; return 0;
    case O_HF: a->hf = v; return 0;
    case O_FORMAT: a->format = v; return 0;
    case O_EAGER: a->cfg.enforce_eager = true; return 0;
    case O_UTIL:
        errno = 0;
        a->cfg.gpu_memory_utilization = strtod(v, &end);
        if (errno || *end || !(a->cfg.gpu_memory_utilization > 0.0 &&
                               a->cfg.gpu_memory_utilization <= 1.0))
            return cli_usage_error("invalid fraction '%s' for "
                                   "--gpu-memory-utilization (0 to 1)",
                                   v);
        return 0;
    case O_MAXLEN: return cli_u64("max-model-len", v, 1, 1u << 24,
                                  &a->cfg.max_model_len) ? 0 : 2;
    case O_SEQS: return cli_u64("max-num-seqs", v, 1, 1u << 20,
                                &a->cfg.max_num_seqs) ? 0 : 2;
    case O_TOKENS: return cli_u64("max-num-batched-tokens", v, 1, 1u << 24,
                                  &a->cfg.max_num_batched_tokens) ? 0 : 2;
    case O_BLOCK:
        if (!cli_u64("block-size", v, 1, 128, &u))
            return 2;
        if (u != 1 && (u < 8 || (u & (u - 1)) != 0))
            return cli_usage_error("invalid block size %s (1, 8, 16, 32, "
                                   "64 or 128)", v);
        a->cfg.block_size = (uint32_t)u;
        return 0;
    case O_KVDT: return parse_dtype(v, "kv-cache-dtype",
                                    &a->cfg.kv_dtype_bytes);
    case O_DTYPE: return parse_dtype(v, "dtype", &a->cfg.dtype_bytes);
    case O_TP:
        if (!cli_u64("tensor-parallel-size", v, 1, 1024, &u))
            return 2;
        a->cfg.tensor_parallel = (uint32_t)u;
        return 0;
    case O_NONTORCH:
        if (vp_size_parse(v, &a->cfg.non_torch_bytes, &err) != VP_OK)
            return cli_usage_error("invalid size '%s' for --non-torch: %s",
                                   v, err.msg);
        a->cfg.non_torch_given = true;
        return 0;
    case O_PROMPT: return cli_u64("prompt", v, 1, 1u << 24, &a->prompt) ? 0
                                                                       : 2;
    case O_OUTPUT: return cli_u64("output", v, 0, 1u << 24, &a->output) ? 0
                                                                       : 2;
    case O_CONC: return cli_u64("concurrency", v, 1, 1u << 20,
                                &a->concurrency) ? 0 : 2;
    }
    return 2;
}

/* 0 parsed, -1 --help printed, else an exit code. */
static int serve_parse(int argc, char **argv, serve_args *a)
{
    int rc;

    memset(a, 0, sizeof *a);
    vp_serve_config_init(&a->cfg);
    a->format = "table";
    rc = cli_parse(argc, argv, serve_opts, N_SERVE_OPTS, serve_option, a,
                   &a->model);
    if (rc < 0)
        serve_help(stdout);
    if (rc)
        return rc;
    if (!a->model)
        return cli_usage_error("serve needs a MODEL");
    if (!a->gpu == !a->family)
        return cli_usage_error("serve needs one of --gpu and --gpu-family");
    if (strcmp(a->format, "table") && strcmp(a->format, "json"))
        return cli_usage_error("invalid format '%s' (table or json)",
                               a->format);
    if (a->concurrency && !a->family)
        return cli_usage_error("--concurrency goes with --gpu-family");
    if (a->output && !a->prompt)
        return cli_usage_error("--output needs --prompt");
    a->cfg.request_tokens = a->prompt + a->output;
    if (!a->concurrency)
        a->concurrency = 1;
    return 0;
}

static void print_json(const serve_args *a, const char *gpu,
                       const vp_serve_result *r, vp_status st)
{
    printf("{\"model\": \"%s\", \"gpu\": \"%s\", \"fits\": %s,\n", a->model,
           gpu, st == VP_OK ? "true" : "false");
    printf(" \"settings\": {\"gpu_memory_utilization\": %g, \"max_model_len\""
           ": %" PRIu64 ", \"max_num_seqs\": %" PRIu64
           ", \"max_num_batched_tokens\": %" PRIu64 ", \"block_size\": %" PRIu32
           ", \"kv_dtype_bytes\": %" PRIu32 ", \"tensor_parallel_size\": %"
           PRIu32 ", \"enforce_eager\": %s},\n",
           a->cfg.gpu_memory_utilization, r->max_model_len, r->max_num_seqs,
           r->max_num_batched_tokens, r->block_size, r->kv_dtype_bytes,
           r->tensor_parallel, a->cfg.enforce_eager ? "true" : "false");
    printf(" \"total\": %" PRIu64 ", \"requested\": %" PRIu64
           ", \"weights\": %" PRIu64 ", \"forward_peak\": %" PRIu64
           ", \"sampler_peak\": %" PRIu64 ", \"activation_peak\": %" PRIu64
           ", \"non_torch\": %" PRIu64 ", \"kv_available\": %" PRIu64 ",\n",
           r->total_bytes, r->requested_bytes, r->weight_bytes,
           r->forward_peak, r->sampler_peak, r->activation_peak,
           r->non_torch_bytes, r->kv_available);
    printf(" \"page_bytes\": %" PRIu64 ", \"layers\": %" PRIu32
           ", \"groups\": %" PRIu32 ", \"num_blocks\": %" PRIu64
           ", \"kv_tokens\": %" PRIu64 ", \"kv_bytes\": %" PRIu64
           ", \"kv_bytes_per_token\": %" PRIu64 ",\n",
           r->page_bytes, r->n_layers, r->n_groups, r->num_blocks,
           r->kv_tokens, r->kv_bytes, r->kv_bytes_per_token);
    printf(" \"max_concurrency\": %.2f, \"request_tokens\": %" PRIu64
           ", \"concurrency\": %" PRIu64 ",\n",
           r->max_concurrency, r->request_tokens, r->concurrency);
    printf(" \"cudagraph_sizes\": %" PRIu32 ", \"cudagraph_max_size\": %"
           PRIu32 ", \"cudagraph_bytes\": %" PRIu64 ", \"context\": %" PRIu64
           ", \"headroom\": %" PRIu64 ", \"headroom_ok\": %s}\n",
           r->cudagraph_sizes, r->cudagraph_max_size, r->cudagraph_bytes,
           r->context_bytes, r->headroom_bytes,
           r->headroom_ok ? "true" : "false");
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
    vp_gpu_profile *gpu = vp_gpu_load(gpu_name, &err);
    vp_status st;

    if (!gpu)
        return cli_lib_error(&err);
    st = vp_serve_plan(m, kv, gpu, &a->cfg, &r, &err);
    if (st != VP_OK && st != VP_EOOM) {
        vp_gpu_free(gpu);
        return cli_lib_error(&err);
    }
    if (st == VP_OK)
        vp_error_clear(&err);
    if (strcmp(a->format, "json") == 0)
        print_json(a, vp_gpu_name(gpu), &r, st);
    else
        print_table(a, gpu, &r, &err);
    vp_gpu_free(gpu);
    return st == VP_OK ? 0 : 1;
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
    const char *hf;
    vp_model *m;
    int rc = serve_parse(argc, argv, &a);

    if (rc)
        return rc < 0 ? 0 : rc;
    m = vp_model_load(a.model, &err);
    if (!m)
        return cli_lib_error(&err);
    hf = a.hf ? a.hf
         : strlen(a.model) > 5 &&
                 strcmp(a.model + strlen(a.model) - 5, ".json") == 0
             ? a.model
             : NULL;
    if (hf && vp_kv_layout_from_hf(hf, &kv, &err) != VP_OK) {
        vp_model_free(m);
        return cli_lib_error(&err);
    }
    if (a.family) {
        fam_ctx c = {&a, m, hf ? &kv : NULL};
        rc = cli_mig_smallest(a.family, fam_fits, &c);
    } else {
        rc = serve_one(&a, m, hf ? &kv : NULL, a.gpu);
    }
    vp_kv_layout_destroy(&kv);
    vp_model_free(m);
    return rc;
}
