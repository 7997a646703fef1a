/* vramplan CLI: the toolkit every command file shares.
 *
 *   args.c    one declarative option parser (cli_args_parse)
 *   report.c  one error printer, one exit-code table (cli_exit)
 *   json.c    JSON output through jansson
 *   resolve.c model and GPU names through the search path, --gpu-dir
 *   gpu_hw.c  GPU profiles
 *   pictures.c, progress.c  estimate --snapshot/--html, the progress line
 *
 * and the commands, one file per group: estimate_cmd.c (estimate, the
 * setup options), search_cmd.c (maxbatch, plan on one GPU, techniques,
 * --checkpoint auto), cluster_cmd.c (plan --gpus, compare, export),
 * validate_cmd.c and fit_cmd.c, probe_cmd.c, watch_cmd.c, replay_cmd.c,
 * calibrate_cmd.c, serve_cmd.c, batching_cmd.c, mig_cmd.c (--gpu-family);
 * main.c holds the command table. */
#ifndef VRAMPLAN_CLI_H
#define VRAMPLAN_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#include "vramplan/vramplan.h"

#if defined(__GNUC__)
#define CLI_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define CLI_PRINTF(f, a)
#endif

#define CLI_PATH_MAX 4096 /* a file name resolved from a model or GPU name */

/* ---- exit status (report.c) ------------------------------------------- */

/* The exit status of every command; README.md "Exit status" and --help
 * (cli_exit_help) document it. */
typedef enum {
    CLI_OK = 0,      /* success: the setup fits; validate: every case is
                        within its bounds                                */
    CLI_NOFIT = 1,   /* does not fit in the memory budget; validate: an
                        error bound is exceeded; watch: the job was
                        stopped at --kill-at                             */
    CLI_USAGE = 2,   /* usage, I/O or system error                       */
    CLI_INPUT = 3,   /* invalid input file: a model, a GPU profile, a
                        case or bounds file, raw calibration output      */
    CLI_TRIAL = 4,   /* probe: a trial failed otherwise or timed out     */
    CLI_CANCEL = 130 /* probe: interrupted                               */
} cli_exit;

/* The "Exit status:" block of --help. */
void cli_exit_help(FILE *f);

/* The exit status for a library status: VP_OK 0, VP_EOOM 1, invalid input
 * (syntax, schema, range, unsupported, limit, overflow, unit) 3, else 2. */
cli_exit cli_exit_for(vp_status st);

/* "vramplan: error: MSG" on stderr; returns CLI_USAGE. */
int cli_fail(const char *fmt, ...) CLI_PRINTF(1, 2);
/* The same and the pointer to --help: a usage error. */
int cli_usage_error(const char *fmt, ...) CLI_PRINTF(1, 2);
/* "vramplan: warning: MSG" on stderr. */
void cli_warn(const char *fmt, ...) CLI_PRINTF(1, 2);

/* Print a library error and return its exit status (cli_exit_for): for an
 * input file, "FILE:LINE:COL: error: MSG" (GCC's form), then the source
 * line (a window of about 200 columns around the column of a longer line,
 * cut with "...") and a caret under the offending token; else "vramplan:
 * error: MSG". `prefix` (may be NULL) goes before MSG ("case ID: "). */
int cli_report(const vp_error *err, const char *prefix);

/* VP_EOOM: "does not fit in the budget of SIZE: why"; returns CLI_NOFIT. */
int cli_report_no_fit(const vp_setup *s, const vp_error *err);

/* ---- options (args.c) ------------------------------------------------- */

typedef enum {
    CLI_ARG_FLAG,   /* no value                                          */
    CLI_ARG_U64,    /* a whole decimal number in [min, max]              */
    CLI_ARG_SIZE,   /* a size with a unit (vp_size_parse)                */
    CLI_ARG_DOUBLE, /* a decimal number (no exponent) in [dmin, dmax]    */
    CLI_ARG_ENUM,   /* one of choices                                    */
    CLI_ARG_STRING  /* any text (non-empty)                              */
} cli_arg_type;

#define CLI_MAX_OPTS 64
#define CLI_OPT_HELP (CLI_MAX_OPTS - 1) /* the id of -h, --help          */

typedef struct cli_opt {
    int id;                     /* < CLI_MAX_OPTS: the index in cli_args.v */
    char short_name;            /* 0: long form only                     */
    const char *name;           /* long name without the dashes          */
    const char *metavar;        /* the value in --help; NULL for a flag  */
    cli_arg_type type;
    uint64_t min, max;          /* CLI_ARG_U64                           */
    double dmin, dmax;          /* CLI_ARG_DOUBLE                        */
    const char *const *choices; /* CLI_ARG_ENUM, NULL-terminated         */
    const char *what;           /* CLI_ARG_ENUM: the noun in messages    */
    bool repeat;                /* may be given again: every value kept  */
    unsigned only;              /* commands that take it (0: all)        */
    const char *help;
} cli_opt;

#define CLI_HELP_ROW                                                        \
    {.id = CLI_OPT_HELP, .short_name = 'h', .name = "help",                 \
     .type = CLI_ARG_FLAG, .help = "show this help and exit"}

/* What the options of one command look like. */
typedef struct cli_spec {
    const cli_opt *opts;
    size_t n_opts;
    unsigned command;        /* which of opts[].only apply (0: all)      */
    size_t max_operands;     /* SIZE_MAX: any number                     */
    const char *extra_hint;  /* why one more operand is an error:
                                "estimate takes one MODEL"               */
    bool rest;               /* "--" ends the options: the rest is a
                                command line (cli_args.rest)             */
    void (*help)(FILE *f);   /* for -h, --help                           */
} cli_spec;

/* One option's value. */
typedef struct cli_val {
    bool given;
    int at;                  /* argv index where it was last given       */
    const char *text;        /* as written (the last one)                */
    uint64_t u;              /* CLI_ARG_U64, CLI_ARG_SIZE                 */
    double d;                /* CLI_ARG_DOUBLE                           */
    int choice;              /* CLI_ARG_ENUM                             */
    const char **list;       /* repeat: every value, n_list of them      */
    size_t n_list;
} cli_val;

typedef struct cli_args {
    cli_val v[CLI_MAX_OPTS]; /* by option id                             */
    const char **operands;
    size_t n_operands;
    char **rest;             /* after "--" when spec->rest               */
    size_t n_rest;
} cli_args;

/* Parse argv[1..argc) (argv[0] is the command's name). Returns -1 to go
 * on; CLI_OK after printing --help; CLI_USAGE after printing a usage error
 * (an unknown option, with a "did you mean", a missing or invalid value).
 * Release *a with cli_args_free in every case. */
int cli_args_parse(const cli_spec *spec, int argc, char **argv,
                   cli_args *a);
void cli_args_free(cli_args *a);

/* The options of a command for --help: "  -b, --batch N   help", wrapped
 * at 79 columns. */
void cli_opts_help(FILE *f, const cli_spec *spec);
/* A command's whole help page: `head` (usage and description, ending with
 * "Options:\n"), the n options of opts (all of them: no command filter),
 * `tail`, then the exit statuses (cli_exit_help). */
void cli_help_page(FILE *f, const char *head, const cli_opt *opts, size_t n,
                   const char *tail);

/* "a, b or c" from a NULL-terminated list, into buf. */
const char *cli_list_words(const char *const *words, char *buf, size_t n);

/* ---- JSON output (json.c) ------------------------------------------------ */

/* Values for an output document. Strings are made valid UTF-8 (a byte
 * that is not becomes U+FFFD); max bounds a fixed-size field. Reals are
 * rounded as printf's `fmt` prints them ("%.6f", "%.4g"), so that the
 * document says what the text output says; non-finite reals are null. */
json_t *cli_jstr(const char *s, size_t max);
json_t *cli_ju64(uint64_t v);
json_t *cli_jreal(double v, const char *fmt);
/* json_object_set_new that remembers an allocation failure for
 * cli_jprint. */
void cli_jset(json_t *obj, const char *key, json_t *v);
void cli_jpush(json_t *arr, json_t *v);
/* Write v (and a newline) to f, indented by 2 when `indent`, and release
 * it. CLI_OK, or CLI_USAGE after printing why. */
int cli_jprint(FILE *f, json_t *v, bool indent);

/* ---- shared by the commands -------------------------------------------- */

/* The training-setup options that estimate, the searches, probe and replay
 * share: the same ids (a command's own start at CLI_O__SETUP), rows and
 * meaning (cli_setup_common). */
enum {
    CLI_O_BATCH, CLI_O_SEQ, CLI_O_PRECISION, CLI_O_OPTIMIZER,
    CLI_O_CHECKPOINT, CLI_O_ACCUM, CLI_O_KEEP_GRADS, CLI_O_ATTENTION,
    CLI_O_STEPS, CLI_O_BUDGET, CLI_O__SETUP
};

extern const char *const cli_precisions[]; /* vp_precision order      */
extern const char *const cli_optimizers[]; /* vp_optimizer order      */
extern const char *const cli_attns[];      /* vp_attn_impl order      */

#define CLI_ROW_BATCH                                                       \
    {.id = CLI_O_BATCH, .short_name = 'b', .name = "batch", .metavar = "N", \
     .type = CLI_ARG_U64, .min = 1, .max = UINT64_MAX,                      \
     .help = "micro-batch size (default 1)"}
#define CLI_ROW_SEQ                                                         \
    {.id = CLI_O_SEQ, .short_name = 's', .name = "seq", .metavar = "N",     \
     .type = CLI_ARG_U64, .min = 1, .max = UINT64_MAX,                      \
     .help = "sequence length or image side (default: the model's)"}
#define CLI_ROW_PRECISION(h)                                                \
    {.id = CLI_O_PRECISION, .short_name = 'p', .name = "precision",         \
     .metavar = "P", .type = CLI_ARG_ENUM, .choices = cli_precisions,       \
     .what = "precision", .help = h}
#define CLI_ROW_OPTIMIZER(h)                                                \
    {.id = CLI_O_OPTIMIZER, .short_name = 'o', .name = "optimizer",         \
     .metavar = "O", .type = CLI_ARG_ENUM, .choices = cli_optimizers,       \
     .what = "optimizer", .help = h}
#define CLI_ROW_CHECKPOINT(h)                                               \
    {.id = CLI_O_CHECKPOINT, .short_name = 'c', .name = "checkpoint",       \
     .metavar = "SPEC", .type = CLI_ARG_STRING, .help = h}
#define CLI_ROW_ACCUM                                                       \
    {.id = CLI_O_ACCUM, .name = "accum", .metavar = "N",                    \
     .type = CLI_ARG_U64, .min = 1, .max = UINT32_MAX,                      \
     .help = "micro-batches per optimizer step (default 1)"}
#define CLI_ROW_KEEP_GRADS                                                  \
    {.id = CLI_O_KEEP_GRADS, .name = "keep-grads", .type = CLI_ARG_FLAG,    \
     .help = "zero_grad(set_to_none=False)"}
#define CLI_ROW_ATTENTION(h)                                                \
    {.id = CLI_O_ATTENTION, .name = "attention", .metavar = "IMPL",         \
     .type = CLI_ARG_ENUM, .choices = cli_attns,                            \
     .what = "attention implementation", .help = h}
#define CLI_ROW_STEPS(h)                                                    \
    {.id = CLI_O_STEPS, .name = "steps", .metavar = "N",                    \
     .type = CLI_ARG_U64, .min = 1, .max = VP_MAX_STEPS, .help = h}
#define CLI_ROW_GPU_DIR(i)                                                  \
    {.id = i, .name = "gpu-dir", .metavar = "DIR", .type = CLI_ARG_STRING,  \
     .help = "directory searched first for --gpu NAME (then "              \
             "$VRAMPLAN_GPU_DIR, the install prefix, the source tree)"}
#define CLI_ROW_BUDGET(h)                                                   \
    {.id = CLI_O_BUDGET, .name = "budget", .metavar = "SIZE",               \
     .type = CLI_ARG_SIZE, .help = h}

/* ---- data-parallel runs (dist_cli.c) ------------------------------------ */

/* estimate's options of a data-parallel run, rows CLI_DIST_ROWS in its
 * table; ids after the setup commands' own (estimate_cmd.c checks that
 * its own end before CLI_O_STRATEGY). */
enum {
    CLI_O_STRATEGY = CLI_O__SETUP + 27, CLI_O_WORLD, CLI_O_SHARD,
    CLI_O_PARAM_DTYPE, CLI_O_REDUCE_DTYPE, CLI_O_BUFFER_DTYPE,
    CLI_O_RESHARD, CLI_O_BUCKET_CAP, CLI_O_STATIC_GRAPH, CLI_O_FIND_UNUSED,
    CLI_O_NO_BCAST_BUFFERS, CLI_O_REBUILD_FREED, CLI_O_OVERLAP_DDP,
    CLI_O_NO_LIMIT_AG, CLI_O_FWD_PREFETCH, CLI_O_BWD_PREFETCH,
    CLI_O_ORIG_PARAMS, CLI_O_CPU_OFFLOAD, CLI_O_DS, CLI_O_TP, CLI_O_PP,
    CLI_O_SCHEDULE, CLI_O_STAGE, CLI_O_NO_LOSS_PARALLEL, CLI_O__DIST_END
};
_Static_assert((int)CLI_O__DIST_END <= CLI_OPT_HELP,
               "the data-parallel options' ids run into --help's");

extern const char *const cli_strategies[]; /* vp_dist_strategy order   */
extern const char *const cli_mp_dtypes[];  /* fp32 bf16 fp16           */
extern const char *const cli_prefetches[]; /* vp_prefetch order        */

#define CLI_DIST_FLAG(i, n, h)                                              \
    {.id = i, .name = n, .type = CLI_ARG_FLAG, .only = CLI_CMD_ESTIMATE,    \
     .help = h}
#define CLI_DIST_ENUM(i, n, ch, w, h)                                       \
    {.id = i, .name = n, .metavar = "DT", .type = CLI_ARG_ENUM,             \
     .choices = ch, .what = w, .only = CLI_CMD_ESTIMATE, .help = h}
#define CLI_DIST_ROWS                                                       \
    {.id = CLI_O_STRATEGY, .name = "strategy", .metavar = "S",              \
     .type = CLI_ARG_ENUM, .choices = cli_strategies,                       \
     .what = "data-parallel strategy", .only = CLI_CMD_ESTIMATE,            \
     .help = "a data-parallel wrapper simulated rank by rank: ddp, "        \
             "ddp-bucket-view, ddp-zero1, fsdp-full, fsdp-grad-op, "        \
             "fsdp-hybrid, fsdp-no-shard, fsdp2, megatron-ddp, "          \
             "megatron-distopt, deepspeed-zero1, deepspeed-zero2, "         \
             "deepspeed-zero3 (default none)"},                             \
    {.id = CLI_O_WORLD, .name = "world", .metavar = "N",                    \
     .type = CLI_ARG_U64, .min = 1, .max = VP_DIST_MAX_WORLD,               \
     .only = CLI_CMD_ESTIMATE,                                              \
     .help = "ranks of the data-parallel group (default 1)"},               \
    {.id = CLI_O_SHARD, .name = "shard", .metavar = "N",                    \
     .type = CLI_ARG_U64, .min = 1, .max = VP_DIST_MAX_WORLD,               \
     .only = CLI_CMD_ESTIMATE,                                              \
     .help = "HSDP: ranks per shard group (mesh [world/N, N]; "             \
             "fsdp-hybrid, fsdp2)"},                                        \
    CLI_DIST_ENUM(CLI_O_PARAM_DTYPE, "param-dtype", cli_mp_dtypes, "dtype", \
                  "FSDP MixedPrecision param_dtype: fp32, bf16, fp16"),     \
    CLI_DIST_ENUM(CLI_O_REDUCE_DTYPE, "reduce-dtype", cli_mp_dtypes,        \
                  "dtype", "FSDP reduce_dtype (default: param_dtype's)"),   \
    CLI_DIST_ENUM(CLI_O_BUFFER_DTYPE, "buffer-dtype", cli_mp_dtypes,        \
                  "dtype", "FSDP1 buffer_dtype"),                           \
    {.id = CLI_O_RESHARD, .name = "reshard-after-forward",                  \
     .metavar = "R", .type = CLI_ARG_STRING, .only = CLI_CMD_ESTIMATE,      \
     .help = "fsdp2: true (default), false, or N ranks to reshard to"},     \
    {.id = CLI_O_BUCKET_CAP, .name = "bucket-cap", .metavar = "SIZE",       \
     .type = CLI_ARG_SIZE, .only = CLI_CMD_ESTIMATE,                        \
     .help = "DDP bucket_cap_mb as a size (default 25MiB)"},                \
    CLI_DIST_FLAG(CLI_O_STATIC_GRAPH, "static-graph", "DDP static_graph"),  \
    CLI_DIST_FLAG(CLI_O_FIND_UNUSED, "find-unused-parameters",              \
                  "DDP find_unused_parameters"),                            \
    CLI_DIST_FLAG(CLI_O_NO_BCAST_BUFFERS, "no-broadcast-buffers",           \
                  "DDP broadcast_buffers=False"),                           \
    CLI_DIST_FLAG(CLI_O_REBUILD_FREED, "rebuild-freed",                     \
                  "DDP: the first step's buckets freed at the rebuild (the "\
                  "default simulates the rank that holds them: the most "   \
                  "loaded)"),                                               \
    CLI_DIST_FLAG(CLI_O_OVERLAP_DDP, "overlap-with-ddp",                    \
                  "ZeroRedundancyOptimizer overlap_with_ddp"),              \
    CLI_DIST_FLAG(CLI_O_NO_LIMIT_AG, "no-limit-all-gathers",                \
                  "FSDP1 limit_all_gathers=False"),                         \
    CLI_DIST_FLAG(CLI_O_FWD_PREFETCH, "forward-prefetch",                   \
                  "FSDP1 forward_prefetch"),                                \
    {.id = CLI_O_BWD_PREFETCH, .name = "backward-prefetch", .metavar = "P", \
     .type = CLI_ARG_ENUM, .choices = cli_prefetches, .what = "prefetch",   \
     .only = CLI_CMD_ESTIMATE,                                              \
     .help = "FSDP1 backward_prefetch: pre (default), post, none"},         \
    CLI_DIST_FLAG(CLI_O_ORIG_PARAMS, "use-orig-params",                     \
                  "FSDP1 use_orig_params"),                                 \
    CLI_DIST_FLAG(CLI_O_CPU_OFFLOAD, "cpu-offload",                         \
                  "fsdp2 CPUOffloadPolicy"),                                \
    {.id = CLI_O_DS, .name = "ds", .metavar = "K=V,...",                    \
     .type = CLI_ARG_STRING, .only = CLI_CMD_ESTIMATE,                      \
     .help = "deepspeed-zero*: zero_optimization knobs by their config "    \
             "names, comma-separated (e.g. "                                \
             "overlap_comm=true,offload_optimizer=cpu)"},                  \
    {.id = CLI_O_TP, .name = "tp", .metavar = "N", .type = CLI_ARG_U64,     \
     .min = 1, .max = 1024, .only = CLI_CMD_ESTIMATE,                       \
     .help = "fsdp2: tensor-parallel degree, torchtitan's apply_tp with "   \
             "sequence-parallel norms (default 1)"},                        \
    {.id = CLI_O_PP, .name = "pp", .metavar = "N", .type = CLI_ARG_U64,     \
     .min = 1, .max = 1024, .only = CLI_CMD_ESTIMATE,                       \
     .help = "fsdp2: pipeline stages, torchtitan's pipeline_llm split "     \
             "(default 1)"},                                                \
    {.id = CLI_O_SCHEDULE, .name = "schedule", .metavar = "NAME",           \
     .type = CLI_ARG_STRING, .only = CLI_CMD_ESTIMATE,                      \
     .help = "fsdp2 with --pp: the pipeline schedule (1f1b)"},              \
    {.id = CLI_O_STAGE, .name = "stage", .metavar = "N",                    \
     .type = CLI_ARG_U64, .min = 0, .max = 1023, .only = CLI_CMD_ESTIMATE,  \
     .help = "fsdp2 with --pp: the stage simulated (default: the most "     \
             "loaded)"},                                                    \
    CLI_DIST_FLAG(CLI_O_NO_LOSS_PARALLEL, "disable-loss-parallel",          \
                  "fsdp2 with --tp: torchtitan's disable_loss_parallel, "   \
                  "the output's logits all-gathered (Replicate) for the "   \
                  "loss")

/* The data-parallel run the options describe, into *d (vp_dist_init'ed
 * first); *set when --strategy names one. -1 to go on, or CLI_USAGE after
 * the error. */
int cli_dist_parse(const cli_val *v, vp_dist *d, bool *set);
/* fsdp2's tensor and pipeline layout (--tp, --pp, --schedule, --stage)
 * into *l: tp = pp = 1 and the worst stage when not given. -1 to go on,
 * or CLI_USAGE after the error. */
int cli_tp_parse(const cli_val *v, const vp_dist *d, vp_tp_layout *l);
/* The layout's line after the roles table, and its keys in the "dist"
 * object. */
void cli_tp_table(FILE *f, const vp_tp_layout *l);
void cli_tp_json(json_t *dist, const vp_tp_layout *l);

/* The roles of a run, for the table (after the setup lines), and as the
 * "dist" object of estimate's JSON. */
void cli_dist_table(FILE *f, const vp_dist *d, const vp_rank_estimate *r,
                    size_t n, size_t worst);
json_t *cli_dist_json(const vp_dist *d, const vp_rank_estimate *r, size_t n,
                      size_t worst);

/* Apply the given setup options to *s, and --budget (a size, more than 0)
 * when `budget`; -1, or CLI_USAGE after the error. */
int cli_setup_common(const cli_val *v, bool budget, vp_setup *s);

/* The setup options of estimate, maxbatch, plan and techniques
 * (estimate_cmd.c). */
typedef struct cli_setup_args {
    cli_args args;
    const char *model_path;
    const char *gpu;        /* --gpu NAME, NULL for none                 */
    const char *budget;     /* --budget as written                       */
    const char *checkpoint; /* spec, NULL for none                       */
    const char *selective;  /* --selective spec, NULL for none           */
    const char *timeline;   /* CSV path, NULL for none                   */
    const char *snapshot;   /* estimate --snapshot FILE, NULL for none   */
    const char *html;       /* estimate --html FILE, NULL for none       */
    int format;             /* CLI_FMT_TABLE, _JSON or _CSV              */
    uint64_t global_batch;  /* --global-batch, 0 when not given          */
    double host_probe_us;   /* --host-probe-us, 0 when not given         */
    bool steps_given, precision_given, optimizer_given;
    vp_setup setup;
    vp_dist dist;           /* estimate's data-parallel run              */
    bool dist_set;          /* --strategy names one                      */
    vp_tp_layout tp;        /* fsdp2's --tp, --pp, --stage (1, 1, worst) */
    char model_buf[CLI_PATH_MAX]; /* MODEL resolved from a name          */
} cli_setup_args;

enum { CLI_FMT_TABLE, CLI_FMT_JSON, CLI_FMT_CSV };
enum { CLI_CMD_ESTIMATE = 1, CLI_CMD_SEARCH = 2 };

/* Parse the setup options of a command (CLI_CMD_ESTIMATE, or
 * CLI_CMD_SEARCH for those with --global-batch); MODEL may be a name
 * (cli_model_path). Returns -1 to go on, or the exit status; release
 * a->args with cli_args_free. */
int cli_setup_parse(int argc, char **argv, unsigned which,
                    void (*help)(FILE *), cli_setup_args *a);
/* --budget SIZE, or a fraction of --gpu's memory ("0.9") that
 * cli_setup_gpu resolves: into a->budget and a->setup.alloc.limit. -1, or
 * CLI_USAGE after the error. */
int cli_setup_budget(cli_setup_args *a, const char *text);
/* "fine-tuning  LoRA r16 ..." (vp_finetune_describe) when the setup
 * fine-tunes (vp_finetune_active); nothing otherwise. */
void cli_finetune_line(FILE *f, const vp_setup *s);
/* Apply --gpu: the hardware profile (*hw, *have_hw), the CUDA context, and
 * the budget (absent: the GPU's memory less the context; a fraction: of
 * the GPU's memory, as set_per_process_memory_fraction takes it). Returns
 * -1 to go on, or the exit status. */
int cli_setup_gpu(cli_setup_args *a, vp_hw *hw, bool *have_hw);
void cli_setup_help(FILE *f, unsigned which);
#define CLI_SIZE_HELP                                                       \
    "Sizes are a number with an optional unit: B, KB, MB, GB, TB (powers\n" \
    "of 1000) or KiB, MiB, GiB, TiB (powers of 1024), e.g. 24GiB, 1.5GB,\n" \
    "'80 GiB'. No unit means bytes.\n"

/* 124439808 -> "124,439,808"; powers of 1000 with a unit ("4.5 PFLOP"). */
const char *cli_commas(uint64_t v, char *buf, size_t n);
const char *cli_si(double v, const char *unit, char *buf, size_t n);

/* The segments a --checkpoint or --selective SPEC names, in a new array
 * (*out, one flag per segment; the caller frees it). Returns -1 to go on,
 * or an exit status after printing why (estimate_cmd.c). */
int cli_select_segments(const vp_graph *graph, const char *spec,
                        const char *option, bool **out);

/* --checkpoint auto (search_cmd.c): choose the checkpointed and selective
 * segments of graph under setup->alloc.limit; print them when `show`.
 * Returns -1 with *ckpt and *sel set (the caller frees them), or an exit
 * status. */
int cli_checkpoint_auto(const vp_model *model, const vp_graph *graph,
                        vp_setup *setup, bool show, bool **ckpt, bool **sel);

/* A GPU profile: a gpus/NAME.yaml name or a profile file (gpu_hw.c).
 * Returns NULL after printing the error; *rc its exit status. */
vp_gpu_profile *cli_gpu_load(const char *name, int *rc);
/* The step-time model's hardware of a profile (bf16 GEMM curve). Returns
 * -1, or the exit status after printing the error. */
int cli_gpu_hw(const char *name, vp_hw *out);

/* ---- named GPU profiles and models (resolve.c) ------------------------ */

/* --gpu-dir DIR: searched first for GPU profile names (NULL: none). */
void cli_set_gpu_dir(const char *dir);
const char *cli_gpu_dir(void);

/* MODEL as given: an existing file or a path is returned as it is; a name
 * (llama-3-8b) is looked up in the search path (resource.h) and its file
 * written to buf. NULL after printing why the name was not found; *rc
 * its exit status. */
const char *cli_model_path(const char *arg, char *buf, size_t size,
                           int *rc);
/* The model MODEL names (cli_model_path), loaded; NULL after printing the
 * error, *rc its exit status. */
vp_model *cli_model_load(const char *arg, int *rc);

/* --gpu NAME: a profile file is returned as it is; a name is looked up in
 * --gpu-dir and the search path into buf. NULL after printing why; *rc
 * its exit status. */
const char *cli_gpu_path(const char *arg, char *buf, size_t size, int *rc);

/* ---- estimate --snapshot and --html (pictures.c) ---------------------- */

typedef struct cli_pictures cli_pictures;

/* Recorders for --snapshot FILE and --html FILE (either may be NULL), in
 * front of `next` (the --timeline writer, may be NULL). Returns -1 to go
 * on (*out is set; close it), or the exit code after printing why. */
int cli_pictures_open(cli_pictures **out, const char *snapshot,
                      const char *html, const vp_setup *setup,
                      vp_sim_event_fn next, void *next_ud);
/* The event callback for vp_simulate (ud: the cli_pictures). */
void cli_pictures_event(const vp_sim_event *ev, void *ud);
/* Write the files after the run; failure: why the run stopped (out of
 * memory), or NULL. Returns -1 or an exit code after printing why. */
int cli_pictures_write(const cli_pictures *p, const char *model,
                       const vp_setup *setup, const vp_estimate *est,
                       const char *failure);
void cli_pictures_close(cli_pictures *p);

/* ---- a progress line for long work (progress.c) ----------------------- */

/* From the first second on, a line on stderr with the simulations run and
 * the seconds spent, when stderr is a terminal (nothing otherwise); stdout
 * is held until cli_progress_end, which erases the line. */
void cli_progress_begin(const char *command);
void cli_progress_end(void);

/* ---- the commands (argv[0] is the command's name) ---------------------- */

int cli_estimate(int argc, char **argv);
int cli_maxbatch(int argc, char **argv);
int cli_plan(int argc, char **argv);
int cli_techniques(int argc, char **argv);
int cli_plan_cluster(int argc, char **argv);
int cli_compare(int argc, char **argv);
int cli_export(int argc, char **argv);
int cli_validate(int argc, char **argv);
int cli_fit(int argc, char **argv);
int cli_watch(int argc, char **argv);
int cli_probe(int argc, char **argv);
int cli_replay(int argc, char **argv);
int cli_calibrate(int argc, char **argv);
int cli_serve(int argc, char **argv);
int cli_batching(int argc, char **argv);
/* maxbatch and plan with --gpu-family: the smallest MIG slice that fits
 * (mig_cmd.c; argv[0] is "maxbatch" or "plan"). */
int cli_mig_maxbatch(int argc, char **argv);
int cli_mig_plan(int argc, char **argv);

/* Try the MIG slices of family with fits(), print the slices tried and the
 * smallest that fits (mig_cmd.c, for serve too). CLI_OK when one fits,
 * CLI_NOFIT when none does, or the exit status of an error. */
int cli_mig_smallest(const char *family, vp_mig_fit_fn fits, void *ud);

#endif
