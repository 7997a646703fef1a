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
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "vramplan/cluster.h"
#include "vramplan/vramplan.h"

enum { EXIT_OK = 0, EXIT_NOFIT = 1, EXIT_USAGE = 2, EXIT_MODEL = 3 };

#define MAX_LIST 16
#define DEFAULT_MAX_GPUS 65536u

/* ------------------------------------------------------------------ */
/* Options                                                             */
/* ------------------------------------------------------------------ */

typedef enum { FMT_TABLE, FMT_JSON, FMT_CSV, FMT_MD } out_format;

typedef struct cargs {
    const char *model;
    const char *gpus_text, *gpu_text;
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
} cargs;

typedef struct opt {
    const char *name;
    const char *arg; /* NULL for a flag */
    unsigned cmds;   /* which commands take it */
    const char *help;
} opt;

enum { C_PLAN = 1, C_COMPARE = 2, C_EXPORT = 4, C_ALL = 7 };

static const opt opts[] = {
    {"gpus", "N", C_PLAN | C_EXPORT, "GPUs in the cluster (required)"},
    {"gpus", "N,N...", C_COMPARE, "cluster sizes to compare (required)"},
    {"gpu", "NAME", C_PLAN | C_EXPORT, "GPU profile, e.g. h100-80g (required)"},
    {"gpu", "NAME,...", C_COMPARE, "GPU profiles to compare (required)"},
    {"nodes-of", "N", C_ALL, "GPUs per node, joined by NVLink (default 8)"},
    {"global-batch", "B", C_ALL,
     "sequences per optimizer step (default: 4M tokens / seq)"},
    {"seq", "S", C_ALL, "sequence length (default: the model's)"},
    {"tokens", "N", C_COMPARE,
     "training tokens for the time and GPU-hours columns, with an optional "
     "K, M, B or T (default 1T)"},
    {"precision", "LIST", C_ALL,
     "precisions to search: bf16, fp16, fp8, fp32, all (default bf16, "
     "or fp16 without bf16, and fp32)"},
    {"engine", "LIST", C_PLAN | C_COMPARE,
     "engines to search: megatron, deepspeed, torch (default all)"},
    {"no-offload", NULL, C_ALL, "leave CPU offload out of the search"},
    {"tp", "N", C_ALL, "pin the tensor-parallel degree"},
    {"pp", "N", C_ALL, "pin the pipeline-parallel degree"},
    {"cp", "N", C_ALL, "pin the context-parallel degree"},
    {"ep", "N", C_ALL, "pin the expert-parallel degree"},
    {"dp", "N", C_ALL, "pin the data-parallel degree"},
    {"micro-batch", "N", C_ALL, "pin the micro-batch"},
    {"recompute", "MODE", C_ALL, "pin recomputation: none, selective, full"},
    {"sharding", "NAME", C_ALL,
     "pin the sharding: ddp, megatron-ddp, distributed-optimizer, zero1, "
     "zero2, zero3, fsdp-full-shard, fsdp-shard-grad-op, fsdp-hybrid-shard"},
    /* pins of the step-time model (issue 13); a block of their own so
     * that they move onto a new option parser as one */
    {"vpp", "N", C_ALL,
     "pin the model chunks per pipeline stage (> 1: interleaved)"},
    {"schedule", "NAME", C_ALL, "pin the pipeline schedule: 1f1b, gpipe, "
                                "interleaved"},
    {"sp", NULL, C_ALL, "pin sequence parallelism on (needs --tp > 1)"},
    {"no-sp", NULL, C_ALL, "pin sequence parallelism off"},
    {"first-stage-layers", "N", C_ALL,
     "layers of the first pipeline stage (Megatron's --decoder-first-"
     "pipeline-num-layers)"},
    {"last-stage-layers", "N", C_ALL,
     "layers of the last pipeline stage (--decoder-last-pipeline-num-"
     "layers)"},
    {"overlap-dp", "on|off", C_ALL,
     "data-parallel communication behind compute (default on)"},
    {"overlap-tp", "on|off", C_ALL,
     "tensor-parallel communication overlap, Megatron --tp-comm-overlap "
     "(default off)"},
    {"overlap-ep", "on|off", C_ALL,
     "expert all-to-alls behind compute (default off)"},
    {"compile", NULL, C_ALL, "torch.compile (PyTorch engine)"},
    {"memory", "SIZE", C_ALL, "usable bytes per GPU (default: the profile)"},
    {"host-mem", "SIZE", C_ALL, "host RAM per node (default 128 GiB per GPU)"},
    {"network", "SIZE", C_ALL,
     "network bytes/s per GPU per direction between nodes (default 50GB "
     "on Hopper-class GPUs, else 25GB)"},
    {"top", "N", C_PLAN, "alternatives to show, 0 to 10 (default 5)"},
    {"max-gpus", "N", C_PLAN,
     "largest cluster tried when nothing fits (default 65536)"},
    {"export", "FMT", C_PLAN,
     "write the best plan for an engine instead: deepspeed, megatron, "
     "torchrun (the search keeps to that engine)"},
    {"to", "FMT", C_EXPORT, "deepspeed, megatron or torchrun (required)"},
    {"output", "FILE", C_PLAN | C_EXPORT, "write the export to FILE"},
    {"format", "FMT", C_PLAN, "table (default) or json"},
    {"format", "FMT", C_COMPARE, "table (default), csv, json or md"},
    {"help", NULL, C_ALL, "show this help"},
};

static void help(FILE *f, unsigned cmd)
{
    if (cmd == C_PLAN)
        fputs("Usage: vramplan plan MODEL --gpus N --gpu NAME [OPTIONS]\n"
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
              "smallest power-of-two cluster on which the model fits.\n"
              "\n"
              "Options:\n",
              f);
    else if (cmd == C_COMPARE)
        fputs("Usage: vramplan compare MODEL --gpus N,N... --gpu NAME,... "
              "[OPTIONS]\n"
              "\n"
              "The best plan for each cluster size and GPU: memory per GPU, "
              "tokens/s,\n"
              "MFU, the time and the GPU-hours to train on --tokens.\n"
              "\n"
              "Options:\n",
              f);
    else
        fputs("Usage: vramplan export MODEL --gpus N --gpu NAME --to FMT "
              "[OPTIONS]\n"
              "\n"
              "Plan MODEL on N GPUs for one engine and write the plan as the "
              "engine\n"
              "takes it: deepspeed (a DeepSpeed JSON config), megatron "
              "(Megatron-LM\n"
              "pretrain_gpt.py arguments), torchrun (a torchrun command with "
              "Hugging\n"
              "Face Trainer FSDP flags). Degrees and modes can be pinned.\n"
              "\n"
              "Options:\n",
              f);
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) {
        if (!(opts[i].cmds & cmd))
            continue;
        char left[48];
        snprintf(left, sizeof left, "--%s%s%s", opts[i].name,
                 opts[i].arg ? " " : "", opts[i].arg ? opts[i].arg : "");
        fprintf(f, "  %-24s %s\n", left, opts[i].help);
    }
    fputs("\nSizes take B, KB, MB, GB, TB or KiB, MiB, GiB, TiB.\n"
          "\nExit status:\n"
          "  0  a plan fits\n"
          "  1  nothing fits on the cluster\n"
          "  2  usage, I/O or system error\n"
          "  3  invalid model description\n",
          f);
}

static bool parse_u64(const char *text, uint64_t min, uint64_t max,
                      uint64_t *out)
{
    char *end;
    if (text[0] < '0' || text[0] > '9')
        return false;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno || *end || v < min || v > max)
        return false;
    *out = v;
    return true;
}

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

/* The step-time pins (--vpp ... --compile); -1 when n is not one. */
static int parse_pin(const char *n, const char *val, cargs *a)
{
    uint64_t v;
    vp_search_opts *o = &a->o;
    if (strcmp(n, "vpp") == 0) {
        if (!parse_u64(val, 1, 1024, &v))
            return bad_value(n, val, "an integer from 1 to 1024");
        o->vpp = (uint32_t)v;
    } else if (strcmp(n, "schedule") == 0) {
        vp_schedule sc;
        if (vp_schedule_parse(val, &sc) != VP_OK)
            return bad_value(n, val, "1f1b, gpipe or interleaved");
        o->schedule = (int)sc;
    } else if (strcmp(n, "sp") == 0 || strcmp(n, "no-sp") == 0) {
        o->sp = n[0] == 's';
    } else if (strcmp(n, "first-stage-layers") == 0 ||
               strcmp(n, "last-stage-layers") == 0) {
        if (!parse_u64(val, 1, 1u << 20, &v))
            return bad_value(n, val, "an integer from 1 to 1048576");
        *(n[0] == 'f' ? &o->first_layers : &o->last_layers) = (uint32_t)v;
    } else if (strncmp(n, "overlap-", 8) == 0) {
        vp_switch sw;
        if (strcmp(val, "on") == 0)
            sw = VP_ON;
        else if (strcmp(val, "off") == 0)
            sw = VP_OFF;
        else
            return bad_value(n, val, "on or off");
        *(n[8] == 'd' ? &o->overlap_dp
          : n[8] == 't' ? &o->overlap_tp
                        : &o->overlap_ep) = sw;
    } else if (strcmp(n, "compile") == 0) {
        o->compile = true;
    } else {
        return -1;
    }
    return 0;
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

static int parse_args(int argc, char **argv, unsigned cmd, cargs *a)
{
    memset(a, 0, sizeof *a);
    vp_search_opts_init(&a->o);
    a->per_node = 8;
    a->tokens = 1e12;
    a->max_gpus = DEFAULT_MAX_GPUS;
    bool only_operands = false;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!only_operands && strcmp(arg, "--") == 0) {
            only_operands = true;
            continue;
        }
        if (only_operands || arg[0] != '-' || arg[1] == '\0') {
            if (a->model)
                return cli_usage_error("unexpected argument '%s' (one MODEL "
                                       "only)",
                                       arg);
            a->model = arg;
            continue;
        }
        if (strcmp(arg, "-h") == 0)
            arg = "--help";
        if (strncmp(arg, "--", 2) != 0)
            return cli_usage_error("unknown option '%s'", arg);
        const char *name = arg + 2, *eq = strchr(name, '=');
        size_t nlen = eq ? (size_t)(eq - name) : strlen(name);
        const opt *o = NULL;
        for (size_t k = 0; k < sizeof opts / sizeof opts[0]; k++)
            if ((opts[k].cmds & cmd) && strlen(opts[k].name) == nlen &&
                strncmp(opts[k].name, name, nlen) == 0) {
                o = &opts[k];
                break;
            }
        if (!o)
            return cli_usage_error("unknown option '%s'", arg);
        const char *val = NULL;
        if (o->arg) {
            if (eq)
                val = eq + 1;
            else if (i + 1 < argc)
                val = argv[++i];
            else
                return cli_usage_error("option --%s needs a value (%s)",
                                       o->name, o->arg);
        } else if (eq) {
            return cli_usage_error("option --%s takes no value", o->name);
        }
        uint64_t v;
        const char *n = o->name;
        int pr = parse_pin(n, val, a);
        if (pr >= 0) {
            if (pr != 0)
                return pr;
            continue;
        }
        if (strcmp(n, "help") == 0) {
            help(stdout, cmd);
            return EXIT_OK;
        } else if (strcmp(n, "gpus") == 0) {
            char items[MAX_LIST][64];
            if (!split_list(val, items, cmd == C_COMPARE ? MAX_LIST : 1,
                            &a->n_gpus))
                return bad_value(n, val,
                                 cmd == C_COMPARE
                                     ? "a comma-separated list of GPU counts"
                                     : "a GPU count");
            for (size_t k = 0; k < a->n_gpus; k++) {
                if (!parse_u64(items[k], 1, 1u << 20, &v))
                    return bad_value(n, val, "GPU counts from 1 to 1048576");
                a->gpus[k] = (uint32_t)v;
            }
        } else if (strcmp(n, "gpu") == 0) {
            if (!split_list(val, a->gpu_names, cmd == C_COMPARE ? MAX_LIST : 1,
                            &a->n_gpu))
                return bad_value(n, val,
                                 cmd == C_COMPARE ? "a comma-separated list "
                                                    "of GPU profile names"
                                                  : "a GPU profile name");
        } else if (strcmp(n, "nodes-of") == 0) {
            if (!parse_u64(val, 1, 1u << 20, &v))
                return bad_value(n, val, "an integer from 1 to 1048576");
            a->per_node = (uint32_t)v;
        } else if (strcmp(n, "global-batch") == 0) {
            if (!parse_u64(val, 1, UINT32_MAX, &a->o.global_batch))
                return bad_value(n, val, "an integer >= 1");
        } else if (strcmp(n, "seq") == 0) {
            if (!parse_u64(val, 1, UINT32_MAX, &a->seq))
                return bad_value(n, val, "an integer >= 1");
        } else if (strcmp(n, "tokens") == 0) {
            if (!parse_tokens(val, &a->tokens))
                return bad_value(n, val, "a token count like 1T, 300B or "
                                         "2e12");
        } else if (strcmp(n, "precision") == 0) {
            char items[MAX_LIST][64];
            size_t ni;
            if (!split_list(val, items, MAX_LIST, &ni))
                return bad_value(n, val, "a list of bf16, fp16, fp8, fp32");
            for (size_t k = 0; k < ni; k++) {
                vp_dtype d;
                if (strcmp(items[k], "all") == 0) {
                    for (int j = 0; j < VP_DT__COUNT; j++)
                        a->o.dtypes[j] = true;
                } else if (vp_dtype_parse(items[k], &d) == VP_OK) {
                    a->o.dtypes[d] = true;
                } else {
                    return cli_usage_error("unknown precision '%s' "
                                           "(expected bf16, fp16, fp8, fp32 "
                                           "or all)",
                                           items[k]);
                }
            }
        } else if (strcmp(n, "engine") == 0) {
            char items[MAX_LIST][64];
            size_t ni;
            if (!split_list(val, items, MAX_LIST, &ni))
                return bad_value(n, val, "a list of megatron, deepspeed, "
                                         "torch");
            for (size_t k = 0; k < ni; k++) {
                vp_engine e;
                if (vp_engine_parse(items[k], &e) != VP_OK)
                    return cli_usage_error("unknown engine '%s' (expected "
                                           "megatron, deepspeed or torch)",
                                           items[k]);
                a->o.engines[e] = true;
            }
        } else if (strcmp(n, "no-offload") == 0) {
            a->o.no_offload = true;
        } else if (strcmp(n, "tp") == 0 || strcmp(n, "pp") == 0 ||
                   strcmp(n, "cp") == 0 || strcmp(n, "ep") == 0 ||
                   strcmp(n, "dp") == 0) {
            if (!parse_u64(val, 1, 1u << 20, &v))
                return bad_value(n, val, "an integer from 1 to 1048576");
            uint32_t *dst = n[0] == 't' ? &a->o.tp
                            : n[0] == 'p' ? &a->o.pp
                            : n[0] == 'c' ? &a->o.cp
                            : n[0] == 'e' ? &a->o.ep
                                          : &a->o.dp;
            *dst = (uint32_t)v;
        } else if (strcmp(n, "micro-batch") == 0) {
            if (!parse_u64(val, 1, UINT32_MAX, &a->o.micro_batch))
                return bad_value(n, val, "an integer >= 1");
        } else if (strcmp(n, "recompute") == 0) {
            vp_recompute r;
            if (vp_recompute_parse(val, &r) != VP_OK)
                return bad_value(n, val, "none, selective or full");
            a->o.recompute = (int)r;
        } else if (strcmp(n, "sharding") == 0) {
            vp_sharding sh;
            if (vp_sharding_parse(val, &sh) != VP_OK)
                return bad_value(n, val, "a sharding name (see --help)");
            a->o.sharding = (int)sh;
        } else if (strcmp(n, "memory") == 0 || strcmp(n, "host-mem") == 0 ||
                   strcmp(n, "network") == 0) {
            vp_error err;
            uint64_t *dst = n[0] == 'm'   ? &a->memory
                            : n[0] == 'h' ? &a->host_mem
                                          : &a->network;
            if (vp_size_parse(val, dst, &err) != VP_OK)
                return cli_usage_error("--%s: %s", n, err.msg);
            if (*dst == 0)
                return bad_value(n, val, "a size above 0 bytes");
        } else if (strcmp(n, "top") == 0) {
            if (!parse_u64(val, 0, VP_CLUSTER_TOP, &v))
                return bad_value(n, val, "an integer from 0 to 10");
            a->o.top = (uint32_t)v;
        } else if (strcmp(n, "max-gpus") == 0) {
            if (!parse_u64(val, 1, 1u << 20, &v))
                return bad_value(n, val, "an integer from 1 to 1048576");
            a->max_gpus = (uint32_t)v;
        } else if (strcmp(n, "export") == 0 || strcmp(n, "to") == 0) {
            if (vp_export_format_parse(val, &a->export_fmt) != VP_OK)
                return bad_value(n, val, "deepspeed, megatron or torchrun");
            a->export_set = true;
        } else if (strcmp(n, "output") == 0) {
            if (!val[0])
                return cli_usage_error("--output needs a FILE");
            a->output = val;
        } else if (strcmp(n, "format") == 0) {
            if (strcmp(val, "table") == 0)
                a->format = FMT_TABLE;
            else if (strcmp(val, "json") == 0)
                a->format = FMT_JSON;
            else if (cmd == C_COMPARE && strcmp(val, "csv") == 0)
                a->format = FMT_CSV;
            else if (cmd == C_COMPARE && strcmp(val, "md") == 0)
                a->format = FMT_MD;
            else
                return cli_usage_error(
                    "unknown format '%s' (expected %s)", val,
                    cmd == C_COMPARE ? "table, csv, json or md"
                                     : "table or json");
        }
    }
    int pc = check_pins(&a->o);
    if (pc >= 0)
        return pc;
    if (!a->model)
        return cli_usage_error("%s needs a MODEL file",
                               cmd == C_PLAN      ? "plan"
                               : cmd == C_COMPARE ? "compare"
                                                  : "export");
    if (!a->n_gpus)
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
        if (a->export_fmt == VP_EXPORT_TORCHRUN) {
            /* the Trainer runs data parallelism only */
            if ((a->o.tp > 1) | (a->o.pp > 1) | (a->o.cp > 1))
                return cli_usage_error("the torchrun export runs data "
                                       "parallelism only (tp = pp = cp = "
                                       "1)");
            a->o.tp = a->o.pp = a->o.cp = 1;
        }
    }
    return -1;
}

/* ------------------------------------------------------------------ */
/* Errors and formatting                                               */
/* ------------------------------------------------------------------ */

static int model_error(const vp_error *err)
{
    const char *msg = err->msg[0] ? err->msg : vp_strerror(err->code);
    if (err->path[0] && err->line)
        fprintf(stderr, "%s:%" PRIu32 ":%" PRIu32 ": error: %s\n", err->path,
                err->line, err->col, msg);
    else if (err->path[0])
        fprintf(stderr, "%s: error: %s\n", err->path, msg);
    else
        fprintf(stderr, "vramplan: error: %s\n", msg);
    switch (err->code) {
    case VP_ESYNTAX:
    case VP_ESCHEMA:
    case VP_ERANGE:
    case VP_EUNSUPPORTED:
    case VP_ELIMIT:
    case VP_EOVERFLOW:
    case VP_EUNIT:
        return EXIT_MODEL;
    default:
        return EXIT_USAGE;
    }
}

static double gib(uint64_t b) { return (double)b / (double)VP_GiB; }

static const char *commas(uint64_t v, char *buf, size_t n)
{
    char d[32];
    size_t len = (size_t)snprintf(d, sizeof d, "%" PRIu64, v), o = 0;
    for (size_t i = 0; i < len && o + 2 < n; i++) {
        if (i > 0 && (len - i) % 3 == 0)
            buf[o++] = ',';
        buf[o++] = d[i];
    }
    buf[o] = '\0';
    return buf;
}

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

static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
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

/* The switches of a plan that differ from the engines' defaults. */
static void switches(char *buf, size_t n, const vp_par *p)
{
    static const char *const sw[] = {"", "on", "off"};
    size_t k = 0;
    buf[0] = '\0';
    if (p->overlap_dp)
        k += (size_t)snprintf(buf + k, n - k, ", DP overlap %s",
                              sw[p->overlap_dp]);
    if (p->overlap_tp && k < n)
        k += (size_t)snprintf(buf + k, n - k, ", TP overlap %s",
                              sw[p->overlap_tp]);
    if (p->overlap_ep && k < n)
        k += (size_t)snprintf(buf + k, n - k, ", EP overlap %s",
                              sw[p->overlap_ep]);
    if (p->compile && k < n)
        snprintf(buf + k, n - k, ", torch.compile");
}

/* ------------------------------------------------------------------ */
/* Setup shared by the commands                                        */
/* ------------------------------------------------------------------ */

static int load(const cargs *a, vp_model **m, vp_cluster_model **cm)
{
    vp_error err;
    *m = vp_model_load(a->model, &err);
    if (!*m)
        return model_error(&err);
    *cm = vp_cluster_model_new(*m, a->seq, &err);
    if (!*cm) {
        int rc = model_error(&err);
        vp_model_free(*m);
        *m = NULL;
        return rc;
    }
    return -1;
}

static int cluster_for(const cargs *a, const char *gpu, uint32_t gpus,
                       vp_cluster *c)
{
    vp_hw hw;
    memset(&hw, 0, sizeof hw);
    int rc = cli_gpu_hw(gpu, &hw);
    if (rc != 0) /* it printed the error; 3 stays an invalid profile */
        return rc == EXIT_MODEL ? EXIT_MODEL : EXIT_USAGE;
    if (hw.memory == 0 && a->memory == 0)
        return cli_usage_error("the GPU profile '%s' gives no memory size; "
                               "pass --memory",
                               gpu);
    vp_cluster_init(c, &hw, gpus, a->per_node);
    if (a->memory)
        c->memory = a->memory;
    if (a->host_mem)
        c->host_mem = a->host_mem;
    if (a->network)
        c->hw.network = (double)a->network;
    return 0;
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
    char line[160], b1[32], b2[32];
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
               "micro-batches in flight)\n",
            gib(m->total), gib(c->memory), m->stage, m->in_flight);
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
                commas((uint64_t)llround(t->tokens_per_s), b1, sizeof b1),
                t->samples_per_s, 100 * t->mfu, 100 * t->mfu_bound,
                100 * t->hfu);
        (void)b2;
    }
}

static const char *switch_name(vp_switch w)
{
    return w == VP_ON ? "on" : w == VP_OFF ? "off" : "default";
}

static void json_entry(FILE *f, const vp_plan_entry *e)
{
    const vp_par *p = &e->par;
    const vp_cluster_mem *m = &e->mem;
    const vp_cluster_time *t = &e->time;
    fprintf(f, "{\"dp\": %u, \"tp\": %u, \"pp\": %u, \"cp\": %u, \"ep\": %u, "
               "\"sp\": %s, \"schedule\": \"%s\", \"vpp\": %u, "
               "\"micro_batch\": %" PRIu64 ", \"accum\": %" PRIu64
               ", \"precision\": \"%s\", \"recompute\": \"%s\", "
               "\"sharding\": \"%s\", \"engine\": \"%s\", \"offload\": \"%s\", "
               "\"fits\": %s,\n   \"first_stage_layers\": %u, "
               "\"last_stage_layers\": %u, \"overlap_dp\": \"%s\", "
               "\"overlap_tp\": \"%s\", \"overlap_ep\": \"%s\", "
               "\"compile\": %s,\n",
            p->dp, p->tp, p->pp, p->cp, p->ep, p->sp ? "true" : "false",
            vp_schedule_name(p->schedule), p->vpp, p->micro_batch, p->accum,
            vp_dtype_name(p->dtype), vp_recompute_name(p->recompute),
            vp_sharding_name(p->sharding),
            vp_engine_name(vp_sharding_engine(p->sharding)),
            vp_offload_name(p->offload), e->fits ? "true" : "false",
            p->first_layers, p->last_layers, switch_name(p->overlap_dp),
            switch_name(p->overlap_tp), switch_name(p->overlap_ep),
            p->compile ? "true" : "false");
    fprintf(f, "   \"memory\": {\"total\": %" PRIu64 ", \"weights\": %" PRIu64
               ", \"grads\": %" PRIu64 ", \"optimizer\": %" PRIu64
               ", \"buffers\": %" PRIu64 ", \"activations\": %" PRIu64
               ", \"transient\": %" PRIu64 ", \"overhead\": %" PRIu64
               ", \"nccl\": %" PRIu64 ", \"context\": %" PRIu64
               ", \"host_per_node\": %" PRIu64 ", \"stage\": %u, "
               "\"in_flight\": %.4g},\n",
            m->total, m->weights, m->grads, m->optimizer, m->buffers,
            m->activations, m->transient, m->overhead, m->nccl, m->context,
            m->host, m->stage, m->in_flight);
    fprintf(f, "   \"time\": {\"step\": %.6g, \"compute\": %.6g, "
               "\"recompute\": %.6g, \"tp_comm\": %.6g, \"cp_comm\": %.6g, "
               "\"ep_comm\": %.6g, \"pp_comm\": %.6g, \"bubble\": %.6g, "
               "\"dp_comm\": %.6g, \"optimizer\": %.6g, \"offload\": %.6g, "
               "\"tokens_per_s\": %.6g, \"samples_per_s\": %.6g, "
               "\"mfu\": %.4f, \"hfu\": %.4f, \"mfu_bound\": %.4f, "
               "\"gemm\": %.6g, \"attention\": %.6g, \"memory_bound\": "
               "%.6g},\n   \"reason\": ",
            t->step, t->compute, t->recompute, t->tp_comm, t->cp_comm,
            t->ep_comm, t->pp_comm, t->bubble, t->dp_comm, t->optimizer,
            t->offload, t->tokens_per_s, t->samples_per_s, t->mfu, t->hfu,
            t->mfu_bound, t->gemm, t->attention, t->memory);
    json_str(f, e->reason);
    fputc('}', f);
}

static void print_plan_json(FILE *f, const cargs *a, const vp_cluster *c,
                            const vp_cluster_model_info *in,
                            const vp_cluster_plan *pl, uint32_t min_gpus,
                            const vp_cluster_plan *minpl)
{
    fprintf(f, "{\"model\": ");
    json_str(f, a->model);
    fprintf(f, ", \"name\": ");
    json_str(f, in->name);
    fprintf(f, ", \"params\": %" PRIu64 ", \"seq\": %" PRIu64
               ",\n \"gpus\": %u, \"gpu\": ",
            in->params, in->seq, c->gpus);
    json_str(f, c->hw.name);
    fprintf(f, ", \"gpu_memory\": %" PRIu64 ", \"gpus_per_node\": %u, "
               "\"global_batch\": %" PRIu64 ",\n \"evaluated\": %" PRIu64
               ", \"pruned\": %" PRIu64 ", \"fitting\": %" PRIu64
               ", \"simulations\": %u,\n \"fits\": %s",
            c->memory, c->gpus_per_node, pl->global_batch, pl->evaluated,
            pl->pruned, pl->fitting, pl->sims, pl->found ? "true" : "false");
    if (pl->found) {
        fprintf(f, ",\n \"best\": ");
        json_entry(f, &pl->best);
        fprintf(f, ",\n \"alternatives\": [");
        for (size_t i = 0; i < pl->n_alt; i++) {
            fputs(i ? ",\n  " : "\n  ", f);
            json_entry(f, &pl->alt[i]);
        }
        fprintf(f, "]");
    } else {
        fprintf(f, ",\n \"closest\": ");
        json_entry(f, &pl->closest);
        fprintf(f, ",\n \"excess_per_gpu\": %" PRIu64,
                pl->closest.mem.total > c->memory
                    ? pl->closest.mem.total - c->memory
                    : 0);
        fprintf(f, ",\n \"min_gpus\": %u", min_gpus);
        if (min_gpus && minpl->found) {
            fprintf(f, ",\n \"best_at_min_gpus\": ");
            json_entry(f, &minpl->best);
        }
    }
    fprintf(f, "}\n");
}

static int write_export(const cargs *a, const vp_cluster_model *cm,
                        const vp_cluster *c, const vp_par *p)
{
    size_t len = 0;
    vp_error err;
    char small[1];
    vp_status st = vp_export_plan(cm, c, p, a->export_fmt, small,
                                  sizeof small, &len, &err);
    if (st != VP_OK) {
        fprintf(stderr, "vramplan: error: %s\n", err.msg);
        return EXIT_USAGE;
    }
    char *buf = malloc(len + 1);
    if (!buf) {
        fprintf(stderr, "vramplan: error: out of memory\n");
        return EXIT_USAGE;
    }
    vp_export_plan(cm, c, p, a->export_fmt, buf, len + 1, &len, &err);
    FILE *f = stdout;
    if (a->output) {
        f = fopen(a->output, "w");
        if (!f) {
            fprintf(stderr, "vramplan: error: cannot open '%s' for "
                            "writing: %s\n",
                    a->output, strerror(errno));
            free(buf);
            return EXIT_USAGE;
        }
    }
    fwrite(buf, 1, len, f);
    free(buf);
    if (a->output) {
        int bad = ferror(f);
        if (fclose(f) != 0 || bad) {
            fprintf(stderr, "vramplan: error: cannot write '%s'\n",
                    a->output);
            return EXIT_USAGE;
        }
    }
    return EXIT_OK;
}

static int run_plan(const cargs *a, unsigned cmd)
{
    vp_model *m = NULL;
    vp_cluster_model *cm = NULL;
    int rc = load(a, &m, &cm);
    if (rc >= 0)
        return rc;
    vp_cluster c;
    rc = cluster_for(a, a->gpu_names[0], a->gpus[0], &c);
    if (rc != 0)
        goto done;
    vp_cluster_model_info in;
    vp_cluster_model_info_get(cm, &in);
    vp_cluster_plan *pl = calloc(2, sizeof *pl);
    if (!pl) {
        fprintf(stderr, "vramplan: error: out of memory\n");
        rc = EXIT_USAGE;
        goto done;
    }
    vp_error err;
    vp_status st = vp_cluster_search(cm, &c, &a->o, &pl[0], &err);
    uint32_t min_gpus = 0;
    if (st == VP_OK && !pl[0].found)
        st = vp_cluster_min_gpus(cm, &c, &a->o, a->max_gpus, &min_gpus,
                                 &pl[1], &err);
    if (st != VP_OK) {
        rc = st == VP_EARG ? cli_usage_error("%s", err.msg)
                           : model_error(&err);
        free(pl);
        goto done;
    }
    if (a->export_set && pl[0].found) {
        rc = write_export(a, cm, &c, &pl[0].best.par);
        free(pl);
        goto done;
    }
    FILE *f = stdout;
    char b1[32], b2[32], b3[32], b4[32];
    if (a->format == FMT_JSON && !a->export_set) {
        print_plan_json(f, a, &c, &in, &pl[0], min_gpus, &pl[1]);
    } else {
        FILE *o = a->export_set ? stderr : f;
        fprintf(o, "model        %s (%s): %s parameters, %" PRIu64
                   " layers, seq %" PRIu64 "\n",
                in.name, a->model, si((double)in.params, b1, sizeof b1),
                in.layers, in.seq);
        fprintf(o, "cluster      %u x %s (%.2f GiB), %u per node; global "
                   "batch %" PRIu64 " sequences (%s tokens)\n",
                c.gpus, c.hw.name, gib(c.memory), c.gpus_per_node,
                pl[0].global_batch,
                si((double)pl[0].global_batch * (double)in.seq, b2,
                   sizeof b2));
        fprintf(o, "search       %s configurations evaluated, %s pruned by "
                   "the model-state bound, %s fit; %u simulations\n",
                commas(pl[0].evaluated, b3, sizeof b3),
                commas(pl[0].pruned, b4, sizeof b4),
                commas(pl[0].fitting, b1, sizeof b1), pl[0].sims);
        if (pl[0].found) {
            fprintf(o, "\nBest plan\n");
            print_entry_table(o, &c, &pl[0].best);
            if (pl[0].n_alt) {
                fprintf(o, "\nAlternatives: the best plan of other "
                           "layouts, and why they lost\n");
                fprintf(o, "  %4s %3s %3s %3s %3s %-5s %4s %5s %-9s %-21s "
                           "%-9s %8s %8s  %s\n",
                        "dp", "tp", "pp", "cp", "ep", "sched", "mb", "prec",
                        "recompute", "sharding", "offload", "GiB/GPU",
                        "step s", "why");
                for (size_t i = 0; i < pl[0].n_alt; i++) {
                    const vp_plan_entry *e = &pl[0].alt[i];
                    const vp_par *p = &e->par;
                    char sch[16];
                    if (p->pp == 1)
                        snprintf(sch, sizeof sch, "-");
                    else if (p->schedule == VP_SCHED_INTERLEAVED)
                        snprintf(sch, sizeof sch, "il%u", p->vpp);
                    else
                        snprintf(sch, sizeof sch, "%s",
                                 vp_schedule_name(p->schedule));
                    fprintf(o, "  %4u %2u%s %3u %3u %3u %-5s %4" PRIu64
                               " %5s %-9s %-21s %-9s %8.2f %8.3f  %s\n",
                            p->dp, p->tp, p->sp ? "s" : " ", p->pp, p->cp,
                            p->ep, sch, p->micro_batch,
                            vp_dtype_name(p->dtype),
                            vp_recompute_name(p->recompute),
                            vp_sharding_name(p->sharding),
                            p->offload == VP_OFFLOAD_NONE
                                ? "none"
                                : p->offload == VP_OFFLOAD_ALL ? "all"
                                                               : "optimizer",
                            gib(e->mem.total), e->time.step, e->reason);
                }
            }
        } else {
            const vp_plan_entry *e = &pl[0].closest;
            char line[160];
            par_line(line, sizeof line, &e->par);
            fprintf(o, "\nNothing fits on %u x %s.\n", c.gpus, c.hw.name);
            fprintf(o, "The nearest configuration (%s, %s, recompute %s, "
                       "%s offload) needs %.2f GiB per GPU of %.2f",
                    line, vp_sharding_name(e->par.sharding),
                    vp_recompute_name(e->par.recompute),
                    vp_offload_name(e->par.offload), gib(e->mem.total),
                    gib(c.memory));
            if (e->mem.host)
                fprintf(o, " and %.1f GiB host RAM per node of %.1f",
                        gib(e->mem.host), gib(c.host_mem));
            fprintf(o, ".\n");
            print_entry_table(o, &c, e);
            if (min_gpus) {
                fprintf(o, "\nThe smallest cluster that fits (powers of two "
                           "up to %u): %u x %s\n",
                        a->max_gpus, min_gpus, c.hw.name);
                vp_cluster c2 = c;
                c2.gpus = min_gpus;
                print_entry_table(o, &c2, &pl[1].best);
            } else {
                fprintf(o, "\nIt fits on no power-of-two cluster up to %u "
                           "GPUs of this kind.\n",
                        a->max_gpus);
            }
        }
    }
    if (a->export_set && !pl[0].found)
        fprintf(stderr, "vramplan: error: nothing to export: no %s plan "
                        "fits on %u GPUs\n",
                vp_engine_name(vp_export_engine(a->export_fmt)), c.gpus);
    rc = pl[0].found ? EXIT_OK : EXIT_NOFIT;
    (void)cmd;
    free(pl);
done:
    vp_cluster_model_free(cm);
    vp_model_free(m);
    return rc;
}

int cli_plan_cluster(int argc, char **argv)
{
    cargs a;
    int rc = parse_args(argc, argv, C_PLAN, &a);
    return rc >= 0 ? rc : run_plan(&a, C_PLAN);
}

int cli_export(int argc, char **argv)
{
    cargs a;
    int rc = parse_args(argc, argv, C_EXPORT, &a);
    return rc >= 0 ? rc : run_plan(&a, C_EXPORT);
}

/* ------------------------------------------------------------------ */
/* compare                                                             */
/* ------------------------------------------------------------------ */

typedef struct cell {
    const char *gpu;
    uint32_t gpus;
    bool found;
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

int cli_compare(int argc, char **argv)
{
    cargs a;
    int rc = parse_args(argc, argv, C_COMPARE, &a);
    if (rc >= 0)
        return rc;
    vp_model *m = NULL;
    vp_cluster_model *cm = NULL;
    rc = load(&a, &m, &cm);
    if (rc >= 0)
        return rc;
    vp_cluster_model_info in;
    vp_cluster_model_info_get(cm, &in);
    size_t nc = a.n_gpu * a.n_gpus;
    cell *cells = calloc(nc, sizeof *cells);
    vp_cluster_plan *pl = malloc(sizeof *pl);
    if (!cells || !pl) {
        fprintf(stderr, "vramplan: error: out of memory\n");
        rc = EXIT_USAGE;
        goto done;
    }
    a.o.top = 0;
    uint64_t gb = 0;
    for (size_t g = 0; g < a.n_gpu; g++)
        for (size_t k = 0; k < a.n_gpus; k++) {
            cell *x = &cells[g * a.n_gpus + k];
            x->gpu = a.gpu_names[g];
            x->gpus = a.gpus[k];
            vp_cluster c;
            rc = cluster_for(&a, x->gpu, x->gpus, &c);
            if (rc != 0)
                goto done;
            vp_error err;
            vp_status st = vp_cluster_search(cm, &c, &a.o, pl, &err);
            if (st == VP_EARG) {
                continue; /* no layout at this size: reported as such */
            } else if (st != VP_OK) {
                rc = model_error(&err);
                goto done;
            }
            gb = pl->global_batch;
            x->found = pl->found;
            if (pl->found) {
                x->e = pl->best;
                x->hours = a.tokens / pl->best.time.tokens_per_s / 3600.0;
                x->gpu_hours = x->hours * x->gpus;
            }
        }
    char b1[32], b2[32], b3[32], desc[160];
    if (a.format == FMT_JSON) {
        printf("{\"model\": ");
        json_str(stdout, a.model);
        printf(", \"params\": %" PRIu64 ", \"seq\": %" PRIu64
               ", \"global_batch\": %" PRIu64 ", \"tokens\": %.6g,\n "
               "\"cells\": [",
               in.params, in.seq, gb, a.tokens);
        for (size_t i = 0; i < nc; i++) {
            const cell *x = &cells[i];
            printf("%s\n  {\"gpu\": ", i ? "," : "");
            json_str(stdout, x->gpu);
            printf(", \"gpus\": %u, \"fits\": %s", x->gpus,
                   x->found ? "true" : "false");
            if (x->found) {
                printf(", \"hours\": %.6g, \"gpu_hours\": %.6g, \"plan\": ",
                       x->hours, x->gpu_hours);
                json_entry(stdout, &x->e);
            }
            printf("}");
        }
        printf("]}\n");
    } else if (a.format == FMT_CSV) {
        printf("gpu,gpus,fits,memory_per_gpu,tokens_per_s,mfu,step_s,hours,"
               "gpu_hours,plan\n");
        for (size_t i = 0; i < nc; i++) {
            const cell *x = &cells[i];
            if (!x->found) {
                printf("%s,%u,false,,,,,,,\n", x->gpu, x->gpus);
                continue;
            }
            plan_short(desc, sizeof desc, &x->e.par);
            printf("%s,%u,true,%" PRIu64 ",%.6g,%.4f,%.6g,%.6g,%.6g,%s\n",
                   x->gpu, x->gpus, x->e.mem.total, x->e.time.tokens_per_s,
                   x->e.time.mfu, x->e.time.step, x->hours, x->gpu_hours,
                   desc);
        }
    } else {
        bool md = a.format == FMT_MD;
        printf("%s%s%s (%s parameters, seq %" PRIu64 "), global batch %"
               PRIu64 " sequences, %s tokens\n\n",
               md ? "**" : "", in.name, md ? "**" : "",
               si((double)in.params, b1, sizeof b1), in.seq, gb,
               si(a.tokens, b2, sizeof b2));
        if (md)
            printf("| GPU | GPUs | GiB/GPU | tokens/s | MFU | time | "
                   "GPU-hours | plan |\n|---|---:|---:|---:|---:|---:|---:|"
                   "---|\n");
        else
            printf("%-12s %6s %8s %12s %6s %11s %12s  %s\n", "gpu", "gpus",
                   "GiB/GPU", "tokens/s", "MFU", "time", "GPU-hours",
                   "plan");
        for (size_t i = 0; i < nc; i++) {
            const cell *x = &cells[i];
            if (!x->found) {
                if (md)
                    printf("| %s | %u | - | - | - | - | - | does not fit |\n",
                           x->gpu, x->gpus);
                else
                    printf("%-12s %6u %8s %12s %6s %11s %12s  %s\n", x->gpu,
                           x->gpus, "-", "-", "-", "-", "-", "does not fit");
                continue;
            }
            plan_short(desc, sizeof desc, &x->e.par);
            duration(x->hours * 3600, b3, sizeof b3);
            commas((uint64_t)llround(x->e.time.tokens_per_s), b1, sizeof b1);
            if (md)
                printf("| %s | %u | %.2f | %s | %.1f%% | %s | %.0f | %s |\n",
                       x->gpu, x->gpus, gib(x->e.mem.total), b1,
                       100 * x->e.time.mfu, b3, x->gpu_hours, desc);
            else
                printf("%-12s %6u %8.2f %12s %5.1f%% %11s %12.0f  %s\n",
                       x->gpu, x->gpus, gib(x->e.mem.total), b1,
                       100 * x->e.time.mfu, b3, x->gpu_hours, desc);
        }
    }
    rc = EXIT_NOFIT; /* 0 when some cell has a plan */
    for (size_t i = 0; i < nc; i++)
        if (cells[i].found)
            rc = EXIT_OK;
done:
    free(cells);
    free(pl);
    vp_cluster_model_free(cm);
    vp_model_free(m);
    return rc;
}
