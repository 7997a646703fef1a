/* vramplan plan --gpus, compare and export: plans for clusters.
 *
 *   vramplan plan MODEL --gpus 1024 --gpu h100-80g
 *   vramplan compare MODEL --gpus 8,64,512 --gpu a100-80g,h100-80g
 *   vramplan export MODEL --gpus 64 --gpu h100-80g --to megatron
 *
 * The GPU profiles come from cli_gpu_hw (cli.h). */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "vramplan/cluster.h"
#include "vramplan/vramplan.h"

#define MAX_LIST 16
#define DEFAULT_MAX_GPUS 65536u
#define MAX_DEGREE (1u << 20)

/* ------------------------------------------------------------------ */
/* Options                                                             */
/* ------------------------------------------------------------------ */

typedef enum { FMT_TABLE, FMT_JSON, FMT_CSV, FMT_MD } out_format;

typedef struct cargs {
    cli_args args;
    const char *model;
    uint32_t gpus[MAX_LIST];
    size_t n_gpus;
    char gpu_names[MAX_LIST][64];
    size_t n_gpu;
    uint32_t per_node;
    uint64_t seq;
    uint64_t memory, host_mem, network;
    double tokens;
    vp_search_opts o;
    out_format format;
    bool export_set;
    vp_export_format export_fmt;
    const char *output;
    uint32_t max_gpus;
    double margin;          /* share of each GPU's memory kept free     */
    double days;            /* compare: 0, or the time to finish in     */
    double moe_imbalance;   /* vp_cluster's MoE routing assumption      */
    double moe_capacity;
} cargs;

/* The default safety margin: the share of a GPU kept free, as probe's
 * recommended batch keeps 5 % (vp_probe_config_init). */
#define DEFAULT_MARGIN 0.05

enum { C_PLAN = 1, C_COMPARE = 2, C_EXPORT = 4 };

enum {
    O_GPUS, O_GPU, O_NODES_OF, O_GLOBAL_BATCH, O_SEQ, O_TOKENS, O_PRECISION,
    O_ENGINE, O_NO_OFFLOAD, O_TP, O_PP, O_CP, O_EP, O_DP, O_MICRO_BATCH,
    O_RECOMPUTE, O_SHARDING, O_VPP, O_SCHEDULE, O_SP, O_NO_SP,
    O_FIRST_LAYERS, O_LAST_LAYERS, O_OVERLAP_DP, O_OVERLAP_TP, O_OVERLAP_EP,
    O_COMPILE, O_FP8AG, O_MTP, O_MEMORY, O_HOST_MEM, O_NETWORK, O_TOP, O_MAX_GPUS, O_EXPORT,
    O_OUTPUT, O_FORMAT, O_GPU_DIR, O_MARGIN, O_DAYS, O_MOE_IMBALANCE,
    O_MOE_CAPACITY
};

static const char *const PLAN_FORMATS[] = {"table", "json", NULL};
static const char *const COMPARE_FORMATS[] = {"table", "json", "csv", "md",
                                              NULL};

#define STR(i, n, m, cmds, h)                                               \
    {.id = i, .name = n, .metavar = m, .type = CLI_ARG_STRING,              \
     .only = cmds, .help = h}
#define U64(i, n, m, lo, hi, h)                                             \
    {.id = i, .name = n, .metavar = m, .type = CLI_ARG_U64, .min = lo,      \
     .max = hi, .help = h}
#define SIZE(i, n, h)                                                       \
    {.id = i, .name = n, .metavar = "SIZE", .type = CLI_ARG_SIZE, .help = h}
#define DEGREE(i, n, what) U64(i, n, "N", 1, MAX_DEGREE, "pin the " what)
#define FLAG(i, n, h) {.id = i, .name = n, .type = CLI_ARG_FLAG, .help = h}

static const cli_opt OPTS[] = {
    STR(O_GPUS, "gpus", "N", C_PLAN | C_EXPORT,
        "GPUs in the cluster (required)"),
    STR(O_GPUS, "gpus", "N,N...", C_COMPARE,
        "cluster sizes to compare (required)"),
    STR(O_GPU, "gpu", "NAME", C_PLAN | C_EXPORT,
        "GPU profile, e.g. h100-80g (required)"),
    STR(O_GPU, "gpu", "NAME,...", C_COMPARE,
        "GPU profiles to compare (required)"),
    U64(O_NODES_OF, "nodes-of", "N", 1, MAX_DEGREE,
        "GPUs per node, joined by NVLink (default 8)"),
    U64(O_GLOBAL_BATCH, "global-batch", "B", 1, UINT32_MAX,
        "sequences per optimizer step (default: 4M tokens / seq; "
        "graph-form models: 32 samples per GPU)"),
    U64(O_SEQ, "seq", "S", 1, UINT32_MAX,
        "sequence length (default: the model's)"),
    STR(O_TOKENS, "tokens", "N", C_COMPARE,
        "training tokens for the time and GPU-hours columns, with an "
        "optional K, M, B or T (default 1T)"),
    STR(O_PRECISION, "precision", "LIST", 0,
        "precisions to search: bf16, fp16, fp8, fp32, all (default bf16, "
        "or fp16 without bf16, and fp32)"),
    STR(O_ENGINE, "engine", "LIST", C_PLAN | C_COMPARE,
        "engines to search: megatron, deepspeed, torch (default all)"),
    {.id = O_NO_OFFLOAD, .name = "no-offload", .type = CLI_ARG_FLAG,
     .help = "leave CPU offload out of the search"},
    DEGREE(O_TP, "tp", "tensor-parallel degree"),
    DEGREE(O_PP, "pp", "pipeline-parallel degree"),
    DEGREE(O_CP, "cp", "context-parallel degree"),
    DEGREE(O_EP, "ep", "expert-parallel degree"),
    DEGREE(O_DP, "dp", "data-parallel degree"),
    U64(O_MICRO_BATCH, "micro-batch", "N", 1, UINT32_MAX,
        "pin the micro-batch"),
    STR(O_RECOMPUTE, "recompute", "MODE", 0,
        "pin recomputation: none, selective, full"),
    STR(O_SHARDING, "sharding", "NAME", 0,
        "pin the sharding: ddp, megatron-ddp, distributed-optimizer, zero1, "
        "zero2, zero3, fsdp-full-shard, fsdp-shard-grad-op, "
        "fsdp-hybrid-shard, fsdp2, hsdp2, ddp-zero1"),
    /* the step-time model's pins */
    U64(O_VPP, "vpp", "N", 1, 1024,
        "pin the model chunks per pipeline stage (> 1: interleaved)"),
    STR(O_SCHEDULE, "schedule", "NAME", 0,
        "pin the pipeline schedule: 1f1b, gpipe, interleaved, dualpipe"),
    FLAG(O_SP, "sp", "pin sequence parallelism on (needs --tp > 1)"),
    FLAG(O_NO_SP, "no-sp", "pin sequence parallelism off"),
    U64(O_FIRST_LAYERS, "first-stage-layers", "N", 1, 1u << 20,
        "layers of the first pipeline stage (Megatron's "
        "--decoder-first-pipeline-num-layers)"),
    U64(O_LAST_LAYERS, "last-stage-layers", "N", 1, 1u << 20,
        "layers of the last pipeline stage "
        "(--decoder-last-pipeline-num-layers)"),
    STR(O_OVERLAP_DP, "overlap-dp", "on|off", 0,
        "data-parallel communication behind compute (default on)"),
    STR(O_OVERLAP_TP, "overlap-tp", "on|off", 0,
        "tensor-parallel communication overlap, Megatron --tp-comm-overlap "
        "(default off)"),
    STR(O_OVERLAP_EP, "overlap-ep", "on|off", 0,
        "expert all-to-alls behind compute (default off)"),
    FLAG(O_COMPILE, "compile", "torch.compile (PyTorch engine)"),
    FLAG(O_FP8AG, "fp8-all-gather",
         "torchao's float8 FSDP all-gather recipe (fp8, FSDP2/HSDP2)"),
    U64(O_MTP, "mtp", "N", 1, 8,
        "multi-token prediction modules on the last stage (DeepSeek-V3, "
        "Megatron --mtp-num-layers)"),
    SIZE(O_MEMORY, "memory", "usable bytes per GPU (default: the profile)"),
    SIZE(O_HOST_MEM, "host-mem",
         "host RAM per node (default 128 GiB per GPU)"),
    SIZE(O_NETWORK, "network",
         "network bytes/s per GPU per direction between nodes (default "
         "50GB on Hopper-class GPUs, else 25GB)"),
    {.id = O_TOP, .name = "top", .metavar = "N", .type = CLI_ARG_U64,
     .max = VP_CLUSTER_TOP, .only = C_PLAN,
     .help = "alternatives to show, 0 to 10 (default 5)"},
    {.id = O_MAX_GPUS, .name = "max-gpus", .metavar = "N",
     .type = CLI_ARG_U64, .min = 1, .max = MAX_DEGREE, .only = C_PLAN,
     .help = "largest cluster tried when nothing fits (default 65536)"},
    STR(O_EXPORT, "export", "FMT", C_PLAN,
        "write the best plan for an engine instead: deepspeed, megatron, "
        "torchrun (the search keeps to that engine)"),
    STR(O_EXPORT, "to", "FMT", C_EXPORT,
        "deepspeed, megatron or torchrun (required)"),
    STR(O_OUTPUT, "output", "FILE", C_PLAN | C_EXPORT,
        "write the export to FILE"),
    {.id = O_FORMAT, .short_name = 'f', .name = "format", .metavar = "FMT",
     .type = CLI_ARG_ENUM, .choices = PLAN_FORMATS, .what = "format",
     .only = C_PLAN, .help = "table (default) or json"},
    {.id = O_FORMAT, .short_name = 'f', .name = "format", .metavar = "FMT",
     .type = CLI_ARG_ENUM, .choices = COMPARE_FORMATS, .what = "format",
     .only = C_COMPARE, .help = "table (default), csv, json or md"},
    CLI_ROW_GPU_DIR(O_GPU_DIR),
    STR(O_MARGIN, "margin", "F", 0,
        "share of each GPU's memory kept free, as the single-GPU probe keeps "
        "its 5 % (default 0.05; 0 fills the GPU; not applied to --memory)"),
    STR(O_MOE_IMBALANCE, "moe-imbalance", "F", 0,
        "MoE routing, dropless: the busiest expert-parallel rank's tokens "
        "over the balanced share, 1 to 64 (default: the largest measured "
        "at the plan's ep, 1.39 at ep 2 to 2.29 at ep 8 and beyond)"),
    STR(O_MOE_CAPACITY, "moe-capacity", "F", 0,
        "MoE routing, token-dropping: the capacity factor each expert's "
        "buffer holds, 1 to 64 (default: dropless)"),
    STR(O_DAYS, "days", "N", C_COMPARE,
        "also find, per GPU, the fewest GPUs that train on --tokens within N "
        "days (--gpus is then optional)"),
    CLI_HELP_ROW,
};

static void help(FILE *f, unsigned cmd)
{
    static const char *const about[] = {
        [C_PLAN] =
            "Usage: vramplan plan MODEL --gpus N --gpu NAME [OPTIONS]\n"
            "\n"
            "Search every way to train MODEL on N GPUs: precision, engine "
            "and\n"
            "sharding (DDP, Megatron's distributed optimizer, ZeRO 1-3, "
            "FSDP),\n"
            "CPU offload, tensor (and sequence), context, expert and "
            "pipeline\n"
            "parallelism with its schedule, micro-batch and accumulation, "
            "and\n"
            "activation recomputation. Prints the fastest plan that fits, "
            "the best\n"
            "plan of other layouts and why they lost; when nothing fits, "
            "the\n"
            "smallest power-of-two cluster on which the model fits.\n",
        [C_COMPARE] =
            "Usage: vramplan compare MODEL --gpus N,N... --gpu NAME,... "
            "[OPTIONS]\n"
            "\n"
            "The best plan for each cluster size and GPU: memory per GPU, "
            "tokens/s,\n"
            "MFU, the time and the GPU-hours to train on --tokens.\n",
        [C_EXPORT] =
            "Usage: vramplan export MODEL --gpus N --gpu NAME --to FMT "
            "[OPTIONS]\n"
            "\n"
            "Plan MODEL on N GPUs for one engine and write the plan as the "
            "engine\n"
            "takes it: deepspeed (a DeepSpeed JSON config), megatron "
            "(Megatron-LM\n"
            "pretrain_gpt.py arguments), torchrun (a torchrun command with "
            "Hugging\n"
            "Face Trainer FSDP flags). Degrees and modes can be pinned.\n",
    };
    cli_spec s = {OPTS, sizeof OPTS / sizeof OPTS[0], cmd, 0, NULL, false,
                  NULL};

    fputs(about[cmd], f);
    fputs("\nOptions:\n", f);
    cli_opts_help(f, &s);
    fputs("\nSizes take B, KB, MB, GB, TB or KiB, MiB, GiB, TiB.\n\n", f);
    cli_exit_help(f);
}

static void plan_help(FILE *f) { help(f, C_PLAN); }
static void compare_help(FILE *f) { help(f, C_COMPARE); }
static void export_help(FILE *f) { help(f, C_EXPORT); }

static int bad_value(const char *name, const char *val, const char *what)
{
    return cli_usage_error("invalid value '%s' for --%s: expected %s", val,
                           name, what);
}

/* 1T, 300B, 2.5e12, 1000000 */
static bool parse_tokens(const char *s, double *out)
{
    char *end;
    if (!((s[0] >= '0' && s[0] <= '9') || s[0] == '.'))
        return false;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s)
        return false;
    double mul = 1;
    if (*end) {
        switch (*end) {
        case 'K': mul = 1e3; break;
        case 'M': mul = 1e6; break;
        case 'B': case 'G': mul = 1e9; break;
        case 'T': mul = 1e12; break;
        case 'P': mul = 1e15; break;
        default: return false;
        }
        if (end[1])
            return false;
    }
    *out = v * mul;
    return *out >= 1 && isfinite(*out);
}

/* Split a comma list into items; false when one is empty or too many. */
static bool split_list(const char *s, char items[][64], size_t cap,
                       size_t *n)
{
    *n = 0;
    const char *p = s;
    for (;;) {
        size_t len = strcspn(p, ",");
        if (len == 0 || len >= 64 || *n == cap)
            return false;
        memcpy(items[*n], p, len);
        items[*n][len] = '\0';
        (*n)++;
        if (!p[len])
            return true;
        p += len + 1;
    }
}

/* --gpus and --gpu: one each, or lists for compare. */
static int parse_cluster_lists(const cli_val *v, unsigned cmd, cargs *a)
{
    size_t cap = cmd == C_COMPARE ? MAX_LIST : 1;
    char items[MAX_LIST][64];
    uint64_t u;

    if (v[O_GPUS].given) {
        if (!split_list(v[O_GPUS].text, items, cap, &a->n_gpus))
            return bad_value("gpus", v[O_GPUS].text,
                             cmd == C_COMPARE
                                 ? "a comma-separated list of GPU counts"
                                 : "a GPU count");
        for (size_t k = 0; k < a->n_gpus; k++) {
            char *end;
            errno = 0;
            u = items[k][0] >= '0' && items[k][0] <= '9'
                    ? strtoull(items[k], &end, 10)
                    : 0;
            if (u < 1 || u > MAX_DEGREE || errno || *end)
                return bad_value("gpus", v[O_GPUS].text,
                                 "GPU counts from 1 to 1048576");
            a->gpus[k] = (uint32_t)u;
        }
    }
    if (v[O_GPU].given &&
        !split_list(v[O_GPU].text, a->gpu_names, cap, &a->n_gpu))
        return bad_value("gpu", v[O_GPU].text,
                         cmd == C_COMPARE
                             ? "a comma-separated list of GPU profile names"
                             : "a GPU profile name");
    return -1;
}

/* --precision and --engine: comma lists of names. */
static int parse_search_lists(const cli_val *v, cargs *a)
{
    char items[MAX_LIST][64];
    size_t ni;

    if (v[O_PRECISION].given) {
        if (!split_list(v[O_PRECISION].text, items, MAX_LIST, &ni))
            return bad_value("precision", v[O_PRECISION].text,
                             "a list of bf16, fp16, fp8, fp32");
        for (size_t k = 0; k < ni; k++) {
            vp_dtype d;
            if (strcmp(items[k], "all") == 0)
                for (int j = 0; j < VP_DT__COUNT; j++)
                    a->o.dtypes[j] = true;
            else if (vp_dtype_parse(items[k], &d) == VP_OK)
                a->o.dtypes[d] = true;
            else
                return cli_usage_error("unknown precision '%s' (expected "
                                       "bf16, fp16, fp8, fp32 or all)",
                                       items[k]);
        }
    }
    if (v[O_ENGINE].given) {
        if (!split_list(v[O_ENGINE].text, items, MAX_LIST, &ni))
            return bad_value("engine", v[O_ENGINE].text,
                             "a list of megatron, deepspeed, torch");
        for (size_t k = 0; k < ni; k++) {
            vp_engine e;
            if (vp_engine_parse(items[k], &e) != VP_OK)
                return cli_usage_error("unknown engine '%s' (expected "
                                       "megatron, deepspeed or torch)",
                                       items[k]);
            a->o.engines[e] = true;
        }
    }
    return -1;
}

/* The pinned degrees and modes of the search. */
static int parse_pins(const cli_val *v, cargs *a)
{
    uint32_t *const deg[] = {[O_TP] = &a->o.tp, [O_PP] = &a->o.pp,
                             [O_CP] = &a->o.cp, [O_EP] = &a->o.ep,
                             [O_DP] = &a->o.dp};

    for (int k = O_TP; k <= O_DP; k++)
        if (v[k].given)
            *deg[k] = (uint32_t)v[k].u;
    if (v[O_MICRO_BATCH].given)
        a->o.micro_batch = v[O_MICRO_BATCH].u;
    if (v[O_GLOBAL_BATCH].given)
        a->o.global_batch = v[O_GLOBAL_BATCH].u;
    a->o.no_offload = v[O_NO_OFFLOAD].given;
    if (v[O_TOP].given)
        a->o.top = (uint32_t)v[O_TOP].u;
    if (v[O_RECOMPUTE].given) {
        vp_recompute r;
        if (vp_recompute_parse(v[O_RECOMPUTE].text, &r) != VP_OK)
            return bad_value("recompute", v[O_RECOMPUTE].text,
                             "none, selective or full");
        a->o.recompute = (int)r;
    }
    if (v[O_SHARDING].given) {
        vp_sharding sh;
        if (vp_sharding_parse(v[O_SHARDING].text, &sh) != VP_OK)
            return bad_value("sharding", v[O_SHARDING].text,
                             "a sharding name (see --help)");
        a->o.sharding = (int)sh;
    }
    return -1;
}

/* Pins that contradict each other. */
static int check_pins(const vp_search_opts *o)
{
    if (o->vpp > 1 && o->schedule >= 0 && o->schedule != VP_SCHED_INTERLEAVED)
        return cli_usage_error("--vpp %u needs --schedule interleaved",
                               o->vpp);
    if (o->vpp == 1 && o->schedule == VP_SCHED_INTERLEAVED)
        return cli_usage_error("--schedule interleaved needs --vpp >= 2");
    if (o->sp == 1 && o->tp == 1)
        return cli_usage_error("--sp needs --tp > 1");
    return -1;
}

/* The step-time model's pins: --vpp, --schedule, --sp and --no-sp (the
 * later one wins), the stage layers, the overlap switches, --compile. */
static int parse_step_pins(const cli_val *v, cargs *a)
{
    static const int ids[] = {O_OVERLAP_DP, O_OVERLAP_TP, O_OVERLAP_EP};
    static const char *const names[] = {"overlap-dp", "overlap-tp",
                                        "overlap-ep"};
    vp_search_opts *o = &a->o;
    vp_switch *const sw[] = {&o->overlap_dp, &o->overlap_tp,
                             &o->overlap_ep};

    if (v[O_VPP].given)
        o->vpp = (uint32_t)v[O_VPP].u;
    if (v[O_SCHEDULE].given) {
        vp_schedule sc;
        if (vp_schedule_parse(v[O_SCHEDULE].text, &sc) != VP_OK)
            return bad_value("schedule", v[O_SCHEDULE].text,
                             "1f1b, gpipe, interleaved or dualpipe");
        o->schedule = (int)sc;
    }
    if (v[O_SP].given || v[O_NO_SP].given)
        o->sp = v[O_SP].given &&
                (!v[O_NO_SP].given || v[O_SP].at > v[O_NO_SP].at);
    if (v[O_FIRST_LAYERS].given)
        o->first_layers = (uint32_t)v[O_FIRST_LAYERS].u;
    if (v[O_LAST_LAYERS].given)
        o->last_layers = (uint32_t)v[O_LAST_LAYERS].u;
    for (size_t k = 0; k < sizeof ids / sizeof ids[0]; k++) {
        const cli_val *x = &v[ids[k]];
        if (!x->given)
            continue;
        if (strcmp(x->text, "on") == 0)
            *sw[k] = VP_ON;
        else if (strcmp(x->text, "off") == 0)
            *sw[k] = VP_OFF;
        else
            return bad_value(names[k], x->text, "on or off");
    }
    o->compile = v[O_COMPILE].given;
    o->fp8_gather = v[O_FP8AG].given;
    if (v[O_MTP].given)
        o->mtp = (uint32_t)v[O_MTP].u;
    return check_pins(o);
}

/* A decimal number in the range that `ok` checks; false otherwise. */
static bool parse_real(const char *s, bool (*ok)(double), double *out)
{
    char *end;

    errno = 0;
    double d = strtod(s, &end);
    if (end == s || *end || errno || !isfinite(d) || !ok(d))
        return false;
    *out = d;
    return true;
}

static bool margin_ok(double d) { return d >= 0.0 && d < 1.0; }
static bool days_ok(double d) { return d > 0.0 && d <= 36500.0; }
static bool load_ok(double d) { return d >= 1.0 && d <= 64.0; }

/* --margin, --days and the MoE routing assumption. */
static int parse_shares(const cli_val *v, cargs *a)
{
    if (v[O_MARGIN].given &&
        !parse_real(v[O_MARGIN].text, margin_ok, &a->margin))
        return bad_value("margin", v[O_MARGIN].text,
                         "a share from 0 to below 1, e.g. 0.05");
    if (v[O_DAYS].given && !parse_real(v[O_DAYS].text, days_ok, &a->days))
        return bad_value("days", v[O_DAYS].text, "days above 0, e.g. 30");
    if (v[O_MOE_IMBALANCE].given &&
        !parse_real(v[O_MOE_IMBALANCE].text, load_ok, &a->moe_imbalance))
        return bad_value("moe-imbalance", v[O_MOE_IMBALANCE].text,
                         "a factor from 1 to 64, e.g. 1.25");
    if (v[O_MOE_CAPACITY].given &&
        !parse_real(v[O_MOE_CAPACITY].text, load_ok, &a->moe_capacity))
        return bad_value("moe-capacity", v[O_MOE_CAPACITY].text,
                         "a factor from 1 to 64, e.g. 1.25");
    return -1;
}

/* Sizes (above 0), tokens, the node size, the export. */
static int parse_rest(const cli_val *v, unsigned cmd, cargs *a)
{
    const int sizes[] = {O_MEMORY, O_HOST_MEM, O_NETWORK};
    uint64_t *dst[] = {&a->memory, &a->host_mem, &a->network};
    static const char *const names[] = {"memory", "host-mem", "network"};

    for (int k = 0; k < 3; k++) {
        if (v[sizes[k]].given && v[sizes[k]].u == 0)
            return bad_value(names[k], v[sizes[k]].text,
                             "a size above 0 bytes");
        *dst[k] = v[sizes[k]].u;
    }
    if (v[O_TOKENS].given && !parse_tokens(v[O_TOKENS].text, &a->tokens))
        return bad_value("tokens", v[O_TOKENS].text,
                         "a token count like 1T, 300B or 2e12");
    if (v[O_NODES_OF].given)
        a->per_node = (uint32_t)v[O_NODES_OF].u;
    if (v[O_SEQ].given)
        a->seq = v[O_SEQ].u;
    if (v[O_MAX_GPUS].given)
        a->max_gpus = (uint32_t)v[O_MAX_GPUS].u;
    if (v[O_EXPORT].given) {
        if (vp_export_format_parse(v[O_EXPORT].text, &a->export_fmt) != VP_OK)
            return bad_value(cmd == C_EXPORT ? "to" : "export",
                             v[O_EXPORT].text,
                             "deepspeed, megatron or torchrun");
        a->export_set = true;
    }
    a->output = v[O_OUTPUT].given ? v[O_OUTPUT].text : NULL;
    if (v[O_FORMAT].given)
        a->format = (out_format)v[O_FORMAT].choice;
    if (v[O_GPU_DIR].given)
        cli_set_gpu_dir(v[O_GPU_DIR].text);
    return parse_shares(v, a);
}

/* What every command needs, and the export's engine. */
static int check_args(unsigned cmd, cargs *a)
{
    static const char *const names[] = {[C_PLAN] = "plan",
                                        [C_COMPARE] = "compare",
                                        [C_EXPORT] = "export"};

    if (!a->model)
        return cli_usage_error("%s needs a MODEL file", names[cmd]);
    if (!a->n_gpus && !(cmd == C_COMPARE && a->days > 0))
        return cli_usage_error("--gpus is required");
    if (!a->n_gpu)
        return cli_usage_error("--gpu is required");
    if (cmd == C_EXPORT && !a->export_set)
        return cli_usage_error("export needs --to deepspeed, megatron or "
                               "torchrun");
    if (a->export_set) {
        bool any = false;
        for (int e = 0; e < VP_ENGINE__COUNT; e++)
            any |= a->o.engines[e];
        vp_engine want = vp_export_engine(a->export_fmt);
        if (any && !a->o.engines[want])
            return cli_usage_error("--engine excludes %s, the engine of "
                                   "the export",
                                   vp_engine_name(want));
        memset(a->o.engines, 0, sizeof a->o.engines);
        a->o.engines[want] = true;
    }
    if (a->export_set && a->export_fmt == VP_EXPORT_TORCHRUN) {
        /* the Trainer runs data parallelism only */
        if ((a->o.tp > 1) | (a->o.pp > 1) | (a->o.cp > 1))
            return cli_usage_error("the torchrun export runs data "
                                   "parallelism only (tp = pp = cp = 1)");
        a->o.tp = a->o.pp = a->o.cp = 1;
    }
    return -1;
}

static int parse_args(int argc, char **argv, unsigned cmd, cargs *a)
{
    void (*const helps[])(FILE *) = {[C_PLAN] = plan_help,
                                     [C_COMPARE] = compare_help,
                                     [C_EXPORT] = export_help};
    cli_spec s = {OPTS, sizeof OPTS / sizeof OPTS[0], cmd, 1,
                  "one MODEL only", false, helps[cmd]};
    const cli_val *v = a->args.v;
    int rc;

    memset(a, 0, sizeof *a);
    vp_search_opts_init(&a->o);
    a->per_node = 8;
    a->tokens = 1e12;
    a->max_gpus = DEFAULT_MAX_GPUS;
    a->margin = DEFAULT_MARGIN;
    a->moe_imbalance = 0; /* the measured load (vp_moe_measured_load) */
    if ((rc = cli_args_parse(&s, argc, argv, &a->args)) >= 0 ||
        (rc = parse_cluster_lists(v, cmd, a)) >= 0 ||
        (rc = parse_search_lists(v, a)) >= 0 ||
        (rc = parse_pins(v, a)) >= 0 || (rc = parse_step_pins(v, a)) >= 0 ||
        (rc = parse_rest(v, cmd, a)) >= 0)
        return rc;
    a->model = a->args.n_operands ? a->args.operands[0] : NULL;
    return check_args(cmd, a);
}

/* ------------------------------------------------------------------ */
/* Formatting                                                          */
/* ------------------------------------------------------------------ */

static double gib(uint64_t b) { return (double)b / (double)VP_GiB; }

static const char *si(double v, char *buf, size_t n)
{
    static const char pre[] = " KMBT";
    int k = 0;
    while (v >= 999.95 && k < 4) {
        v /= 1000;
        k++;
    }
    if (k == 0)
        snprintf(buf, n, "%.0f", v);
    else
        snprintf(buf, n, "%.2f%c", v, pre[k]);
    return buf;
}

static const char *duration(double s, char *buf, size_t n)
{
    if (s < 120)
        snprintf(buf, n, "%.1f s", s);
    else if (s < 7200)
        snprintf(buf, n, "%.1f min", s / 60);
    else if (s < 3 * 86400)
        snprintf(buf, n, "%.1f h", s / 3600);
    else
        snprintf(buf, n, "%.1f days", s / 86400);
    return buf;
}


static void par_line(char *buf, size_t n, const vp_par *p)
{
    char sched[40] = "";
    if (p->pp > 1) {
        if (p->schedule == VP_SCHED_INTERLEAVED)
            snprintf(sched, sizeof sched, " (interleaved, %u chunks)",
                     p->vpp);
        else
            snprintf(sched, sizeof sched, " (%s)",
                     vp_schedule_name(p->schedule));
    }
    char stages[48] = "";
    if (p->first_layers || p->last_layers)
        snprintf(stages, sizeof stages, " (layers: first %u, last %u)",
                 p->first_layers, p->last_layers);
    snprintf(buf, n, "dp %u x tp %u%s x pp %u%s%s x cp %u, ep %u", p->dp,
             p->tp, p->sp ? " (sequence parallel)" : "", p->pp, sched,
             stages, p->cp, p->ep);
}

static const char *switch_name(vp_switch w)
{
    return w == VP_ON ? "on" : w == VP_OFF ? "off" : "default";
}

/* The switches of a plan that differ from the engines' defaults. */
static void switches(char *buf, size_t n, const vp_par *p)
{
    const vp_switch sw[] = {p->overlap_dp, p->overlap_tp, p->overlap_ep};
    static const char *const what[] = {"DP", "TP", "EP"};
    size_t k = 0;

    buf[0] = '\0';
    for (size_t i = 0; i < sizeof sw / sizeof sw[0] && k < n; i++)
        if (sw[i] != VP_AUTO)
            k += (size_t)snprintf(buf + k, n - k, ", %s overlap %s", what[i],
                                  switch_name(sw[i]));
    if (p->compile && k < n)
        k += (size_t)snprintf(buf + k, n - k, ", torch.compile");
    if (p->fp8_gather && k < n)
        k += (size_t)snprintf(buf + k, n - k, ", fp8 all-gather");
    if (p->mtp && k < n)
        snprintf(buf + k, n - k, ", %u MTP module%s", p->mtp,
                 p->mtp > 1 ? "s" : "");
}

/* ------------------------------------------------------------------ */
/* Setup shared by the commands                                        */
/* ------------------------------------------------------------------ */

static int load(const cargs *a, vp_model **m, vp_cluster_model **cm)
{
    vp_error err;
    int rc = -1;
    *m = cli_model_load(a->model, &rc);
    if (!*m)
        return rc;
    *cm = vp_cluster_model_new(*m, a->seq, &err);
    if (!*cm) {
        rc = cli_report(&err, NULL);
        vp_model_free(*m);
        *m = NULL;
        return rc;
    }
    return -1;
}

/* The cluster of `gpus` GPUs of profile `gpu`; -1, or the exit status. */
static int cluster_for(const cargs *a, const char *gpu, uint32_t gpus,
                       vp_cluster *c)
{
    vp_hw hw;
    memset(&hw, 0, sizeof hw);
    int rc = cli_gpu_hw(gpu, &hw);
    if (rc >= 0)
        return rc;
    if (hw.memory == 0 && a->memory == 0)
        return cli_usage_error("the GPU profile '%s' gives no memory size; "
                               "pass --memory",
                               gpu);
    vp_cluster_init(c, &hw, gpus, a->per_node);
    if (a->memory)
        c->memory = a->memory;
    else /* the safety margin */
        c->memory -= (uint64_t)((double)c->memory * a->margin);
    c->moe_imbalance = a->moe_imbalance;
    c->moe_capacity = a->moe_capacity;
    if (a->host_mem)
        c->host_mem = a->host_mem;
    if (a->network)
        c->hw.network = (double)a->network;
    return -1;
}

/* ------------------------------------------------------------------ */
/* plan                                                                */
/* ------------------------------------------------------------------ */

static void print_entry_table(FILE *f, const vp_cluster *c,
                              const vp_plan_entry *e)
{
    const vp_par *p = &e->par;
    const vp_cluster_mem *m = &e->mem;
    const vp_cluster_time *t = &e->time;
    char line[160], b1[32];
    par_line(line, sizeof line, p);
    fprintf(f, "  parallelism  %s\n", line);
    fprintf(f, "  batch        micro-batch %" PRIu64 " x %" PRIu64
               " accumulated per replica, global %" PRIu64 "\n",
            p->micro_batch, p->accum, p->micro_batch * p->accum * p->dp);
    fprintf(f, "  precision    %s%s, recompute %s\n", vp_dtype_name(p->dtype),
            p->dtype == VP_DT_FP32 ? "" : " (fp32 master weights)",
            vp_recompute_name(p->recompute));
    char sw[96];
    switches(sw, sizeof sw, p);
    fprintf(f, "  sharding     %s (%s), offload %s%s\n",
            vp_sharding_name(p->sharding),
            vp_engine_name(vp_sharding_engine(p->sharding)),
            vp_offload_name(p->offload), sw);
    if (!e->fits)
        fprintf(f, "  fits         no: %.2f GiB over the %.2f GiB per GPU\n",
                gib(m->total > c->memory ? m->total - c->memory : 0),
                gib(c->memory));
    fprintf(f, "  memory/GPU   %.2f GiB of %.2f GiB on stage %u (%.1f "
               "micro-batches in flight)%s\n",
            gib(m->total), gib(c->memory), m->stage, m->in_flight,
            e->simulated ? ", simulated" : "");
    fprintf(f, "               weights %.2f, gradients %.2f, optimizer "
               "%.2f, buffers %.2f,\n",
            gib(m->weights), gib(m->grads), gib(m->optimizer),
            gib(m->buffers));
    fprintf(f, "               activations %.2f, transient %.2f, "
               "overhead %.2f, NCCL %.2f, context %.2f GiB\n",
            gib(m->activations), gib(m->transient), gib(m->overhead),
            gib(m->nccl), gib(m->context));
    if (m->host)
        fprintf(f, "  host RAM     %.1f GiB per node of %.1f GiB\n",
                gib(m->host), gib(c->host_mem));
    if (t->step > 0) {
        fprintf(f, "  step time    %.3f s: compute %.3f, recompute %.3f, "
                   "bubble %.3f, exposed\n",
                t->step, t->compute, t->recompute, t->bubble);
        fprintf(f, "               (compute and recompute: GEMM %.3f, "
                   "attention %.3f, memory-bound %.3f)\n",
                t->gemm, t->attention, t->memory);
        fprintf(f, "               communication TP %.3f, CP %.3f, EP %.3f, "
                   "PP %.3f, DP %.3f,\n",
                t->tp_comm, t->cp_comm, t->ep_comm, t->pp_comm, t->dp_comm);
        fprintf(f, "               optimizer %.3f, offload %.3f\n",
                t->optimizer, t->offload);
        fprintf(f, "  throughput   %s tokens/s, %.2f samples/s, MFU %.1f%% "
                   "(at most %.1f%% on this GPU), HFU %.1f%%\n",
                cli_commas((uint64_t)llround(t->tokens_per_s), b1, sizeof b1),
                t->samples_per_s, 100 * t->mfu, 100 * t->mfu_bound,
                100 * t->hfu);
    }
}

static json_t *json_par(const vp_par *p, const vp_plan_entry *e)
{
    json_t *o = json_object();

    cli_jset(o, "dp", cli_ju64(p->dp));
    cli_jset(o, "tp", cli_ju64(p->tp));
    cli_jset(o, "pp", cli_ju64(p->pp));
    cli_jset(o, "cp", cli_ju64(p->cp));
    cli_jset(o, "ep", cli_ju64(p->ep));
    cli_jset(o, "sp", json_boolean(p->sp));
    cli_jset(o, "schedule", json_string(vp_schedule_name(p->schedule)));
    cli_jset(o, "vpp", cli_ju64(p->vpp));
    cli_jset(o, "micro_batch", cli_ju64(p->micro_batch));
    cli_jset(o, "accum", cli_ju64(p->accum));
    cli_jset(o, "precision", json_string(vp_dtype_name(p->dtype)));
    cli_jset(o, "recompute", json_string(vp_recompute_name(p->recompute)));
    cli_jset(o, "sharding", json_string(vp_sharding_name(p->sharding)));
    cli_jset(o, "engine",
             json_string(vp_engine_name(vp_sharding_engine(p->sharding))));
    cli_jset(o, "offload", json_string(vp_offload_name(p->offload)));
    cli_jset(o, "fits", json_boolean(e->fits));
    cli_jset(o, "memory_simulated", json_boolean(e->simulated));
    cli_jset(o, "first_stage_layers", cli_ju64(p->first_layers));
    cli_jset(o, "last_stage_layers", cli_ju64(p->last_layers));
    cli_jset(o, "overlap_dp", json_string(switch_name(p->overlap_dp)));
    cli_jset(o, "overlap_tp", json_string(switch_name(p->overlap_tp)));
    cli_jset(o, "overlap_ep", json_string(switch_name(p->overlap_ep)));
    cli_jset(o, "compile", json_boolean(p->compile));
    if (p->fp8_gather) /* only when set, as mtp */
        cli_jset(o, "fp8_all_gather", json_true());
    if (p->mtp) /* only when set: the schema of plans without it stands */
        cli_jset(o, "mtp", cli_ju64(p->mtp));
    return o;
}

/* An object of named figures: whole numbers (fmt NULL; exact below 2^53)
 * or reals rounded as fmt prints them. */
typedef struct figure {
    const char *key;
    double v;
} figure;

static json_t *json_figures(const figure *f, size_t n, const char *fmt)
{
    json_t *o = json_object();

    for (size_t i = 0; i < n; i++)
        cli_jset(o, f[i].key, fmt ? cli_jreal(f[i].v, fmt)
                                  : cli_ju64((uint64_t)f[i].v));
    return o;
}

static json_t *json_mem(const vp_cluster_mem *m)
{
    const figure b[] = {
        {"total", (double)m->total},       {"weights", (double)m->weights},
        {"grads", (double)m->grads},       {"optimizer", (double)m->optimizer},
        {"buffers", (double)m->buffers},   {"activations", (double)m->activations},
        {"transient", (double)m->transient}, {"overhead", (double)m->overhead},
        {"nccl", (double)m->nccl},         {"context", (double)m->context},
        {"host_per_node", (double)m->host}, {"stage", (double)m->stage}};
    json_t *o = json_figures(b, sizeof b / sizeof b[0], NULL);

    cli_jset(o, "in_flight", cli_jreal(m->in_flight, "%.4g"));
    return o;
}

static json_t *json_time(const vp_cluster_time *t)
{
    const figure s[] = {
        {"step", t->step},           {"compute", t->compute},
        {"recompute", t->recompute}, {"tp_comm", t->tp_comm},
        {"cp_comm", t->cp_comm},     {"ep_comm", t->ep_comm},
        {"pp_comm", t->pp_comm},     {"bubble", t->bubble},
        {"dp_comm", t->dp_comm},     {"optimizer", t->optimizer},
        {"offload", t->offload},     {"tokens_per_s", t->tokens_per_s},
        {"samples_per_s", t->samples_per_s}};
    const figure split[] = {{"gemm", t->gemm},
                            {"attention", t->attention},
                            {"memory_bound", t->memory}};
    json_t *o = json_figures(s, sizeof s / sizeof s[0], "%.6g");

    cli_jset(o, "mfu", cli_jreal(t->mfu, "%.4f"));
    cli_jset(o, "hfu", cli_jreal(t->hfu, "%.4f"));
    cli_jset(o, "mfu_bound", cli_jreal(t->mfu_bound, "%.4f"));
    for (size_t i = 0; i < sizeof split / sizeof split[0]; i++)
        cli_jset(o, split[i].key, cli_jreal(split[i].v, "%.6g"));
    return o;
}

static json_t *json_entry(const vp_plan_entry *e)
{
    json_t *o = json_par(&e->par, e);

    cli_jset(o, "memory", json_mem(&e->mem));
    cli_jset(o, "time", json_time(&e->time));
    cli_jset(o, "reason", cli_jstr(e->reason, sizeof e->reason));
    return o;
}

/* The best plan's memory per GPU under the routing assumption and its
 * bounds: perfectly balanced routing, and every routed pick of the
 * expert-parallel group's tokens on one rank (vp_moe_load). */
typedef struct {
    bool shown;               /* an MoE model with expert parallelism     */
    double load, worst;       /* the assumed and the worst load factors   */
    uint64_t balanced, assumed, worst_total; /* memory per GPU, bytes      */
} moe_bounds;

static vp_status moe_bounds_of(vp_cluster_model *cm, const vp_cluster *c,
                               const vp_cluster_model_info *in,
                               const vp_plan_entry *e, moe_bounds *b)
{
    memset(b, 0, sizeof *b);
    b->load = vp_moe_load(c, in->experts, in->top_k, e->par.ep, &b->worst);
    if (!in->experts || e->par.ep <= 1)
        return VP_OK;
    b->shown = true;
    b->assumed = e->mem.total;
    vp_cluster cb = *c, cw = *c;
    cb.moe_imbalance = 1;
    cb.moe_capacity = 0;
    /* token-dropping: no rank holds more than the capacity */
    cw.moe_imbalance = b->worst;
    if (c->moe_capacity > 0 && c->moe_capacity < b->worst)
        b->worst = c->moe_capacity;
    vp_cluster_mem mb, mw;
    vp_error err;
    vp_status st = vp_cluster_eval(cm, &cb, &e->par, &mb, NULL, &err);
    if (st == VP_OK)
        st = vp_cluster_eval(cm, &cw, &e->par, &mw, NULL, &err);
    if (st != VP_OK)
        return st;
    b->balanced = mb.total;
    b->worst_total = mw.total;
    return VP_OK;
}

static void print_moe_bounds(FILE *o, const vp_cluster *c,
                             const moe_bounds *b, uint32_t ep)
{
    if (!b->shown)
        return;
    if (c->moe_capacity > 0)
        fprintf(o, "  MoE routing  token-dropping, capacity factor %g "
                   "(--moe-capacity): the busiest EP rank %.2fx the "
                   "balanced tokens\n",
                c->moe_capacity, b->load);
    else if (c->moe_imbalance > 0)
        fprintf(o, "  MoE routing  dropless, the busiest EP rank %.2fx the "
                   "balanced tokens (--moe-imbalance %g)\n",
                b->load, c->moe_imbalance);
    else
        fprintf(o, "  MoE routing  dropless, the busiest EP rank %.2fx the "
                   "balanced tokens (the largest measured at ep %u%s; "
                   "--moe-imbalance)\n",
                b->load, ep > 8 ? 8 : ep, ep > 8 ? ", carried over" : "");
    fprintf(o, "               memory/GPU %.2f GiB; balanced %.2f GiB, "
               "worst (%s, %.2fx) %.2f GiB%s\n",
            gib(b->assumed), gib(b->balanced),
            c->moe_capacity > 0 ? "at the capacity" : "all on one rank",
            b->worst, gib(b->worst_total),
            b->worst_total > c->memory ? ": does not fit" : "");
}

static json_t *json_moe_bounds(const vp_cluster *c, const moe_bounds *b)
{
    json_t *o = json_object();
    cli_jset(o, "routing", json_string(c->moe_capacity > 0 ? "capacity"
                                                            : "dropless"));
    cli_jset(o, "imbalance", c->moe_imbalance > 0
                                 ? cli_jreal(c->moe_imbalance, "%g")
                                 : json_string("measured"));
    cli_jset(o, "capacity", cli_jreal(c->moe_capacity, "%g"));
    cli_jset(o, "load", cli_jreal(b->load, "%.4g"));
    cli_jset(o, "worst_load", cli_jreal(b->worst, "%.4g"));
    cli_jset(o, "total", cli_ju64(b->assumed));
    cli_jset(o, "balanced_total", cli_ju64(b->balanced));
    cli_jset(o, "worst_total", cli_ju64(b->worst_total));
    return o;
}

static int print_plan_json(const cargs *a, const vp_cluster *c,
                           const vp_cluster_model_info *in,
                           const vp_cluster_plan *pl, uint32_t min_gpus,
                           const vp_cluster_plan *minpl, const moe_bounds *mb)
{
    json_t *o = json_object(), *alts = json_array();

    cli_jset(o, "model", cli_jstr(a->model, SIZE_MAX));
    cli_jset(o, "name", cli_jstr(in->name, SIZE_MAX));
    cli_jset(o, "params", cli_ju64(in->params));
    cli_jset(o, "seq", cli_ju64(in->seq));
    cli_jset(o, "gpus", cli_ju64(c->gpus));
    cli_jset(o, "gpu", cli_jstr(c->hw.name, sizeof c->hw.name));
    cli_jset(o, "safety_margin", cli_jreal(a->memory ? 0.0 : a->margin, "%g"));
    cli_jset(o, "gpu_memory", cli_ju64(c->memory));
    cli_jset(o, "gpus_per_node", cli_ju64(c->gpus_per_node));
    cli_jset(o, "global_batch", cli_ju64(pl->global_batch));
    cli_jset(o, "evaluated", cli_ju64(pl->evaluated));
    cli_jset(o, "pruned", cli_ju64(pl->pruned));
    cli_jset(o, "fitting", cli_ju64(pl->fitting));
    cli_jset(o, "simulations", cli_ju64(pl->sims));
    cli_jset(o, "fits", json_boolean(pl->found));
    if (pl->found) {
        cli_jset(o, "best", json_entry(&pl->best));
        for (size_t i = 0; i < pl->n_alt; i++)
            cli_jpush(alts, json_entry(&pl->alt[i]));
        cli_jset(o, "alternatives", alts);
        if (mb->shown)
            cli_jset(o, "moe_routing", json_moe_bounds(c, mb));
    } else {
        json_decref(alts);
        cli_jset(o, "closest", json_entry(&pl->closest));
        cli_jset(o, "excess_per_gpu",
                 cli_ju64(pl->closest.mem.total > c->memory
                              ? pl->closest.mem.total - c->memory
                              : 0));
        cli_jset(o, "min_gpus", cli_ju64(min_gpus));
        if (min_gpus && minpl->found)
            cli_jset(o, "best_at_min_gpus", json_entry(&minpl->best));
    }
    return cli_jprint(stdout, o, false);
}

static int write_export(const cargs *a, const vp_cluster_model *cm,
                        const vp_cluster *c, const vp_par *p)
{
    size_t len = 0;
    vp_error err;
    char small[1];
    vp_status st = vp_export_plan(cm, c, p, a->export_fmt, small,
                                  sizeof small, &len, &err);
    if (st != VP_OK)
        return cli_report(&err, NULL);
    char *buf = malloc(len + 1);
    if (!buf)
        return cli_fail("out of memory");
    vp_export_plan(cm, c, p, a->export_fmt, buf, len + 1, &len, &err);
    FILE *f = stdout;
    if (a->output && (f = fopen(a->output, "w")) == NULL) {
        free(buf);
        return cli_fail("cannot open '%s' for writing: %s", a->output,
                        strerror(errno));
    }
    fwrite(buf, 1, len, f);
    free(buf);
    if (a->output) {
        int bad = ferror(f);
        if (fclose(f) != 0 || bad)
            return cli_fail("cannot write '%s'", a->output);
    }
    return CLI_OK;
}

static void print_alternatives(FILE *o, const vp_cluster_plan *pl)
{
    fprintf(o, "\nAlternatives: the best plan of other layouts, and why "
               "they lost\n");
    fprintf(o, "  %4s %3s %3s %3s %3s %-5s %4s %5s %-9s %-21s %-9s %8s %8s"
               "  %s\n",
            "dp", "tp", "pp", "cp", "ep", "sched", "mb", "prec", "recompute",
            "sharding", "offload", "GiB/GPU", "step s", "why");
    for (size_t i = 0; i < pl->n_alt; i++) {
        const vp_plan_entry *e = &pl->alt[i];
        const vp_par *p = &e->par;
        char sch[16];
        if (p->pp == 1)
            snprintf(sch, sizeof sch, "-");
        else if (p->schedule == VP_SCHED_INTERLEAVED)
            snprintf(sch, sizeof sch, "il%u", p->vpp);
        else if (p->schedule == VP_SCHED_DUALPIPE)
            snprintf(sch, sizeof sch, "dual"); /* the column's width */
        else
            snprintf(sch, sizeof sch, "%s", vp_schedule_name(p->schedule));
        fprintf(o, "  %4u %2u%s %3u %3u %3u %-5s %4" PRIu64
                   " %5s %-9s %-21s %-9s %8.2f %8.3f  %s\n",
                p->dp, p->tp, p->sp ? "s" : " ", p->pp, p->cp, p->ep, sch,
                p->micro_batch, vp_dtype_name(p->dtype),
                vp_recompute_name(p->recompute),
                vp_sharding_name(p->sharding),
                p->offload == VP_OFFLOAD_NONE  ? "none"
                : p->offload == VP_OFFLOAD_ALL ? "all"
                                               : "optimizer",
                gib(e->mem.total), e->time.step, e->reason);
    }
}

static void print_nothing_fits(FILE *o, const cargs *a, const vp_cluster *c,
                               const vp_cluster_plan *pl, uint32_t min_gpus,
                               const vp_cluster_plan *minpl)
{
    const vp_plan_entry *e = &pl->closest;
    char line[160];

    par_line(line, sizeof line, &e->par);
    fprintf(o, "\nNothing fits on %u x %s.\n", c->gpus, c->hw.name);
    fprintf(o, "The nearest configuration (%s, %s, recompute %s, %s offload) "
               "needs %.2f GiB per GPU of %.2f",
            line, vp_sharding_name(e->par.sharding),
            vp_recompute_name(e->par.recompute),
            vp_offload_name(e->par.offload), gib(e->mem.total),
            gib(c->memory));
    if (e->mem.host)
        fprintf(o, " and %.1f GiB host RAM per node of %.1f",
                gib(e->mem.host), gib(c->host_mem));
    fprintf(o, ".\n");
    print_entry_table(o, c, e);
    if (min_gpus) {
        fprintf(o, "\nThe smallest cluster that fits (powers of two up to "
                   "%u): %u x %s\n",
                a->max_gpus, min_gpus, c->hw.name);
        vp_cluster c2 = *c;
        c2.gpus = min_gpus;
        print_entry_table(o, &c2, &minpl->best);
    } else {
        fprintf(o, "\nIt fits on no power-of-two cluster up to %u GPUs of "
                   "this kind.\n",
                a->max_gpus);
    }
}

/* The plan as a table, on stderr when an export goes to stdout. */
static void print_plan_table(const cargs *a, const vp_cluster *c,
                             const vp_cluster_model_info *in,
                             const vp_cluster_plan *pl, uint32_t min_gpus,
                             const moe_bounds *mb)
{
    FILE *o = a->export_set ? stderr : stdout;
    char b1[32], b2[32], b3[32], b4[32];

    if (in->whole) {
        fprintf(o, "model        %s (%s): %s parameters, planned whole as "
                   "%" PRIu64 " units, seq %" PRIu64 "\n",
                in->name, a->model, si((double)in->params, b1, sizeof b1),
                in->layers, in->seq);
        fprintf(o, "cluster      %u x %s (%.2f GiB), %u per node; global "
                   "batch %" PRIu64 " samples\n",
                c->gpus, c->hw.name, gib(c->hw.memory), c->gpus_per_node,
                pl[0].global_batch);
    } else {
        fprintf(o, "model        %s (%s): %s parameters, %" PRIu64
                   " layers, seq %" PRIu64 "\n",
                in->name, a->model, si((double)in->params, b1, sizeof b1),
                in->layers, in->seq);
        fprintf(o, "cluster      %u x %s (%.2f GiB), %u per node; global "
                   "batch %" PRIu64 " sequences (%s tokens)\n",
                c->gpus, c->hw.name, gib(c->hw.memory), c->gpus_per_node,
                pl[0].global_batch,
                si((double)pl[0].global_batch * (double)in->seq, b2,
                   sizeof b2));
    }
    if (a->memory)
        fprintf(o, "memory       %.2f GiB usable per GPU (--memory)\n",
                gib(c->memory));
    else
        fprintf(o, "memory       %.2f GiB usable per GPU: %.1f%% kept free "
                   "as a safety margin (--margin %g)\n",
                gib(c->memory), 100.0 * a->margin, a->margin);
    fprintf(o, "search       %s configurations evaluated, %s pruned by the "
               "model-state bound, %s fit; %u simulations\n",
            cli_commas(pl[0].evaluated, b3, sizeof b3),
            cli_commas(pl[0].pruned, b4, sizeof b4),
            cli_commas(pl[0].fitting, b1, sizeof b1), pl[0].sims);
    if (pl[0].found) {
        fprintf(o, "\nBest plan\n");
        print_entry_table(o, c, &pl[0].best);
        print_moe_bounds(o, c, mb, pl[0].best.par.ep);
        if (pl[0].n_alt)
            print_alternatives(o, &pl[0]);
    } else {
        print_nothing_fits(o, a, c, &pl[0], min_gpus, &pl[1]);
    }
}

/* Search the cluster (pl[0]) and, when nothing fits, the smallest one that
 * does (pl[1]). -1, or the exit status. */
static int search(const cargs *a, vp_cluster_model *cm,
                  const vp_cluster *c, vp_cluster_plan *pl,
                  uint32_t *min_gpus)
{
    vp_error err;
    vp_status st = vp_cluster_search(cm, c, &a->o, &pl[0], &err);

    *min_gpus = 0;
    if (st == VP_OK && !pl[0].found)
        st = vp_cluster_min_gpus(cm, c, &a->o, a->max_gpus, min_gpus, &pl[1],
                                 &err);
    if (st == VP_EARG)
        return cli_usage_error("%s", err.msg);
    return st != VP_OK ? cli_report(&err, NULL) : -1;
}

static int run_plan(const cargs *a)
{
    vp_model *m = NULL;
    vp_cluster_model *cm = NULL;
    vp_cluster_plan *pl = NULL;
    vp_cluster_model_info in;
    uint32_t min_gpus = 0;
    vp_cluster c;
    int rc = load(a, &m, &cm);

    if (rc < 0)
        rc = cluster_for(a, a->gpu_names[0], a->gpus[0], &c);
    if (rc < 0 && (pl = calloc(2, sizeof *pl)) == NULL)
        rc = cli_fail("out of memory");
    if (rc < 0)
        rc = search(a, cm, &c, pl, &min_gpus);
    if (rc < 0 && a->export_set && pl[0].found) {
        rc = write_export(a, cm, &c, &pl[0].best.par);
    } else if (rc < 0) {
        moe_bounds mb;
        vp_cluster_model_info_get(cm, &in);
        memset(&mb, 0, sizeof mb);
        if (pl[0].found &&
            moe_bounds_of(cm, &c, &in, &pl[0].best, &mb) != VP_OK)
            mb.shown = false;
        if (a->format == FMT_JSON && !a->export_set)
            rc = print_plan_json(a, &c, &in, &pl[0], min_gpus, &pl[1], &mb);
        else
            print_plan_table(a, &c, &in, pl, min_gpus, &mb);
        if (a->export_set)
            cli_fail("nothing to export: no %s plan fits on %u GPUs",
                     vp_engine_name(vp_export_engine(a->export_fmt)), c.gpus);
        if (rc < 0 || rc == CLI_OK)
            rc = pl[0].found ? CLI_OK : CLI_NOFIT;
    }
    free(pl);
    vp_cluster_model_free(cm);
    vp_model_free(m);
    return rc;
}

int cli_plan_cluster(int argc, char **argv)
{
    cargs a;
    int rc = parse_args(argc, argv, C_PLAN, &a);

    if (rc < 0)
        rc = run_plan(&a);
    cli_args_free(&a.args);
    return rc;
}

int cli_export(int argc, char **argv)
{
    cargs a;
    int rc = parse_args(argc, argv, C_EXPORT, &a);

    if (rc < 0)
        rc = run_plan(&a);
    cli_args_free(&a.args);
    return rc;
}

/* ------------------------------------------------------------------ */
/* compare                                                             */
/* ------------------------------------------------------------------ */

typedef struct cell {
    const char *gpu;
    uint32_t gpus;
    bool found;
    bool fewest; /* --days: the fewest GPUs that finish in time */
    vp_plan_entry e;
    double hours, gpu_hours;
} cell;

static void plan_short(char *buf, size_t n, const vp_par *p)
{
    char il[24] = "";
    if (p->pp > 1 && p->schedule == VP_SCHED_INTERLEAVED)
        snprintf(il, sizeof il, "(il%u)", p->vpp);
    int k = snprintf(buf, n, "%s %s dp%u tp%u%s pp%u%s cp%u ep%u mb%" PRIu64,
                     vp_dtype_name(p->dtype), vp_sharding_name(p->sharding),
                     p->dp, p->tp, p->sp ? "+sp" : "", p->pp, il, p->cp,
                     p->ep, p->micro_batch);
    if (k > 0 && (size_t)k < n && p->recompute != VP_RC_NONE)
        k += snprintf(buf + k, n - (size_t)k, " recompute-%s",
                      vp_recompute_name(p->recompute));
    if (k > 0 && (size_t)k < n && p->offload != VP_OFFLOAD_NONE)
        snprintf(buf + k, n - (size_t)k, " offload-%s",
                 vp_offload_name(p->offload));
}

/* The best plan of one cell, or with `fewest` (--days) the fewest GPUs
 * that finish in time (x->found false: none up to --max-gpus). -1, or
 * the exit status. */
static int compare_cell(const cargs *a, vp_cluster_model *cm, cell *x,
                        vp_cluster_plan *pl, bool fewest, uint64_t *gb)
{
    vp_cluster c;
    vp_error err;
    vp_status st;
    int rc = cluster_for(a, x->gpu, fewest ? 1 : x->gpus, &c);

    if (rc >= 0)
        return rc;
    if (fewest)
        st = vp_cluster_gpus_for_time(cm, &c, &a->o, a->tokens,
                                      a->days * 86400.0, a->max_gpus,
                                      &x->gpus, pl, &err);
    else
        st = vp_cluster_search(cm, &c, &a->o, pl, &err);
    if (st == VP_EARG && !fewest)
        return -1; /* no layout at this size: reported as such */
    if (st != VP_OK)
        return cli_report(&err, NULL);
    x->fewest = fewest;
    x->found = pl->found && (!fewest || x->gpus);
    if (!fewest || x->found)
        *gb = pl->global_batch;
    if (x->found) {
        x->e = pl->best;
        x->hours = a->tokens / pl->best.time.tokens_per_s / 3600.0;
        x->gpu_hours = x->hours * x->gpus;
    }
    return -1;
}

/* Every GPU and cluster size, then with --days the fewest GPUs of each
 * GPU, into cells (nc + nf of them); *gb the global batch. -1, or the exit
 * status. */
static int compare_cells(cargs *a, vp_cluster_model *cm, cell *cells,
                         size_t nc, size_t nf, uint64_t *gb)
{
    vp_cluster_plan *pl = malloc(sizeof *pl);
    int rc = pl != NULL ? -1 : cli_fail("out of memory");

    a->o.top = 0;
    for (size_t i = 0; i < nc + nf && rc < 0; i++) {
        cell *x = &cells[i];
        x->gpu = a->gpu_names[i < nc ? i / a->n_gpus : i - nc];
        x->gpus = i < nc ? a->gpus[i % a->n_gpus] : 0;
        rc = compare_cell(a, cm, x, pl, i >= nc, gb);
    }
    free(pl);
    return rc;
}

static json_t *compare_json_cell(const cell *x)
{
    json_t *c = json_object();

    cli_jset(c, "gpu", cli_jstr(x->gpu, SIZE_MAX));
    cli_jset(c, "gpus", cli_ju64(x->gpus));
    cli_jset(c, "fits", json_boolean(x->found));
    if (x->found) {
        cli_jset(c, "hours", cli_jreal(x->hours, "%.6g"));
        cli_jset(c, "gpu_hours", cli_jreal(x->gpu_hours, "%.6g"));
        cli_jset(c, "plan", json_entry(&x->e));
    }
    return c;
}

static int compare_json(const cargs *a, const vp_cluster_model_info *in,
                        uint64_t gb, const cell *cells, size_t nc, size_t nf)
{
    json_t *o = json_object(), *arr = json_array();

    cli_jset(o, "model", cli_jstr(a->model, SIZE_MAX));
    cli_jset(o, "params", cli_ju64(in->params));
    cli_jset(o, "seq", cli_ju64(in->seq));
    cli_jset(o, "global_batch", gb ? cli_ju64(gb) : json_null());
    cli_jset(o, "tokens", cli_jreal(a->tokens, "%.6g"));
    cli_jset(o, "safety_margin", cli_jreal(a->memory ? 0.0 : a->margin, "%g"));
    for (size_t i = 0; i < nc; i++)
        cli_jpush(arr, compare_json_cell(&cells[i]));
    cli_jset(o, "cells", arr);
    if (nf > 0) {
        json_t *few = json_array();
        cli_jset(o, "days", cli_jreal(a->days, "%g"));
        for (size_t i = nc; i < nc + nf; i++)
            cli_jpush(few, compare_json_cell(&cells[i]));
        cli_jset(o, "fewest_for_days", few);
    }
    return cli_jprint(stdout, o, false);
}

/* One row of the compare table (table, md or csv); `days`: the csv's
 * fewest_for_days column. */
static void compare_row(const cell *x, out_format fmt, bool days)
{
    const char *tail = days ? (x->fewest ? ",true" : ",false") : "";
    char b1[32], b3[32], desc[160];

    if (!x->found && fmt == FMT_CSV)
        printf("%s,%u,false,,,,,,,%s\n", x->gpu, x->gpus, tail);
    else if (!x->found && fmt == FMT_MD)
        printf("| %s | %u | - | - | - | - | - | does not fit |\n", x->gpu,
               x->gpus);
    else if (!x->found)
        printf("%-12s %6u %8s %12s %6s %11s %12s  %s\n", x->gpu, x->gpus,
               "-", "-", "-", "-", "-", "does not fit");
    if (!x->found)
        return;
    plan_short(desc, sizeof desc, &x->e.par);
    if (fmt == FMT_CSV) {
        printf("%s,%u,true,%" PRIu64 ",%.6g,%.4f,%.6g,%.6g,%.6g,%s%s\n",
               x->gpu, x->gpus, x->e.mem.total, x->e.time.tokens_per_s,
               x->e.time.mfu, x->e.time.step, x->hours, x->gpu_hours, desc,
               tail);
        return;
    }
    duration(x->hours * 3600, b3, sizeof b3);
    cli_commas((uint64_t)llround(x->e.time.tokens_per_s), b1, sizeof b1);
    printf(fmt == FMT_MD ? "| %s | %u | %.2f | %s | %.1f%% | %s | %.0f | %s |\n"
                         : "%-12s %6u %8.2f %12s %5.1f%% %11s %12.0f  %s\n",
           x->gpu, x->gpus, gib(x->e.mem.total), b1, 100 * x->e.time.mfu, b3,
           x->gpu_hours, desc);
}

static void compare_csv(const cell *cells, size_t nc, size_t nf)
{
    printf("gpu,gpus,fits,memory_per_gpu,tokens_per_s,mfu,step_s,hours,"
           "gpu_hours,plan%s\n", nf ? ",fewest_for_days" : "");
    for (size_t i = 0; i < nc + nf; i++)
        compare_row(&cells[i], FMT_CSV, nf > 0);
}

static void compare_table(const cargs *a, const vp_cluster_model_info *in,
                          uint64_t gb, const cell *cells, size_t nc,
                          size_t nf)
{
    bool md = a->format == FMT_MD;
    char b1[32], b2[32];

    char gbs[64] = "no global batch (no layout fits)";
    if (gb) /* 0: no cell had a layout to take it from */
        snprintf(gbs, sizeof gbs, "global batch %" PRIu64 " %s", gb,
                 in->whole ? "samples" : "sequences");
    printf("%s%s%s (%s parameters, seq %" PRIu64 "), %s, %s %s\n",
           md ? "**" : "", in->name, md ? "**" : "",
           si((double)in->params, b1, sizeof b1), in->seq, gbs,
           si(a->tokens, b2, sizeof b2), in->whole ? "samples" : "tokens");
    if (a->memory)
        printf("GPU memory: --memory %.2f GiB per GPU\n\n", gib(a->memory));
    else
        printf("GPU memory: %.1f%% of each GPU kept free as a safety margin "
               "(--margin %g)\n\n", 100.0 * a->margin, a->margin);
    for (int part = 0; part < 2; part++) {
        size_t first = part ? nc : 0, n = part ? nf : nc;
        if (n == 0)
            continue;
        if (part)
            printf("%sFewest GPUs to train on %s tokens within %g days:\n\n",
                   nc ? "\n" : "", si(a->tokens, b2, sizeof b2), a->days);
        if (md)
            printf("| GPU | GPUs | GiB/GPU | tokens/s | MFU | time | "
                   "GPU-hours | plan |\n|---|---:|---:|---:|---:|---:|---:|"
                   "---|\n");
        else
            printf("%-12s %6s %8s %12s %6s %11s %12s  %s\n", "gpu", "gpus",
                   "GiB/GPU", "tokens/s", "MFU", "time", "GPU-hours",
                   "plan");
        for (size_t i = first; i < first + n; i++) {
            if (part && !cells[i].found)
                printf("%-12s none up to %u GPUs finishes in time\n",
                       cells[i].gpu, a->max_gpus);
            else
                compare_row(&cells[i], a->format, false);
        }
    }
}

int cli_compare(int argc, char **argv)
{
    vp_cluster_model *cm = NULL;
    vp_cluster_model_info in;
    vp_model *m = NULL;
    cell *cells = NULL;
    uint64_t gb = 0;
    size_t nc = 0, nf = 0;
    cargs a;
    int rc = parse_args(argc, argv, C_COMPARE, &a);

    if (rc < 0)
        rc = load(&a, &m, &cm);
    if (rc < 0) {
        nc = a.n_gpu * a.n_gpus;
        nf = a.days > 0 ? a.n_gpu : 0;
        if ((cells = calloc(nc + nf + 1, sizeof *cells)) == NULL)
            rc = cli_fail("out of memory");
    }
    if (rc < 0)
        rc = compare_cells(&a, cm, cells, nc, nf, &gb);
    if (rc < 0) {
        vp_cluster_model_info_get(cm, &in);
        if (a.format == FMT_JSON)
            rc = compare_json(&a, &in, gb, cells, nc, nf);
        else if (a.format == FMT_CSV)
            compare_csv(cells, nc, nf);
        else
            compare_table(&a, &in, gb, cells, nc, nf);
        if (rc < 0 || rc == CLI_OK) {
            rc = CLI_NOFIT; /* 0 when some cell has a plan */
            for (size_t i = 0; i < nc + nf; i++)
                if (cells[i].found)
                    rc = CLI_OK;
        }
    }
    free(cells);
    vp_cluster_model_free(cm);
    vp_model_free(m);
    cli_args_free(&a.args);
    return rc;
}
