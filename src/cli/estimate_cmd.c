/* vramplan estimate, and the setup options that maxbatch, plan and
 * techniques share with it.
 *
 *   vramplan estimate models/gpt2-small.yaml --batch 8 --precision amp-bf16
 *
 * The report has three printers (table, json, csv) behind one interface,
 * and --timeline writes every simulated allocation and free as CSV. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* ---- the setup options -------------------------------------------------- */

enum {
    OPT_SET_TO_NONE = CLI_O__SETUP, OPT_INFERENCE, OPT_CONTEXT,
    OPT_CUBLAS_WORKSPACE, OPT_EXPANDABLE, OPT_SELECTIVE, OPT_OFFLOAD_OPT,
    OPT_OFFLOAD_ACT, OPT_COMPRESS, OPT_INT8, OPT_FORMAT, OPT_TIMELINE,
    OPT_GPU_DIR, OPT_GPU, OPT_GLOBAL_BATCH, OPT_SNAPSHOT, OPT_HTML,
    OPT_TARGET, OPT_LORA, OPT_FREEZE, OPT_QUANT, OPT_DOUBLE_QUANT, OPT_LOAD,
    OPT_BASE_DTYPE, OPT_GENERATE, OPT_CACHE, OPT_HOST_PROBE, OPT__END
};
_Static_assert((int)OPT__END <= (int)CLI_O_STRATEGY,
               "estimate's own option ids run into the data-parallel ones");

#define NAME_OF(name, str) str,
const char *const cli_precisions[] = {VP_PRECISION_MAP(NAME_OF) NULL};
const char *const cli_optimizers[] = {VP_OPTIMIZER_MAP(NAME_OF) NULL};
#undef NAME_OF
#define LIST_ITEM(name, str) " " str
const char *const cli_attns[] = {"sdpa", "flash", "efficient", "eager",
                                 "math", NULL};
static const char *const FORMATS[] = {"table", "json", "csv", NULL};
static const char *const CACHES[] = {
#define VP__CACHE(name, str) str,
    VP_CACHE_MAP(VP__CACHE)
#undef VP__CACHE
    NULL};
static const char *const BITS[] = {"2", "4", "8", NULL};
/* vp_quant, vp_load and vp_base_dtype order, past their "none"/"auto" */
static const char *const QUANTS[] = {"nf4", "fp4", "int8", NULL};
static const char *const LOADS[] = {"dtype", "fp32-then-cast", "meta", NULL};
static const char *const BASE_DTYPES[] = {"fp32", "bf16", "fp16", NULL};

#define FLAG(i, n, h) {.id = i, .name = n, .type = CLI_ARG_FLAG, .help = h}
#define U64(i, s, n, lo, hi, h)                                             \
    {.id = i, .short_name = s, .name = n, .metavar = "N",                   \
     .type = CLI_ARG_U64, .min = lo, .max = hi, .help = h}
#define SIZE(i, n, h)                                                       \
    {.id = i, .name = n, .metavar = "SIZE", .type = CLI_ARG_SIZE, .help = h}
#define ENUM(i, s, n, m, ch, w, h)                                          \
    {.id = i, .short_name = s, .name = n, .metavar = m,                     \
     .type = CLI_ARG_ENUM, .choices = ch, .what = w, .help = h}
#define STR(i, s, n, m, h)                                                  \
    {.id = i, .short_name = s, .name = n, .metavar = m,                     \
     .type = CLI_ARG_STRING, .help = h}

/* --gpu: what the profile gives the command besides the CUDA context. */
#define GPU_ROW(cmd, gives)                                                 \
    {.id = OPT_GPU, .short_name = 'g', .name = "gpu", .metavar = "NAME",    \
     .type = CLI_ARG_STRING, .only = cmd,                                   \
     .help = "GPU profile: a name (gpus/NAME.yaml in the search path) or a " \
             "profile file; gives the CUDA context, " gives " the budget "  \
             "when --budget is absent (memory less the context) or a "      \
             "fraction (--budget 0.9)"}

static const cli_opt SETUP_OPTS[] = {
    CLI_ROW_BATCH,
    CLI_ROW_SEQ,
    U64(OPT_TARGET, 0, "target", 1, UINT64_MAX,
        "decoder length of an encoder-decoder model (default: the model's "
        "target, else seq)"),
    CLI_ROW_PRECISION("one of:" VP_PRECISION_MAP(LIST_ITEM) " (default fp32)"),
    CLI_ROW_OPTIMIZER("one of:" VP_OPTIMIZER_MAP(LIST_ITEM)
                      " (default adamw)"),
    CLI_ROW_CHECKPOINT("activation checkpointing: none, all, or segment "
                       "names (default none)"),
    CLI_ROW_ACCUM,
    CLI_ROW_KEEP_GRADS,
    FLAG(OPT_SET_TO_NONE, "set-to-none",
         "zero_grad(set_to_none=True) (default)"),
    FLAG(OPT_INFERENCE, "inference",
         "forward passes only, under torch.no_grad()"),
    CLI_ROW_ATTENTION("one of: sdpa flash efficient eager math (default: "
                      "the model's)"),
    CLI_ROW_STEPS("training steps simulated, 1 to " VP_TEXT(VP_MAX_STEPS)
                  " (default " VP_TEXT(VP_DEFAULT_STEPS) ")"),
    {.id = CLI_O_BUDGET, .name = "budget", .metavar = "SIZE",
     .type = CLI_ARG_STRING,
     .help = "bytes the allocator may reserve; exit 1 if the setup does not "
             "fit"},
    SIZE(OPT_CONTEXT, "context",
         "CUDA context outside the allocator (default "
         VP_TEXT(VP__CONTEXT) " B)"),
    SIZE(OPT_CUBLAS_WORKSPACE, "cublas-workspace",
         "cuBLAS workspace per handle (default 32MiB)"),
    FLAG(OPT_EXPANDABLE, "expandable-segments",
         "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"),
    STR(OPT_SELECTIVE, 0, "selective", "SPEC",
        "selective recomputation of the attention core in these segments "
        "(names, patterns or all)"),
    FLAG(OPT_OFFLOAD_OPT, "offload-optimizer",
         "optimizer state on the host (CPU Adam, ZeRO-Offload)"),
    FLAG(OPT_OFFLOAD_ACT, "offload-activations",
         "saved activations on the host (save_on_cpu)"),
    ENUM(OPT_COMPRESS, 0, "compress-activations", "BITS", BITS, "bit width",
         "ActNN-style compression of saved activations: 2, 4 or 8 bits"),
    FLAG(OPT_INT8, "int8-weights",
         "INT8 linear weights (bitsandbytes), with --inference"),
    STR(OPT_LORA, 0, "lora", "SPEC",
        "LoRA adapters as peft adds them: r=N,alpha=A,targets=NAMES"
        "[,dropout=P][,dora][,rslora][,adapter_dtype=fp32|base]; targets: "
        "module names (q_proj,v_proj) or all-linear; the base is frozen"),
    STR(OPT_FREEZE, 0, "freeze", "PATTERNS",
        "frozen parameters: comma-separated names or patterns (embed, "
        "layers.0-15, lm_head, layers.*.attn)"),
    ENUM(OPT_QUANT, 0, "quant", "KIND", QUANTS, "quantization",
         "a quantized, frozen base (bitsandbytes): nf4, fp4 (4-bit, QLoRA) "
         "or int8 (LLM.int8)"),
    FLAG(OPT_DOUBLE_QUANT, "double-quant",
         "4-bit: quantize the absmax too (bnb_4bit_use_double_quant)"),
    ENUM(OPT_LOAD, 0, "load", "MODE", LOADS, "load mode",
         "how the weights are loaded: dtype (from_pretrained(torch_dtype=), "
         "the default), fp32-then-cast, meta"),
    ENUM(OPT_BASE_DTYPE, 0, "base-dtype", "DTYPE", BASE_DTYPES, "dtype",
         "the base weights' dtype (default: the precision's; bf16 with "
         "amp-bf16 is a bf16 model under autocast)"),
    STR(OPT_GENERATE, 0, "generate", "SPEC",
        "simulate model.generate() of a causal LM instead of training: "
        "prompt=N,new=N and optionally min-new=N, sample, top-k=N, "
        "top-p=P, padded"),
    ENUM(OPT_CACHE, 0, "cache", "CACHE", CACHES, "cache",
         "generate()'s key/value cache: dynamic (default) or static"),
    ENUM(OPT_FORMAT, 'f', "format", "FMT", FORMATS, "format",
         "table, json or csv (default table)"),
    STR(OPT_TIMELINE, 0, "timeline", "FILE",
        "write every allocation and free to FILE as CSV"),
    CLI_ROW_GPU_DIR(OPT_GPU_DIR),
    CLI_HELP_ROW,
    GPU_ROW(CLI_CMD_ESTIMATE, "and"),
    GPU_ROW(CLI_CMD_SEARCH, "the step time and"),
    {.id = OPT_GLOBAL_BATCH, .name = "global-batch", .metavar = "N",
     .type = CLI_ARG_U64, .min = 1, .max = UINT32_MAX,
     .only = CLI_CMD_SEARCH,
     .help = "samples per optimizer step for plan (default 32)"},
    {.id = OPT_HOST_PROBE, .name = "host-probe-us", .metavar = "US",
     .type = CLI_ARG_DOUBLE, .dmin = 1.0, .dmax = 1e7,
     .only = CLI_CMD_SEARCH,
     .help = "the host benchmark on the machine that will run the step, in "
             "us (python3 groundtruth/collect_hostprobe.py --probe): the "
             "step time's host costs at it over the GPU profile's (default: "
             "the profile's host)"},
    {.id = OPT_SNAPSHOT, .name = "snapshot", .metavar = "FILE",
     .type = CLI_ARG_STRING, .only = CLI_CMD_ESTIMATE,
     .help = "write the simulated steps as torch.cuda.memory._dump_snapshot "
             "writes them (a pickle for PyTorch's memory_viz)"},
    {.id = OPT_HTML, .name = "html", .metavar = "FILE",
     .type = CLI_ARG_STRING, .only = CLI_CMD_ESTIMATE,
     .help = "write one self-contained HTML page: memory over time by "
             "category, the phases, the peak and what holds it"},
    CLI_DIST_ROWS,
};

static cli_spec setup_spec(unsigned which, void (*help)(FILE *))
{
    return (cli_spec){SETUP_OPTS, sizeof SETUP_OPTS / sizeof SETUP_OPTS[0],
                      which, 1, "one MODEL only", false, help};
}

void cli_setup_help(FILE *f, unsigned which)
{
    cli_spec s = setup_spec(which, NULL);

    cli_opts_help(f, &s);
}

int cli_setup_common(const cli_val *v, bool budget, vp_setup *s)
{
    s->batch = v[CLI_O_BATCH].given ? v[CLI_O_BATCH].u : s->batch;
    s->seq = v[CLI_O_SEQ].given ? v[CLI_O_SEQ].u : s->seq;
    if (v[CLI_O_PRECISION].given)
        s->precision = (vp_precision)v[CLI_O_PRECISION].choice;
    if (v[CLI_O_OPTIMIZER].given)
        s->optimizer = (vp_optimizer)v[CLI_O_OPTIMIZER].choice;
    if (v[CLI_O_ACCUM].given)
        s->accum = (uint32_t)v[CLI_O_ACCUM].u;
    if (v[CLI_O_KEEP_GRADS].given)
        s->set_to_none = false;
    if (v[CLI_O_ATTENTION].given) {
        s->attn = (vp_attn_impl)v[CLI_O_ATTENTION].choice;
        s->attn_set = true;
    }
    if (v[CLI_O_STEPS].given)
        s->steps = (uint32_t)v[CLI_O_STEPS].u;
    if (!budget || !v[CLI_O_BUDGET].given)
        return -1;
    if (v[CLI_O_BUDGET].u == 0)
        return cli_usage_error("invalid value '%s' for --budget: the budget "
                               "must be more than 0 bytes",
                               v[CLI_O_BUDGET].text);
    s->alloc.limit = v[CLI_O_BUDGET].u;
    return -1;
}

/* What only estimate and the searches take. */
static void apply_setup(const cli_val *v, vp_setup *s)
{
    /* the last of --keep-grads and --set-to-none wins */
    if (v[CLI_O_KEEP_GRADS].given)
        s->set_to_none = v[OPT_SET_TO_NONE].at > v[CLI_O_KEEP_GRADS].at;
    s->inference = v[OPT_INFERENCE].given;
    if (v[OPT_TARGET].given)
        s->target = v[OPT_TARGET].u;
    if (v[OPT_CONTEXT].given)
        s->context_bytes = v[OPT_CONTEXT].u;
    if (v[OPT_CUBLAS_WORKSPACE].given)
        s->cublas_workspace = v[OPT_CUBLAS_WORKSPACE].u;
    s->alloc.expandable_segments = v[OPT_EXPANDABLE].given;
    s->offload_optimizer = v[OPT_OFFLOAD_OPT].given;
    s->offload_activations = v[OPT_OFFLOAD_ACT].given;
    if (v[OPT_COMPRESS].given)
        s->act_bits = (uint32_t)strtoul(v[OPT_COMPRESS].text, NULL, 10);
    if (v[OPT_INT8].given)
        s->weight_bits = 8;
    if (v[OPT_QUANT].given)
        s->ft.quant = (vp_quant)(v[OPT_QUANT].choice + 1);
    s->ft.double_quant = v[OPT_DOUBLE_QUANT].given;
    if (v[OPT_LOAD].given)
        s->ft.load = (vp_load)v[OPT_LOAD].choice;
    if (v[OPT_BASE_DTYPE].given)
        s->ft.base_dtype = (vp_base_dtype)(v[OPT_BASE_DTYPE].choice + 1);
}

void cli_finetune_line(FILE *f, const vp_setup *s)
{
    char d[VP_LORA_TARGETS_MAX + VP_FREEZE_MAX + 128];

    if (!vp_finetune_active(&s->ft))
        return;
    vp_finetune_describe(&s->ft, d, sizeof d);
    fprintf(f, "fine-tuning  %s\n", d);
}

/* --lora and --freeze: -1, or CLI_USAGE after the error. */
static int apply_finetune(const cli_val *v, vp_setup *s)
{
    vp_error err;

    if (v[OPT_LORA].given &&
        vp_lora_parse(v[OPT_LORA].text, &s->ft.lora, &err) != VP_OK)
        return cli_usage_error("%s", err.msg);
    if (v[OPT_FREEZE].given &&
        vp_freeze_parse(v[OPT_FREEZE].text, &s->ft, &err) != VP_OK)
        return cli_usage_error("%s", err.msg);
    return -1;
}

/* --generate SPEC and --cache; the training options are refused with
 * it. -1, or CLI_USAGE after the error. */
static int apply_generate(const cli_val *v, vp_setup *s)
{
    static const struct {
        int id;
        const char *name;
    } training[] = {
        {CLI_O_SEQ, "seq"}, {CLI_O_OPTIMIZER, "optimizer"},
        {CLI_O_CHECKPOINT, "checkpoint"}, {CLI_O_ACCUM, "accum"},
        {CLI_O_KEEP_GRADS, "keep-grads"}, {OPT_SET_TO_NONE, "set-to-none"},
        {OPT_SELECTIVE, "selective"}, {OPT_OFFLOAD_OPT, "offload-optimizer"},
        {OPT_OFFLOAD_ACT, "offload-activations"},
        {OPT_COMPRESS, "compress-activations"},
    };
    vp_error err;

    if (!v[OPT_GENERATE].given)
        return v[OPT_CACHE].given ? cli_usage_error("--cache needs --generate")
                                  : -1;
    if (vp_generate_parse(v[OPT_GENERATE].text, &s->generate, &err) != VP_OK)
        return cli_usage_error("--generate: %s", err.msg);
    for (size_t i = 0; i < sizeof training / sizeof training[0]; i++)
        if (v[training[i].id].given)
            return cli_usage_error("--%s does not apply to --generate (%s)",
                                   training[i].name,
                                   training[i].id == CLI_O_SEQ
                                       ? "the prompt's length is its prompt=N"
                                       : "generate() runs under no_grad: "
                                         "no training step");
    if (v[OPT_CACHE].given)
        s->generate.cache = (vp_cache_impl)v[OPT_CACHE].choice;
    s->seq = s->generate.prompt;
    return -1;
}

int cli_setup_budget(cli_setup_args *a, const char *b)
{
    vp_error err;

    a->budget = b;
    if (strchr(b, '.') && strspn(b, "0123456789.") == strlen(b) &&
             strtod(b, NULL) <= 1.0)
        return -1; /* a fraction of --gpu's memory: resolved later */
    else if (vp_size_parse(b, &a->setup.alloc.limit, &err) != VP_OK)
        return cli_usage_error("--budget: %s", err.msg);
    if (a->setup.alloc.limit == 0)
        return cli_usage_error("invalid value '%s' for --budget: the budget "
                               "must be more than 0 bytes", b);
    return -1;
}

int cli_setup_parse(int argc, char **argv, unsigned which,
                    void (*help)(FILE *), cli_setup_args *a)
{
    cli_spec spec = setup_spec(which, help);
    const cli_val *v = a->args.v;

    memset(a, 0, sizeof *a);
    int rc = cli_args_parse(&spec, argc, argv, &a->args);
    if (rc >= 0)
        return rc;
    vp_setup_init(&a->setup);
    if ((rc = cli_setup_common(v, false, &a->setup)) >= 0)
        return rc;
    apply_setup(v, &a->setup);
    if ((rc = apply_finetune(v, &a->setup)) >= 0)
        return rc;
    if ((rc = apply_generate(v, &a->setup)) >= 0)
        return rc;
    if (v[CLI_O_BUDGET].given &&
        (rc = cli_setup_budget(a, v[CLI_O_BUDGET].text)) >= 0)
        return rc;
    if (v[OPT_GPU_DIR].given)
        cli_set_gpu_dir(v[OPT_GPU_DIR].text);
    if ((rc = cli_dist_parse(v, &a->dist, &a->dist_set)) >= 0)
        return rc;
    if ((rc = cli_tp_parse(v, &a->dist, &a->tp)) >= 0)
        return rc;
    a->model_path = a->args.n_operands ? a->args.operands[0] : NULL;
    a->gpu = v[OPT_GPU].given ? v[OPT_GPU].text : NULL;
    a->snapshot = v[OPT_SNAPSHOT].given ? v[OPT_SNAPSHOT].text : NULL;
    a->html = v[OPT_HTML].given ? v[OPT_HTML].text : NULL;
    a->checkpoint = v[CLI_O_CHECKPOINT].given ? v[CLI_O_CHECKPOINT].text
                                              : NULL;
    a->selective = v[OPT_SELECTIVE].given ? v[OPT_SELECTIVE].text : NULL;
    a->timeline = v[OPT_TIMELINE].given ? v[OPT_TIMELINE].text : NULL;
    a->format = v[OPT_FORMAT].given ? v[OPT_FORMAT].choice : CLI_FMT_TABLE;
    a->global_batch = v[OPT_GLOBAL_BATCH].given ? v[OPT_GLOBAL_BATCH].u : 0;
    a->host_probe_us = v[OPT_HOST_PROBE].given ? v[OPT_HOST_PROBE].d : 0.0;
    a->steps_given = v[CLI_O_STEPS].given;
    a->precision_given = v[CLI_O_PRECISION].given;
    a->optimizer_given = v[CLI_O_OPTIMIZER].given;
    if (a->model_path == NULL)
        return cli_usage_error("%s needs a MODEL file", argv[0]);
    a->model_path = cli_model_path(a->model_path, a->model_buf,
                                   sizeof a->model_buf, &rc);
    return a->model_path == NULL ? rc : -1;
}

int cli_setup_gpu(cli_setup_args *a, vp_hw *hw, bool *have_hw)
{
    int rc;

    *have_hw = false;
    if (a->gpu == NULL && a->host_probe_us > 0.0)
        return cli_usage_error("--host-probe-us needs --gpu: the host is "
                               "timed against the GPU profile's");
    if (a->gpu == NULL) {
        if (a->setup.alloc.limit == 0 && a->budget != NULL)
            return cli_usage_error("--budget %s is a fraction: give --gpu "
                                   "too", a->budget);
        return -1;
    }
    if ((rc = cli_gpu_hw(a->gpu, hw)) >= 0)
        return rc;
    if (a->host_probe_us > 0.0) {
        if (hw->host_probe <= 0.0)
            return cli_usage_error("--host-probe-us: the GPU profile '%s' "
                                   "has no host benchmark of its own "
                                   "(measured.host_probe_us)", a->gpu);
        hw->host_scale = a->host_probe_us * 1e-6 / hw->host_probe;
    }
    *have_hw = true;
    a->setup.context_bytes = hw->context;
    a->setup.alloc.device_total = hw->memory;
    if (a->budget == NULL) {
        a->setup.alloc.limit =
            hw->memory > hw->context ? hw->memory - hw->context : 0;
    } else if (a->setup.alloc.limit == 0) {
        double f = strtod(a->budget, NULL);
        if (!(f > 0.0 && f <= 1.0))
            return cli_usage_error("invalid fraction '%s' for --budget (0 to "
                                   "1)", a->budget);
        a->setup.alloc.limit = (uint64_t)(f * (double)hw->memory);
    }
    return -1;
}

static void estimate_help(FILE *f)
{
    fputs("Usage: vramplan estimate MODEL [OPTIONS]\n"
          "\n"
          "Simulate training steps of MODEL (a vramplan YAML file or a Hugging "
          "Face\n"
          "config.json) as PyTorch 2.11 runs them on one GPU, through a model "
          "of its\n"
          "CUDA caching allocator, and report the peak memory. MODEL may also "
          "be\n"
          "the name of a shipped model (gpt2-small: models/gpt2-small.yaml in "
          "the\n"
          "search path of `man vramplan`).\n"
          "\n"
          "Options:\n", f);
    cli_setup_help(f, CLI_CMD_ESTIMATE);
    fputs("\n"
          "--checkpoint takes 'none', 'all' (every layer or repeated block) or "
          "a\n"
          "comma-separated list of segment names or patterns, where '*' "
          "matches\n"
          "within one dot-separated part: 'layers.0,layers.1', 'h.*'.\n"
          "\n" CLI_SIZE_HELP "\n"
          "--format table is for people (binary units, rounded); json and csv "
          "give\n"
          "exact byte counts. The timeline CSV has the columns\n"
          "seq,step,phase,op,category,action,bytes,allocated,reserved.\n"
          "\n", f);
    cli_exit_help(f);
}

/* ---- the report ------------------------------------------------------------ */

/* What a printer gets: the estimate and what produced it. */
typedef struct report {
    const char *model_path;
    const vp_graph *graph;
    const vp_setup *setup;     /* as simulated; checkpoint resolved      */
    const char *checkpoint;    /* the --checkpoint spec, "none" default  */
    const vp_estimate *est;    /* a data-parallel run's: its most loaded
                                  rank's                                */
    const vp_rank_estimate *roles; /* a data-parallel run's, or NULL    */
    size_t n_roles, worst;
    const vp_tp_layout *tp;    /* fsdp2 with --tp / --pp: the stage
                                  simulated; NULL without              */
} report;

/* A named byte count, shared by the JSON and CSV printers. */
typedef struct metric {
    const char *key;
    uint64_t bytes;
} metric;

#define N_TOTALS 11
#define N_STEP_METRICS 9

static void total_metrics(const vp_estimate *e, metric out[N_TOTALS])
{
    const metric m[N_TOTALS] = {
        {"param_bytes", e->param_bytes},
        {"grad_bytes", e->grad_bytes},
        {"optim_bytes", e->optim_bytes},
        {"baseline", e->baseline},
        {"after_model", e->after_model},
        {"peak_alloc", e->peak_alloc},
        {"peak_alloc_steady", e->peak_alloc_steady},
        {"peak_reserved", e->peak_reserved},
        {"device_used", e->device_used},
        {"host_bytes", e->host_bytes},
        {"host_traffic", e->host_traffic},
    };

    memcpy(out, m, sizeof m);
}

/* Key names as in shared/groundtruth (fwd_peak, after_fwd, ...). */
static void step_metrics(const vp_phase_peaks *p,
                         metric out[N_STEP_METRICS])
{
    const metric m[N_STEP_METRICS] = {
        {"start", p->start},
        {"setup_peak", p->peak[VP_PHASE_SETUP]},
        {"fwd_peak", p->peak[VP_PHASE_FORWARD]},
        {"after_fwd", p->after_fwd},
        {"bwd_peak", p->peak[VP_PHASE_BACKWARD]},
        {"after_bwd", p->after_bwd},
        {"opt_peak", p->peak[VP_PHASE_OPTIMIZER]},
        {"end", p->end},
        {"reserved", p->reserved},
    };

    memcpy(out, m, sizeof m);
}

/* Short, machine-friendly category names (JSON keys, CSV, timeline). */
static const char *category_key(vp_category c)
{
    static const char *const keys[VP_CAT__COUNT] = {
        [VP_CAT_PARAM] = "params",
        [VP_CAT_GRAD] = "grads",
        [VP_CAT_OPTIM] = "optimizer",
        [VP_CAT_ACT] = "activations",
        [VP_CAT_TEMP] = "temporaries",
        [VP_CAT_CAST] = "autocast_cache",
        [VP_CAT_INPUT] = "input",
        [VP_CAT_WORKSPACE] = "workspace",
    };

    if ((unsigned)c < VP_CAT__COUNT && keys[c] != NULL)
        return keys[c];
    return vp_category_name(c);
}

/* The parameters one token passes through (the routed experts' top_k of
 * E: vp_graph_num_active_params); the count itself without experts. */
static uint64_t active_params(const report *r)
{
    uint64_t n = r->est->params;
    if (vp_graph_num_active_params(r->graph, &n, NULL) != VP_OK)
        n = r->est->params;
    return n;
}

static uint32_t report_steps(const vp_estimate *e)
{
    return e->steps < VP_MAX_STEPS ? e->steps : VP_MAX_STEPS;
}

static uint32_t report_top_layers(const vp_estimate *e)
{
    return e->n_top_layers < VP_TOP_LAYERS ? e->n_top_layers : VP_TOP_LAYERS;
}

/* strlen of a possibly unterminated fixed-size field. */
static size_t bounded_len(const char *s, size_t max)
{
    size_t n = 0;

    while (n < max && s[n] != '\0')
        n++;
    return n;
}

static double share(uint64_t part, uint64_t whole)
{
    return whole > 0 ? 100.0 * (double)part / (double)whole : 0.0;
}

/* --- table ---------------------------------------------------------- */

/* The allocator's settings and the parameter count. */
/* The allocator line and the parameters: trainable of total for a
 * fine-tuning setup, the active ones per token of a mixture of experts. */
static void table_allocator(FILE *f, const report *r)
{
    const vp_setup *s = r->setup;
    const vp_estimate *e = r->est;
    char a[32], b[32];
    fprintf(f, "allocator    budget %s, expandable segments %s, cuBLAS "
            "workspace %s\n",
            s->alloc.limit ? vp_size_format(s->alloc.limit, a, sizeof a)
                           : "none",
            s->alloc.expandable_segments ? "on" : "off",
            vp_size_format(s->cublas_workspace, b, sizeof b));
    cli_finetune_line(f, s);
    if (vp_finetune_active(&s->ft)) {
        fprintf(f, "parameters   %s (%s) trainable", cli_commas(e->params, a,
                sizeof a), cli_si((double)e->params, "", b, sizeof b));
        fprintf(f, " of %s (%s)\n", cli_commas(e->total_params, a, sizeof a),
                cli_si((double)e->total_params, "", b, sizeof b));
        return;
    }
    uint64_t act = active_params(r);
    fprintf(f, "parameters   %s (%s)", cli_commas(e->params, a, sizeof a),
            cli_si((double)e->params, "", b, sizeof b));
    if (act != e->params) /* a mixture of experts */
        fprintf(f, ", %s (%s) active per token",
                cli_commas(act, a, sizeof a),
                cli_si((double)act, "", b, sizeof b));
    fprintf(f, "\n");
}

/* The setup and model state of a generate() estimate. */
static void table_generate_setup(FILE *f, const report *r)
{
    const vp_estimate *e = r->est;
    const vp_setup *s = r->setup;
    const vp_generate *g = &s->generate;
    char a[32], b[32], c[32];

    fprintf(f, "generate     %" PRIu64 " sequences of %" PRIu64 " prompt "
            "tokens + %" PRIu64 " new (min_new_tokens %" PRIu64 "), %s, %s "
            "cache, %" PRIu32 " calls\n", vp_graph_batch(r->graph), g->prompt,
            g->new_tokens, g->min_new, vp_precision_name(s->precision),
            vp_cache_impl_name(g->cache), s->steps);
    if (g->sample)
        fprintf(f, "             sampling: top-k %" PRIu32 ", top-p %s%s\n",
                g->top_k, g->top_p ? "on" : "off",
                g->padded ? ", padded prompts" : "");
    else
        fprintf(f, "             greedy%s\n",
                g->padded ? ", padded prompts" : "");
    fprintf(f, "             attention %s\n",
            s->attn_set ? vp_attn_impl_name(s->attn) : "as in the model");
    table_allocator(f, r);
    fprintf(f, "model state  weights %s, KV cache %s when generate() "
            "returns, %s at the peak\n",
            vp_size_format(e->gen.weights, a, sizeof a),
            vp_size_format(e->gen.kv_cache_bytes, b, sizeof b),
            vp_size_format(e->gen.kv_at_peak, c, sizeof c));
    fprintf(f, "peaks        prefill %s, decode %s; the peak at token %"
            PRIu64 "\n", vp_size_format(e->gen.prefill_peak, a, sizeof a),
            vp_size_format(e->gen.decode_peak, b, sizeof b),
            e->gen.peak_token);
    fprintf(f, "work         %s per generate() call\n",
            cli_si(e->flops_per_step, "FLOP", a, sizeof a));
}

static void table_setup(FILE *f, const report *r)
{
    const vp_estimate *e = r->est;
    const vp_setup *s = r->setup;
    char a[32], b[32], c[32];
    size_t n_ckpt = 0;

    for (size_t i = 0; i < s->n_checkpoint; i++)
        n_ckpt += s->checkpoint[i];
    fprintf(f, "model        %s (%s)\n", vp_graph_model_name(r->graph),
            r->model_path);
    if (s->generate.prompt) {
        table_generate_setup(f, r);
        return;
    }
    char tg[40] = "";
    if (vp_graph_target(r->graph)) /* an encoder-decoder's decoder length */
        snprintf(tg, sizeof tg, ", target %" PRIu64,
                 vp_graph_target(r->graph));
    fprintf(f, "setup        batch %" PRIu64 ", seq %" PRIu64 "%s, %s, %s%s, "
            "accum %" PRIu32 ", %" PRIu32 " steps\n",
            vp_graph_batch(r->graph), vp_graph_seq(r->graph), tg,
            vp_precision_name(s->precision), vp_optimizer_name(s->optimizer),
            s->inference ? ", inference" : "", s->accum, s->steps);
    fprintf(f, "             zero_grad(set_to_none=%s), attention %s\n",
            s->set_to_none ? "True" : "False",
            s->attn_set ? vp_attn_impl_name(s->attn) : "as in the model");
    fprintf(f, "             checkpoint %s (%zu of %zu segments)\n",
            r->checkpoint, n_ckpt, vp_graph_segment_count(r->graph));
    table_allocator(f, r);
    fprintf(f, "model state  weights %s, gradients %s, optimizer %s\n",
            vp_size_format(e->param_bytes, a, sizeof a),
            vp_size_format(e->grad_bytes, b, sizeof b),
            vp_size_format(e->optim_bytes, c, sizeof c));
    fprintf(f, "work         %s per step\n",
            cli_si(e->flops_per_step, "FLOP", a, sizeof a));
}

static void table_peaks(FILE *f, const report *r)
{
    const vp_estimate *e = r->est;
    const vp_setup *s = r->setup;
    uint64_t total = 0;
    char a[32], b[32];

    if (s->generate.prompt)
        fprintf(f, "\nMemory at the peak (call %" PRIu32 ", token %" PRIu64
                "%s%s)\n", e->peak_step, e->gen.peak_token,
                e->peak_op[0] ? ", op " : "", e->peak_op);
    else
        fprintf(f, "\nMemory at the peak (step %" PRIu32 ", %s%s%s)\n",
                e->peak_step, vp_phase_name(e->peak_phase),
                e->peak_op[0] ? ", op " : "", e->peak_op);
    for (int k = 0; k < VP_CAT__COUNT; k++) {
        fprintf(f, "  %-24s %11s  %5.1f%%\n",
                vp_category_name((vp_category)k),
                vp_size_format(e->by_category[k], a, sizeof a),
                share(e->by_category[k], e->peak_alloc));
        if (!vp_add_u64(total, e->by_category[k], &total))
            total = UINT64_MAX;
    }
    fprintf(f, "  %-24s %11s  %5.1f%%\n", "total",
            vp_size_format(total, a, sizeof a), share(total, e->peak_alloc));
    if (s->generate.prompt)
        fprintf(f, "  %-24s %11s  %5.1f%%  (in the activations)\n",
                "KV cache", vp_size_format(e->gen.kv_at_peak, a, sizeof a),
                share(e->gen.kv_at_peak, e->peak_alloc));
    bool gen = s->generate.prompt > 0;
    fprintf(f, "\npeak allocated  %11s  max_memory_allocated(), %s %"
            PRIu32 " %s\n", vp_size_format(e->peak_alloc, a, sizeof a),
            gen ? "call" : "step", e->peak_step,
            gen ? (e->gen.peak_token > 1 ? "decode" : "prefill")
                : vp_phase_name(e->peak_phase));
    fprintf(f, "steady peak     %11s  max_memory_allocated() in the last "
            "%s\n", vp_size_format(e->peak_alloc_steady, a, sizeof a),
            gen ? "call" : "step");
    if (vp_finetune_active(&s->ft) || e->setup_peak >= e->peak_alloc)
        fprintf(f, "setup peak      %11s  while the model is loaded (load "
                "%s), before step 1\n",
                vp_size_format(e->setup_peak, a, sizeof a),
                vp_load_name(s->ft.load));
    fprintf(f, "peak reserved   %11s  max_memory_reserved()\n",
            vp_size_format(e->peak_reserved, a, sizeof a));
    fprintf(f, "device used     %11s  nvidia-smi: reserved + %s CUDA "
            "context\n", vp_size_format(e->device_used, a, sizeof a),
            vp_size_format(s->context_bytes, b, sizeof b));
    if (e->host_bytes || e->host_traffic)
        fprintf(f, "host RAM        %11s  held by the offloads; %s over the "
                "host link per step\n",
                vp_size_format(e->host_bytes, a, sizeof a),
                vp_size_format(e->host_traffic, b, sizeof b));
}

static void table_steps(FILE *f, const report *r)
{
    const vp_estimate *e = r->est;
    bool gen = r->setup->generate.prompt > 0;
    bool inf = r->setup->inference || gen;

    fprintf(f, "\n%4s %11s %11s %11s %11s %11s %11s\n",
            gen ? "call" : "step", "start", gen ? "peak" : "fwd peak",
            "bwd peak", "opt peak", "end", "reserved");
    for (uint32_t i = 0; i < report_steps(e); i++) {
        const vp_phase_peaks *p = &e->step[i];
        char a[32], b[32], c[32], d[32], g[32], h[32];

        fprintf(f, "%4" PRIu32 " %11s %11s %11s %11s %11s %11s\n", i + 1,
                vp_size_format(p->start, a, sizeof a),
                vp_size_format(p->peak[VP_PHASE_FORWARD], b, sizeof b),
                inf ? "-"
                    : vp_size_format(p->peak[VP_PHASE_BACKWARD], c, sizeof c),
                inf ? "-"
                    : vp_size_format(p->peak[VP_PHASE_OPTIMIZER], d, sizeof d),
                vp_size_format(p->end, g, sizeof g),
                vp_size_format(p->reserved, h, sizeof h));
    }
}

static int print_table(FILE *f, const report *r)
{
    const vp_estimate *e = r->est;
    size_t width = 24;
    char a[32];

    if (r->roles != NULL)
        cli_dist_table(f, r->setup->dist, r->roles, r->n_roles, r->worst);
    if (r->tp != NULL)
        cli_tp_table(f, r->tp);
    table_setup(f, r);
    table_peaks(f, r);
    table_steps(f, r);
    if (report_top_layers(e) > 0) {
        for (uint32_t i = 0; i < report_top_layers(e); i++) {
            size_t len = bounded_len(e->top_layers[i].name,
                                     sizeof e->top_layers[i].name);
            if (len > width)
                width = len;
        }
        fprintf(f, "\nTop layers holding activations at the peak\n");
        for (uint32_t i = 0; i < report_top_layers(e); i++)
            fprintf(f, "  %-*.*s %11s  %5.1f%%\n", (int)width,
                    (int)sizeof e->top_layers[i].name, e->top_layers[i].name,
                    vp_size_format(e->top_layers[i].bytes, a, sizeof a),
                    share(e->top_layers[i].bytes, e->peak_alloc));
    }
    fprintf(f, "\n%" PRIu64 " allocator events simulated, %" PRIu64
            " cudaMalloc retries\n", e->events, e->num_alloc_retries);
    return CLI_OK;
}

/* --- json ----------------------------------------------------------- */

/* The fine-tuning fields, named as in a ground-truth case line. */
static json_t *json_finetune(const vp_finetune *ft)
{
    json_t *o = json_object();

    if (ft->lora.r > 0) {
        json_t *l = json_object();
        cli_jset(l, "r", cli_ju64(ft->lora.r));
        cli_jset(l, "alpha", cli_jreal(ft->lora.alpha, "%.15g"));
        cli_jset(l, "targets", cli_jstr(ft->lora.targets, SIZE_MAX));
        cli_jset(l, "dropout", cli_jreal(ft->lora.dropout, "%.15g"));
        cli_jset(l, "use_dora", json_boolean(ft->lora.dora));
        cli_jset(l, "use_rslora", json_boolean(ft->lora.rslora));
        cli_jset(l, "adapter_dtype", json_string(
                     ft->lora.adapters_in_base_dtype ? "base" : "fp32"));
        cli_jset(o, "lora", l);
    }
    cli_jset(o, "base_dtype", json_string(vp_base_dtype_name(ft->base_dtype)));
    cli_jset(o, "freeze", cli_jstr(ft->freeze, SIZE_MAX));
    cli_jset(o, "quant", json_string(vp_quant_name(ft->quant)));
    cli_jset(o, "double_quant", json_boolean(ft->double_quant));
    cli_jset(o, "load", json_string(vp_load_name(ft->load)));
    return o;
}

static json_t *json_setup(const report *r)
{
    const vp_setup *s = r->setup;
    json_t *o = json_object(), *segs = json_array();

    cli_jset(o, "batch", cli_ju64(vp_graph_batch(r->graph)));
    cli_jset(o, "seq", cli_ju64(vp_graph_seq(r->graph)));
    if (vp_graph_target(r->graph))
        cli_jset(o, "target", cli_ju64(vp_graph_target(r->graph)));
    cli_jset(o, "precision", json_string(vp_precision_name(s->precision)));
    bool gen = s->generate.prompt > 0; /* no_grad: no optimizer */
    cli_jset(o, "optimizer", gen ? json_null()
                                 : json_string(vp_optimizer_name(s->optimizer)));
    cli_jset(o, "attention", s->attn_set
                                 ? json_string(vp_attn_impl_name(s->attn))
                                 : json_null());
    cli_jset(o, "set_to_none", json_boolean(s->set_to_none));
    cli_jset(o, "inference", json_boolean(s->inference || gen));
    cli_jset(o, "accum", cli_ju64(s->accum));
    cli_jset(o, "steps", cli_ju64(s->steps));
    cli_jset(o, "checkpoint", cli_jstr(r->checkpoint, SIZE_MAX));
    for (size_t i = 0; i < s->n_checkpoint; i++)
        if (s->checkpoint[i])
            cli_jpush(segs, cli_jstr(vp_graph_segment(r->graph, i)->name,
                                     SIZE_MAX));
    cli_jset(o, "checkpoint_segments", segs);
    cli_jset(o, "budget", s->alloc.limit ? cli_ju64(s->alloc.limit)
                                         : json_null());
    cli_jset(o, "expandable_segments",
             json_boolean(s->alloc.expandable_segments));
    cli_jset(o, "cublas_workspace", cli_ju64(s->cublas_workspace));
    cli_jset(o, "cublaslt_workspace", cli_ju64(s->cublaslt_workspace));
    cli_jset(o, "context_bytes", cli_ju64(s->context_bytes));
    cli_jset(o, "fresh_process", json_boolean(s->fresh_process));
    if (vp_finetune_active(&s->ft))
        cli_jset(o, "finetune", json_finetune(&s->ft));
    return o;
}

/* What generate() holds: its setup, the KV cache and the peaks. */
static json_t *json_generate(const report *r)
{
    const vp_generate *g = &r->setup->generate;
    const vp_gen_estimate *e = &r->est->gen;
    json_t *o = json_object();

    cli_jset(o, "prompt", cli_ju64(g->prompt));
    cli_jset(o, "new_tokens", cli_ju64(g->new_tokens));
    cli_jset(o, "min_new_tokens", cli_ju64(g->min_new));
    cli_jset(o, "cache", json_string(vp_cache_impl_name(g->cache)));
    cli_jset(o, "sample", json_boolean(g->sample));
    cli_jset(o, "top_k", cli_ju64(g->top_k));
    cli_jset(o, "top_p", json_boolean(g->top_p));
    cli_jset(o, "padded", json_boolean(g->padded));
    cli_jset(o, "weights", cli_ju64(e->weights));
    cli_jset(o, "kv_cache_bytes", cli_ju64(e->kv_cache_bytes));
    cli_jset(o, "kv_at_peak", cli_ju64(e->kv_at_peak));
    cli_jset(o, "prefill_peak", cli_ju64(e->prefill_peak));
    cli_jset(o, "decode_peak", cli_ju64(e->decode_peak));
    cli_jset(o, "peak_token", cli_ju64(e->peak_token));
    return o;
}

static json_t *json_steps(const vp_estimate *e)
{
    metric sm[N_STEP_METRICS];
    json_t *steps = json_array();

    for (uint32_t i = 0; i < report_steps(e); i++) {
        json_t *o = json_object();
        cli_jset(o, "step", cli_ju64(i + 1));
        step_metrics(&e->step[i], sm);
        for (size_t k = 0; k < N_STEP_METRICS; k++)
            cli_jset(o, sm[k].key, cli_ju64(sm[k].bytes));
        cli_jpush(steps, o);
    }
    return steps;
}

/* FLOPs are whole numbers: printed as integers when they fit. */
static json_t *json_flops(double v)
{
    if (isfinite(v) && v == floor(v) && fabs(v) < 9e18)
        return v < 0 ? json_integer((json_int_t)v) : cli_ju64((uint64_t)v);
    return cli_jreal(v, "%.15g");
}

static int print_json(FILE *f, const report *r)
{
    const vp_estimate *e = r->est;
    metric totals[N_TOTALS];
    json_t *o = json_object(), *cats = json_object(), *top = json_array();

    cli_jset(o, "model", cli_jstr(vp_graph_model_name(r->graph), SIZE_MAX));
    cli_jset(o, "model_path", cli_jstr(r->model_path, SIZE_MAX));
    cli_jset(o, "setup", json_setup(r));
    if (r->roles != NULL) {
        json_t *d = cli_dist_json(r->setup->dist, r->roles, r->n_roles,
                                  r->worst);
        if (r->tp != NULL)
            cli_tp_json(d, r->tp);
        cli_jset(o, "dist", d);
    }
    if (r->setup->generate.prompt)
        cli_jset(o, "generate", json_generate(r));
    cli_jset(o, "params", cli_ju64(e->params));
    if (vp_finetune_active(&r->setup->ft)) {
        cli_jset(o, "total_params", cli_ju64(e->total_params));
        cli_jset(o, "setup_peak", cli_ju64(e->setup_peak));
        cli_jset(o, "paged_bytes", cli_ju64(e->paged_bytes));
    } else if (active_params(r) != e->params) {
        cli_jset(o, "active_params", cli_ju64(active_params(r)));
    }
    total_metrics(e, totals);
    for (size_t i = 0; i < N_TOTALS; i++)
        cli_jset(o, totals[i].key, cli_ju64(totals[i].bytes));
    cli_jset(o, "peak_phase", json_string(vp_phase_name(e->peak_phase)));
    cli_jset(o, "peak_step", cli_ju64(e->peak_step));
    cli_jset(o, "peak_op", cli_jstr(e->peak_op, sizeof e->peak_op));
    for (int k = 0; k < VP_CAT__COUNT; k++)
        cli_jset(cats, category_key((vp_category)k),
                 cli_ju64(e->by_category[k]));
    cli_jset(o, "by_category", cats);
    for (uint32_t i = 0; i < report_top_layers(e); i++) {
        json_t *l = json_object();
        cli_jset(l, "name", cli_jstr(e->top_layers[i].name,
                                     sizeof e->top_layers[i].name));
        cli_jset(l, "bytes", cli_ju64(e->top_layers[i].bytes));
        cli_jpush(top, l);
    }
    cli_jset(o, "top_layers", top);
    cli_jset(o, "steps", json_steps(e));
    cli_jset(o, "events", cli_ju64(e->events));
    cli_jset(o, "num_alloc_retries", cli_ju64(e->num_alloc_retries));
    cli_jset(o, "flops_per_step", json_flops(e->flops_per_step));
    return cli_jprint(f, o, true);
}

/* --- csv ------------------------------------------------------------ */

static int print_csv(FILE *f, const report *r)
{
    const vp_estimate *e = r->est;
    metric m[N_TOTALS > N_STEP_METRICS ? N_TOTALS : N_STEP_METRICS];

    fputs("metric,bytes\n", f);
    total_metrics(e, m);
    for (size_t i = 0; i < N_TOTALS; i++)
        fprintf(f, "%s,%" PRIu64 "\n", m[i].key, m[i].bytes);
    for (int k = 0; k < VP_CAT__COUNT; k++)
        fprintf(f, "by_category.%s,%" PRIu64 "\n",
                category_key((vp_category)k), e->by_category[k]);
    if (r->setup->generate.prompt) {
        const metric g[] = {{"weights", e->gen.weights},
                            {"kv_cache_bytes", e->gen.kv_cache_bytes},
                            {"kv_at_peak", e->gen.kv_at_peak},
                            {"prefill_peak", e->gen.prefill_peak},
                            {"decode_peak", e->gen.decode_peak}};
        for (size_t i = 0; i < sizeof g / sizeof g[0]; i++)
            fprintf(f, "generate.%s,%" PRIu64 "\n", g[i].key, g[i].bytes);
    }
    for (uint32_t i = 0; i < report_steps(e); i++) {
        step_metrics(&e->step[i], m);
        for (size_t k = 0; k < N_STEP_METRICS; k++)
            fprintf(f, "steps.%" PRIu32 ".%s,%" PRIu64 "\n", i + 1, m[k].key,
                    m[k].bytes);
    }
    for (size_t k = 0; r->roles != NULL && k < r->n_roles; k++) {
        const vp_rank_estimate *x = &r->roles[k];
        fprintf(f, "rank.%" PRIu32 ".ranks,%" PRIu32 "\n", x->rank,
                x->n_ranks);
        fprintf(f, "rank.%" PRIu32 ".peak_alloc,%" PRIu64 "\n", x->rank,
                x->est.peak_alloc);
        fprintf(f, "rank.%" PRIu32 ".peak_reserved,%" PRIu64 "\n", x->rank,
                x->est.peak_reserved);
    }
    if (r->roles != NULL)
        fprintf(f, "most_loaded_rank,%" PRIu32 "\n", r->roles[r->worst].rank);
    return CLI_OK;
}

static int (*const PRINTERS[])(FILE *, const report *) = {
    [CLI_FMT_TABLE] = print_table,
    [CLI_FMT_JSON] = print_json,
    [CLI_FMT_CSV] = print_csv,
};

/* --- timeline ------------------------------------------------------- */

/* A CSV field, quoted when it holds a comma, quote or line break. */
static void csv_field(FILE *f, const char *s)
{
    if (strpbrk(s, ",\"\r\n") == NULL) {
        fputs(s, f);
        return;
    }
    fputc('"', f);
    for (; *s != '\0'; s++) {
        if (*s == '"')
            fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

static void timeline_event(const vp_sim_event *ev, void *ud)
{
    FILE *f = ud;

    fprintf(f, "%" PRIu64 ",%" PRIu32 ",%s,", ev->seq, ev->step,
            vp_phase_name(ev->phase));
    csv_field(f, ev->op != NULL ? ev->op : "");
    fprintf(f, ",%s,%s,%" PRIu64 ",%" PRIu64 ",%" PRIu64 "\n",
            category_key(ev->category), ev->is_free ? "free" : "alloc",
            ev->bytes, ev->allocated, ev->reserved);
}

/* ---- estimate ------------------------------------------------------------ */

int cli_select_segments(const vp_graph *graph, const char *spec,
                        const char *option, bool **out)
{
    size_t n = vp_graph_segment_count(graph);
    vp_error err;

    *out = calloc(n > 0 ? n : 1, sizeof **out);
    if (*out == NULL)
        return cli_fail("out of memory");
    if (vp_graph_checkpoint_select(graph, spec, *out, &err) != VP_OK) {
        char prefix[64];
        snprintf(prefix, sizeof prefix, "%s: ", option);
        return err.code == VP_EARG ? cli_fail("%s%s", prefix, err.msg)
                                   : cli_report(&err, prefix);
    }
    return -1;
}

/* Resolve --checkpoint and --selective into setup (arrays in *ckpt and
 * *sel, freed by the caller). -1 to go on, or the exit status. */
static int select_all(const cli_setup_args *a, const vp_model *model,
                      const vp_graph *graph, vp_setup *setup, bool **ckpt,
                      bool **sel)
{
    size_t n = vp_graph_segment_count(graph);
    int rc = -1;

    if (a->checkpoint != NULL && strcmp(a->checkpoint, "auto") == 0) {
        if (setup->alloc.limit == 0)
            return cli_usage_error("--checkpoint auto needs --budget");
        rc = cli_checkpoint_auto(model, graph, setup,
                                 a->format == CLI_FMT_TABLE, ckpt, sel);
    } else if (a->checkpoint != NULL &&
               (rc = cli_select_segments(graph, a->checkpoint,
                                         "--checkpoint", ckpt)) < 0) {
        setup->checkpoint = *ckpt;
        setup->n_checkpoint = n;
    }
    if (rc < 0 && a->selective != NULL && *sel == NULL &&
        (rc = cli_select_segments(graph, a->selective, "--selective", sel)) <
            0) {
        setup->selective = *sel;
        setup->n_selective = n;
    }
    return rc;
}

/* Simulate, with every event to --timeline and to the recorders of
 * --snapshot and --html when given; the pictures are written also when
 * the run does not fit (they end where it stopped). */
static int simulate(const cli_setup_args *a, const vp_graph *graph,
                    const vp_setup *setup, vp_estimate *est)
{
    FILE *timeline = NULL;
    cli_pictures *pics = NULL;
    vp_status st = VP_OK;
    vp_error err;
    int rc;

    if (a->timeline != NULL) {
        timeline = fopen(a->timeline, "w");
        if (timeline == NULL)
            return cli_fail("cannot open '%s' for writing: %s", a->timeline,
                            strerror(errno));
        fputs("seq,step,phase,op,category,action,bytes,allocated,reserved\n",
              timeline);
    }
    memset(est, 0, sizeof *est);
    if ((rc = cli_pictures_open(&pics, a->snapshot, a->html, setup,
                                timeline != NULL ? timeline_event : NULL,
                                timeline)) < 0) {
        /* no event to see: accumulation's steady state in closed form */
        bool seen = timeline != NULL || a->snapshot != NULL || a->html != NULL;
        st = vp_simulate(graph, setup, est, seen ? cli_pictures_event : NULL,
                         pics, &err);
        if (st == VP_OK || st == VP_EOOM)
            rc = cli_pictures_write(pics, vp_graph_model_name(graph), setup,
                                    est, st == VP_EOOM ? err.msg : NULL);
    }
    cli_pictures_close(pics);
    if (timeline != NULL) {
        int bad = ferror(timeline);
        if (fclose(timeline) != 0 || bad)
            return rc >= 0 ? rc : cli_fail("cannot write '%s'", a->timeline);
    }
    if (rc >= 0)
        return rc;
    if (st == VP_EOOM)
        return cli_report_no_fit(setup, &err);
    return st != VP_OK ? cli_report(&err, NULL) : -1;
}

/* A data-parallel run: every role simulated; *d then names the most
 * loaded rank, whose run simulate() repeats with the recorders. -1 to go
 * on, or the exit status. */
static int simulate_roles(const vp_graph *graph, const vp_setup *setup,
                          vp_dist *d, vp_rank_estimate **roles, size_t *n,
                          size_t *worst)
{
    vp_error err;
    vp_status st = vp_simulate_ranks(graph, setup, roles, n, worst, &err);

    if (st == VP_EOOM)
        return cli_report_no_fit(setup, &err);
    if (st != VP_OK)
        return cli_report(&err, NULL);
    d->rank = (*roles)[*worst].rank;
    return -1;
}

/* fsdp2 with --tp or --pp: the graph of the stage simulated (the most
 * loaded one unless --stage; vp_tp_simulate) and its pipeline. Only
 * --checkpoint all (torchtitan's full activation checkpointing) or none.
 * -1 to go on, or the exit status. */
static int tp_graph(const cli_setup_args *a, const vp_model *model,
                    vp_setup *setup, vp_pipeline *pl, vp_tp_layout *out,
                    vp_graph **graph)
{
    vp_tp_layout l = a->tp;
    vp_rank_estimate *roles = NULL;
    size_t n, worst;
    vp_error err;
    vp_status st;

    l.ac_full = a->checkpoint != NULL && strcmp(a->checkpoint, "all") == 0;
    if (a->checkpoint != NULL && !l.ac_full &&
        strcmp(a->checkpoint, "none") != 0)
        return cli_usage_error("--checkpoint with --tp or --pp: all or none "
                               "(torchtitan's activation_checkpoint.mode "
                               "full or none)");
    if (a->selective != NULL)
        return cli_usage_error("--selective with --tp or --pp is not "
                               "modelled");
    st = vp_tp_simulate(model, &l, setup, &roles, &n, &worst, &err);
    free(roles);
    if (st == VP_EOOM)
        return cli_report_no_fit(setup, &err);
    if (st != VP_OK)
        return cli_report(&err, NULL);
    *graph = vp_tp_graph_build(model, &l, setup->batch, setup->seq, &err);
    if (*graph == NULL)
        return cli_report(&err, NULL);
    vp_tp_pipeline(&l, pl);
    setup->pipe = l.pp > 1 ? pl : NULL;
    *out = l;
    return -1;
}

static int estimate_run(const cli_setup_args *a)
{
    vp_setup setup = a->setup;
    vp_dist dist = a->dist;
    vp_graph *graph = NULL;
    bool *ckpt = NULL, *sel = NULL;
    vp_rank_estimate *roles = NULL;
    size_t n_roles = 0, worst = 0;
    vp_estimate est;
    vp_error err;
    int rc;

    vp_error_clear(&err);
    setup.dist = a->dist_set ? &dist : NULL;
    vp_model *model = vp_model_load(a->model_path, &err);
    if (model == NULL)
        return cli_report(&err, NULL);
    vp_pipeline pl;
    vp_tp_layout tp;
    bool layout = a->dist_set && (a->tp.tp > 1 || a->tp.pp > 1);
    if (layout)
        rc = tp_graph(a, model, &setup, &pl, &tp, &graph);
    else if ((graph = vp_graph_build_target(model, setup.batch, setup.seq,
                                            setup.target, &err)) == NULL)
        rc = cli_report(&err, NULL);
    else
        rc = -1;
    if (rc >= 0)
        ;
    else if ((rc = select_all(a, model, graph, &setup, &ckpt, &sel)) < 0 &&
             (!a->dist_set ||
              (rc = simulate_roles(graph, &setup, &dist, &roles, &n_roles,
                                   &worst)) < 0) &&
             (rc = simulate(a, graph, &setup, &est)) < 0) {
        report r = {a->model_path, graph, &setup,
                    a->checkpoint != NULL ? a->checkpoint : "none", &est,
                    roles, n_roles, worst, layout ? &tp : NULL};
        rc = PRINTERS[a->format](stdout, &r);
    }
    free(roles);
    free(ckpt);
    free(sel);
    vp_graph_free(graph);
    vp_model_free(model);
    return rc;
}

int cli_estimate(int argc, char **argv)
{
    cli_setup_args a;
    bool have_hw;
    vp_hw hw;
    int rc = cli_setup_parse(argc, argv, CLI_CMD_ESTIMATE, estimate_help, &a);

    if (rc < 0)
        rc = cli_setup_gpu(&a, &hw, &have_hw); /* context and budget */
    if (rc < 0)
        rc = estimate_run(&a);
    cli_args_free(&a.args);
    return rc;
}
