/* vramplan: the command-line front end.
 *
 * A thin layer over libvramplan: it parses arguments, calls the library,
 * prints the result in one of three formats and turns library errors into
 * GNU-style messages and exit codes. Only this file prints or exits.
 *
 *   vramplan estimate models/gpt2-small.yaml --batch 8 --precision amp-bf16
 *
 * Layout: exit codes and messages, argument scanning, error rendering, the
 * report printers (table, json, csv), then one function per command, the
 * command table and main. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "vramplan/vramplan.h"

/* Exit codes, documented in --help and README.md. */
enum {
    CLI_OK = 0,    /* success: the setup fits                            */
    CLI_NOFIT = 1, /* does not fit in the memory budget                  */
    CLI_USAGE = 2, /* usage, I/O or system error                         */
    CLI_MODEL = 3  /* invalid model description                          */
};

#define EXIT_STATUS_HELP                                                    \
    "Exit status:\n"                                                        \
    "  0  success (the setup fits)\n"                                       \
    "  1  does not fit in the memory budget (--budget)\n"                   \
    "  2  usage, I/O or system error\n"                                     \
    "  3  invalid model description\n"

#define SIZE_HELP                                                           \
    "Sizes are a number with an optional unit: B, KB, MB, GB, TB (powers\n" \
    "of 1000) or KiB, MiB, GiB, TiB (powers of 1024), e.g. 24GiB, 1.5GB,\n" \
    "'80 GiB'. No unit means bytes.\n"

/* ------------------------------------------------------------------ */
/* Messages                                                            */
/* ------------------------------------------------------------------ */

#if defined(__GNUC__)
#define PRINTF_LIKE(f, a) __attribute__((format(printf, f, a)))
#else
#define PRINTF_LIKE(f, a)
#endif

static void verror(const char *fmt, va_list ap)
{
    fputs("vramplan: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
}

/* An error that is not about usage (I/O, memory): message, exit code 2. */
static int fail(const char *fmt, ...) PRINTF_LIKE(1, 2);
static int fail(const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    verror(fmt, ap);
    va_end(ap);
    return CLI_USAGE;
}

/* A usage error: message, the pointer to --help, exit code 2. */
static int usage_error(const char *fmt, ...) PRINTF_LIKE(1, 2);
static int usage_error(const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    verror(fmt, ap);
    va_end(ap);
    fputs("Use vramplan --help for help with command-line options.\n",
          stderr);
    return CLI_USAGE;
}

/* The same, for the commands in other files (cli.h). */
int cli_usage_error(const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    verror(fmt, ap);
    va_end(ap);
    fputs("Use vramplan --help for help with command-line options.\n",
          stderr);
    return CLI_USAGE;
}

/* ------------------------------------------------------------------ */
/* Options                                                             */
/* ------------------------------------------------------------------ */

typedef struct option_spec {
    int id;
    char short_name;  /* 0: long form only                               */
    const char *name; /* long name without the dashes                    */
    const char *arg;  /* name of the value in help, NULL for a flag      */
    const char *help;
} option_spec;

typedef struct arg_scan {
    int argc;
    char **argv;
    int i;            /* next argument                                    */
    bool only_operands; /* after "--"                                     */
} arg_scan;

enum { ARG_END, ARG_OPTION, ARG_OPERAND, ARG_ERROR };

/* The next argument of a command: an option of `specs` (*spec, and *val
 * for options that take a value: "--name VALUE", "--name=VALUE", "-n
 * VALUE"), an operand (*val), the end, or ARG_ERROR once a usage error has
 * been printed. */
static int arg_next(arg_scan *s, const option_spec *specs, size_t n_specs,
                    const option_spec **spec, const char **val)
{
    const char *a, *eq = NULL;
    size_t len;

    *spec = NULL;
    *val = NULL;
    if (s->i >= s->argc)
        return ARG_END;
    a = s->argv[s->i++];
    if (!s->only_operands && strcmp(a, "--") == 0) {
        s->only_operands = true;
        if (s->i >= s->argc)
            return ARG_END;
        a = s->argv[s->i++];
    }
    if (s->only_operands || a[0] != '-' || a[1] == '\0') {
        *val = a;
        return ARG_OPERAND;
    }

    if (a[1] == '-') {
        eq = strchr(a + 2, '=');
        len = eq != NULL ? (size_t)(eq - (a + 2)) : strlen(a + 2);
        for (size_t k = 0; k < n_specs && *spec == NULL; k++)
            if (strlen(specs[k].name) == len &&
                strncmp(specs[k].name, a + 2, len) == 0)
                *spec = &specs[k];
    } else if (a[2] == '\0') {
        for (size_t k = 0; k < n_specs && *spec == NULL; k++)
            if (specs[k].short_name == a[1])
                *spec = &specs[k];
    }
    if (*spec == NULL) {
        usage_error("unknown option '%s'", a);
        return ARG_ERROR;
    }

    if ((*spec)->arg == NULL) {
        if (eq != NULL) {
            usage_error("option --%s takes no value", (*spec)->name);
            return ARG_ERROR;
        }
        return ARG_OPTION;
    }
    if (eq != NULL) {
        *val = eq + 1;
    } else if (s->i < s->argc) {
        *val = s->argv[s->i++];
    } else {
        usage_error("option --%s needs a value (%s)", (*spec)->name,
                    (*spec)->arg);
        return ARG_ERROR;
    }
    return ARG_OPTION;
}

#define HELP_COLUMN 30 /* where option descriptions start             */
#define HELP_WIDTH 79

/* Write text from column HELP_COLUMN, wrapped at spaces to HELP_WIDTH. */
static void help_wrap(FILE *f, const char *text)
{
    const size_t room = HELP_WIDTH - HELP_COLUMN;

    for (;;) {
        size_t len = strlen(text), cut = len;

        if (len > room) {
            cut = room;
            while (cut > 0 && text[cut] != ' ')
                cut--;
            if (cut == 0)
                cut = strcspn(text, " ");
        }
        fprintf(f, "%.*s\n", (int)cut, text);
        text += cut;
        while (*text == ' ')
            text++;
        if (*text == '\0')
            return;
        fprintf(f, "%*s", HELP_COLUMN, "");
    }
}

static void options_help(FILE *f, const option_spec *specs, size_t n)
{
    char left[64];

    for (size_t k = 0; k < n; k++) {
        const option_spec *o = &specs[k];

        snprintf(left, sizeof left, "%c%c%c --%s%s%s",
                 o->short_name ? '-' : ' ',
                 o->short_name ? o->short_name : ' ',
                 o->short_name ? ',' : ' ', o->name, o->arg ? " " : "",
                 o->arg ? o->arg : "");
        if (strlen(left) + 4 > HELP_COLUMN)
            fprintf(f, "  %s\n%*s", left, HELP_COLUMN, "");
        else
            fprintf(f, "  %-*s", HELP_COLUMN - 2, left);
        help_wrap(f, o->help);
    }
}

/* A whole decimal number in [min, max]: digits only (no sign, spaces or
 * exponent), checked with strtoull, errno and the end pointer. */
static bool parse_u64(const char *text, uint64_t min, uint64_t max,
                      uint64_t *out)
{
    unsigned long long v;
    char *end;

    if (text[0] < '0' || text[0] > '9')
        return false;
    errno = 0;
    v = strtoull(text, &end, 10);
    if (errno != 0 || *end != '\0' || v < min || v > max)
        return false;
    *out = (uint64_t)v;
    return true;
}

/* parse_u64 for an option, printing the usage error. */
static bool option_u64(const option_spec *o, const char *text, uint64_t min,
                       uint64_t max, uint64_t *out)
{
    if (parse_u64(text, min, max, out))
        return true;
    if (max == UINT64_MAX)
        usage_error("invalid value '%s' for --%s: expected an integer >= %"
                    PRIu64, text, o->name, min);
    else
        usage_error("invalid value '%s' for --%s: expected an integer from %"
                    PRIu64 " to %" PRIu64, text, o->name, min, max);
    return false;
}

/* vp_size_parse for an option, printing the usage error. */
static bool option_size(const option_spec *o, const char *text,
                        uint64_t *out)
{
    vp_error err;

    if (vp_size_parse(text, out, &err) == VP_OK)
        return true;
    usage_error("--%s: %s", o->name, err.msg);
    return false;
}

/* ------------------------------------------------------------------ */
/* Library errors                                                      */
/* ------------------------------------------------------------------ */

static int exit_code_for(vp_status st)
{
    switch (st) {
    case VP_OK:
        return CLI_OK;
    case VP_EOOM:
        return CLI_NOFIT;
    case VP_ESYNTAX:
    case VP_ESCHEMA:
    case VP_ERANGE:
    case VP_EUNSUPPORTED:
    case VP_ELIMIT:
    case VP_EOVERFLOW:
    case VP_EUNIT:
        return CLI_MODEL;
    default:
        return CLI_USAGE; /* VP_ENOMEM, VP_EIO, VP_EARG */
    }
}

#define SOURCE_LINE_MAX 1024

/* Print line `line` (1-based) of `path` and a caret under columns
 * col..col+width-1, as jq and GCC do. Tabs in the line are kept in the
 * padding so that the caret lines up; UTF-8 sequences count as one
 * column. Prints nothing when the file or line cannot be read. */
static void show_source(const char *path, uint32_t line, uint32_t col,
                        uint32_t width)
{
    char text[SOURCE_LINE_MAX + 1];
    size_t len = 0, i;
    uint32_t at = 1, column = 1;
    FILE *f;
    int c;

    f = fopen(path, "rb");
    if (f == NULL)
        return;
    while (at < line && (c = getc(f)) != EOF)
        if (c == '\n')
            at++;
    while (at == line && (c = getc(f)) != EOF && c != '\n')
        if (len < SOURCE_LINE_MAX)
            text[len++] = (char)c;
    fclose(f);
    if (at != line)
        return;
    if (len > 0 && text[len - 1] == '\r')
        len--;
    text[len] = '\0';
    if (len == 0 && col <= 1)
        return;

    fprintf(stderr, "    %s\n", text);
    if (col == 0)
        return;
    fputs("    ", stderr);
    for (i = 0; column < col; column++) {
        fputc(i < len && text[i] == '\t' ? '\t' : ' ', stderr);
        if (i < len)
            i++;
        while (i < len && ((unsigned char)text[i] & 0xC0) == 0x80)
            i++;
    }
    if (width == 0)
        width = 1;
    if (width > SOURCE_LINE_MAX)
        width = SOURCE_LINE_MAX;
    while (width-- > 0)
        fputc('^', stderr);
    fputc('\n', stderr);
}

/* Print a library error ("path:line:col: error: msg" and the source line,
 * or "vramplan: error: msg") and return its exit code. */
static int report_error(const vp_error *err)
{
    const char *msg = err->msg[0] ? err->msg : vp_strerror(err->code);

    if (err->path[0] == '\0')
        fprintf(stderr, "vramplan: error: %s\n", msg);
    else if (err->line == 0)
        fprintf(stderr, "%s: error: %s\n", err->path, msg);
    else if (err->col == 0)
        fprintf(stderr, "%s:%" PRIu32 ": error: %s\n", err->path, err->line,
                msg);
    else
        fprintf(stderr, "%s:%" PRIu32 ":%" PRIu32 ": error: %s\n", err->path,
                err->line, err->col, msg);
    if (err->path[0] != '\0' && err->line > 0)
        show_source(err->path, err->line, err->col, err->width);
    return err->code == VP_OK ? CLI_USAGE : exit_code_for(err->code);
}

/* ------------------------------------------------------------------ */
/* Reports                                                             */
/* ------------------------------------------------------------------ */

/* What a printer gets: the estimate and what produced it. */
typedef struct report {
    const char *model_path;
    const vp_graph *graph;
    const vp_setup *setup;     /* as simulated; checkpoint resolved      */
    const char *checkpoint;    /* the --checkpoint spec, "none" default  */
    const vp_estimate *est;
} report;

typedef struct printer {
    const char *name;
    void (*print)(FILE *f, const report *r);
} printer;

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

static uint32_t report_steps(const vp_estimate *e)
{
    return e->steps < VP_MAX_STEPS ? e->steps : VP_MAX_STEPS;
}

static uint32_t report_top_layers(const vp_estimate *e)
{
    return e->n_top_layers < VP_TOP_LAYERS ? e->n_top_layers : VP_TOP_LAYERS;
}

/* --- table ---------------------------------------------------------- */

/* 124439808 -> "124,439,808" */
static const char *format_count(uint64_t v, char *buf, size_t n)
{
    char digits[32];
    size_t len, o = 0;

    len = (size_t)snprintf(digits, sizeof digits, "%" PRIu64, v);
    for (size_t i = 0; i < len && o + 1 < n; i++) {
        if (i > 0 && (len - i) % 3 == 0 && o + 2 < n)
            buf[o++] = ',';
        buf[o++] = digits[i];
    }
    buf[o] = '\0';
    return buf;
}

/* Powers of 1000: (124439808, "") -> "124.4M", (4.5e15, "FLOP") ->
 * "4.5 PFLOP", (12, "FLOP") -> "12 FLOP". */
static const char *format_si(double v, const char *unit, char *buf, size_t n)
{
    static const char prefix[] = " kMGTPEZY";
    int k = 0;

    while (v >= 999.95 && k + 1 < (int)sizeof prefix - 1) {
        v /= 1000;
        k++;
    }
    snprintf(buf, n, "%.*f%s%.*s%s", k > 0 ? 1 : 0, v, unit[0] ? " " : "",
             k > 0 ? 1 : 0, &prefix[k], unit);
    return buf;
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

static void print_table(FILE *f, const report *r)
{
    const vp_estimate *e = r->est;
    const vp_setup *s = r->setup;
    char a[32], b[32], c[32];
    uint64_t total = 0;
    size_t width = 24, n_ckpt = 0;

    for (size_t i = 0; i < s->n_checkpoint; i++)
        n_ckpt += s->checkpoint[i];

    fprintf(f, "model        %s (%s)\n", vp_graph_model_name(r->graph),
            r->model_path);
    fprintf(f, "setup        batch %" PRIu64 ", seq %" PRIu64 ", %s, %s%s, "
            "accum %" PRIu32 ", %" PRIu32 " steps\n",
            vp_graph_batch(r->graph), vp_graph_seq(r->graph),
            vp_precision_name(s->precision), vp_optimizer_name(s->optimizer),
            s->inference ? ", inference" : "", s->accum, s->steps);
    fprintf(f, "             zero_grad(set_to_none=%s), attention %s\n",
            s->set_to_none ? "True" : "False",
            s->attn_set ? vp_attn_impl_name(s->attn) : "as in the model");
    fprintf(f, "             checkpoint %s (%zu of %zu segments)\n",
            r->checkpoint, n_ckpt, vp_graph_segment_count(r->graph));
    fprintf(f, "allocator    budget %s, expandable segments %s, cuBLAS "
            "workspace %s\n",
            s->alloc.limit ? vp_size_format(s->alloc.limit, a, sizeof a)
                           : "none",
            s->alloc.expandable_segments ? "on" : "off",
            vp_size_format(s->cublas_workspace, b, sizeof b));
    fprintf(f, "parameters   %s (%s)\n", format_count(e->params, a, sizeof a),
            format_si((double)e->params, "", b, sizeof b));
    fprintf(f, "model state  weights %s, gradients %s, optimizer %s\n",
            vp_size_format(e->param_bytes, a, sizeof a),
            vp_size_format(e->grad_bytes, b, sizeof b),
            vp_size_format(e->optim_bytes, c, sizeof c));
    fprintf(f, "work         %s per step\n",
            format_si(e->flops_per_step, "FLOP", a, sizeof a));

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

    fprintf(f, "\npeak allocated  %11s  max_memory_allocated(), step %"
            PRIu32 " %s\n", vp_size_format(e->peak_alloc, a, sizeof a),
            e->peak_step, vp_phase_name(e->peak_phase));
    fprintf(f, "steady peak     %11s  max_memory_allocated() in the last "
            "step\n", vp_size_format(e->peak_alloc_steady, a, sizeof a));
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

    fprintf(f, "\n%4s %11s %11s %11s %11s %11s %11s\n", "step", "start",
            "fwd peak", "bwd peak", "opt peak", "end", "reserved");
    for (uint32_t i = 0; i < report_steps(e); i++) {
        const vp_phase_peaks *p = &e->step[i];
        char d[32], g[32], h[32];

        fprintf(f, "%4" PRIu32 " %11s %11s %11s %11s %11s %11s\n", i + 1,
                vp_size_format(p->start, a, sizeof a),
                vp_size_format(p->peak[VP_PHASE_FORWARD], b, sizeof b),
                s->inference ? "-"
                    : vp_size_format(p->peak[VP_PHASE_BACKWARD], c, sizeof c),
                s->inference ? "-"
                    : vp_size_format(p->peak[VP_PHASE_OPTIMIZER], d, sizeof d),
                vp_size_format(p->end, g, sizeof g),
                vp_size_format(p->reserved, h, sizeof h));
    }

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
}

/* --- json ----------------------------------------------------------- */

static void json_string(FILE *f, const char *s, size_t max)
{
    fputc('"', f);
    for (size_t i = 0; i < max && s[i] != '\0'; i++) {
        unsigned char ch = (unsigned char)s[i];

        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch == '\n')
            fputs("\\n", f);
        else if (ch == '\t')
            fputs("\\t", f);
        else if (ch < 0x20 || ch == 0x7f)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

static void print_json(FILE *f, const report *r)
{
    const vp_estimate *e = r->est;
    const vp_setup *s = r->setup;
    metric totals[N_TOTALS], sm[N_STEP_METRICS];
    bool first = true;

    fputs("{\n  \"model\": ", f);
    json_string(f, vp_graph_model_name(r->graph), SIZE_MAX);
    fputs(",\n  \"model_path\": ", f);
    json_string(f, r->model_path, SIZE_MAX);

    fputs(",\n  \"setup\": {\n", f);
    fprintf(f, "    \"batch\": %" PRIu64 ",\n", vp_graph_batch(r->graph));
    fprintf(f, "    \"seq\": %" PRIu64 ",\n", vp_graph_seq(r->graph));
    fprintf(f, "    \"precision\": \"%s\",\n",
            vp_precision_name(s->precision));
    fprintf(f, "    \"optimizer\": \"%s\",\n",
            vp_optimizer_name(s->optimizer));
    if (s->attn_set)
        fprintf(f, "    \"attention\": \"%s\",\n",
                vp_attn_impl_name(s->attn));
    else
        fputs("    \"attention\": null,\n", f);
    fprintf(f, "    \"set_to_none\": %s,\n", s->set_to_none ? "true" : "false");
    fprintf(f, "    \"inference\": %s,\n", s->inference ? "true" : "false");
    fprintf(f, "    \"accum\": %" PRIu32 ",\n", s->accum);
    fprintf(f, "    \"steps\": %" PRIu32 ",\n", s->steps);
    fputs("    \"checkpoint\": ", f);
    json_string(f, r->checkpoint, SIZE_MAX);
    fputs(",\n    \"checkpoint_segments\": [", f);
    for (size_t i = 0; i < s->n_checkpoint; i++) {
        if (!s->checkpoint[i])
            continue;
        fputs(first ? "" : ", ", f);
        json_string(f, vp_graph_segment(r->graph, i)->name, SIZE_MAX);
        first = false;
    }
    fputs("],\n", f);
    if (s->alloc.limit)
        fprintf(f, "    \"budget\": %" PRIu64 ",\n", s->alloc.limit);
    else
        fputs("    \"budget\": null,\n", f);
    fprintf(f, "    \"expandable_segments\": %s,\n",
            s->alloc.expandable_segments ? "true" : "false");
    fprintf(f, "    \"cublas_workspace\": %" PRIu64 ",\n", s->cublas_workspace);
    fprintf(f, "    \"cublaslt_workspace\": %" PRIu64 ",\n",
            s->cublaslt_workspace);
    fprintf(f, "    \"context_bytes\": %" PRIu64 ",\n", s->context_bytes);
    fprintf(f, "    \"fresh_process\": %s\n  },\n",
            s->fresh_process ? "true" : "false");

    fprintf(f, "  \"params\": %" PRIu64 ",\n", e->params);
    total_metrics(e, totals);
    for (size_t i = 0; i < N_TOTALS; i++)
        fprintf(f, "  \"%s\": %" PRIu64 ",\n", totals[i].key,
                totals[i].bytes);
    fprintf(f, "  \"peak_phase\": \"%s\",\n", vp_phase_name(e->peak_phase));
    fprintf(f, "  \"peak_step\": %" PRIu32 ",\n", e->peak_step);
    fputs("  \"peak_op\": ", f);
    json_string(f, e->peak_op, sizeof e->peak_op);

    fputs(",\n  \"by_category\": {\n", f);
    for (int k = 0; k < VP_CAT__COUNT; k++)
        fprintf(f, "    \"%s\": %" PRIu64 "%s\n",
                category_key((vp_category)k), e->by_category[k],
                k + 1 < VP_CAT__COUNT ? "," : "");

    fputs("  },\n  \"top_layers\": [", f);
    for (uint32_t i = 0; i < report_top_layers(e); i++) {
        fputs(i > 0 ? ",\n    {\"name\": " : "\n    {\"name\": ", f);
        json_string(f, e->top_layers[i].name, sizeof e->top_layers[i].name);
        fprintf(f, ", \"bytes\": %" PRIu64 "}", e->top_layers[i].bytes);
    }
    fputs(report_top_layers(e) > 0 ? "\n  ],\n" : "],\n", f);

    fputs("  \"steps\": [", f);
    for (uint32_t i = 0; i < report_steps(e); i++) {
        step_metrics(&e->step[i], sm);
        fprintf(f, "%s    {\"step\": %" PRIu32, i > 0 ? ",\n" : "\n", i + 1);
        for (size_t k = 0; k < N_STEP_METRICS; k++)
            fprintf(f, ", \"%s\": %" PRIu64, sm[k].key, sm[k].bytes);
        fputc('}', f);
    }
    fputs(report_steps(e) > 0 ? "\n  ],\n" : "],\n", f);

    fprintf(f, "  \"events\": %" PRIu64 ",\n", e->events);
    fprintf(f, "  \"num_alloc_retries\": %" PRIu64 ",\n", e->num_alloc_retries);
    if (isfinite(e->flops_per_step))
        fprintf(f, "  \"flops_per_step\": %.17g\n}\n", e->flops_per_step);
    else
        fputs("  \"flops_per_step\": null\n}\n", f);
}

/* --- csv ------------------------------------------------------------ */

static void print_csv(FILE *f, const report *r)
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
    for (uint32_t i = 0; i < report_steps(e); i++) {
        step_metrics(&e->step[i], m);
        for (size_t k = 0; k < N_STEP_METRICS; k++)
            fprintf(f, "steps.%" PRIu32 ".%s,%" PRIu64 "\n", i + 1, m[k].key,
                    m[k].bytes);
    }
}

static const printer printers[] = {
    {"table", print_table},
    {"json", print_json},
    {"csv", print_csv},
};

static const printer *printer_find(const char *name)
{
    for (size_t i = 0; i < sizeof printers / sizeof printers[0]; i++)
        if (strcmp(printers[i].name, name) == 0)
            return &printers[i];
    return NULL;
}

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

/* ------------------------------------------------------------------ */
/* estimate                                                            */
/* ------------------------------------------------------------------ */

enum {
    OPT_BATCH, OPT_SEQ, OPT_PRECISION, OPT_OPTIMIZER, OPT_CHECKPOINT,
    OPT_ACCUM, OPT_KEEP_GRADS, OPT_SET_TO_NONE, OPT_INFERENCE,
    OPT_ATTENTION, OPT_STEPS, OPT_BUDGET, OPT_CONTEXT, OPT_CUBLAS_WORKSPACE,
    OPT_EXPANDABLE, OPT_FORMAT, OPT_TIMELINE, OPT_HELP,
    OPT_OFFLOAD_OPT, OPT_OFFLOAD_ACT, OPT_COMPRESS, OPT_INT8, OPT_SELECTIVE,
    /* plan, techniques, maxbatch */
    OPT_GPU, OPT_GLOBAL_BATCH
};

#define LIST_ITEM(name, str) " " str

#define COMMON_OPTIONS \
    {OPT_BATCH, 'b', "batch", "N", "micro-batch size (default 1)"}, \
    {OPT_SEQ, 's', "seq", "N", \
     "sequence length or image side (default: the model's)"}, \
    {OPT_PRECISION, 'p', "precision", "P", \
     "one of:" VP_PRECISION_MAP(LIST_ITEM) " (default fp32)"}, \
    {OPT_OPTIMIZER, 'o', "optimizer", "O", \
     "one of:" VP_OPTIMIZER_MAP(LIST_ITEM) " (default adamw)"}, \
    {OPT_CHECKPOINT, 'c', "checkpoint", "SPEC", \
     "activation checkpointing: none, all, or segment names (default none)"}, \
    {OPT_ACCUM, 0, "accum", "N", \
     "micro-batches per optimizer step (default 1)"}, \
    {OPT_KEEP_GRADS, 0, "keep-grads", NULL, "zero_grad(set_to_none=False)"}, \
    {OPT_SET_TO_NONE, 0, "set-to-none", NULL, \
     "zero_grad(set_to_none=True) (default)"}, \
    {OPT_INFERENCE, 0, "inference", NULL, \
     "forward passes only, under torch.no_grad()"}, \
    {OPT_ATTENTION, 0, "attention", "IMPL", \
     "one of: sdpa flash efficient eager math (default: the model's)"}, \
    {OPT_STEPS, 0, "steps", "N", "training steps simulated, 1 to 16 " \
     "(default 4)"}, \
    {OPT_BUDGET, 0, "budget", "SIZE", \
     "bytes the allocator may reserve; exit 1 if the setup does not fit"}, \
    {OPT_CONTEXT, 0, "context", "SIZE", \
     "CUDA context outside the allocator (default 718077952 B)"}, \
    {OPT_CUBLAS_WORKSPACE, 0, "cublas-workspace", "SIZE", \
     "cuBLAS workspace per handle (default 32MiB)"}, \
    {OPT_EXPANDABLE, 0, "expandable-segments", NULL, \
     "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"}, \
    {OPT_SELECTIVE, 0, "selective", "SPEC", \
     "selective recomputation of the attention core in these segments " \
     "(names, patterns or all)"}, \
    {OPT_OFFLOAD_OPT, 0, "offload-optimizer", NULL, \
     "optimizer state on the host (CPU Adam, ZeRO-Offload)"}, \
    {OPT_OFFLOAD_ACT, 0, "offload-activations", NULL, \
     "saved activations on the host (save_on_cpu)"}, \
    {OPT_COMPRESS, 0, "compress-activations", "BITS", \
     "ActNN-style compression of saved activations: 2, 4 or 8 bits"}, \
    {OPT_INT8, 0, "int8-weights", NULL, \
     "INT8 linear weights (bitsandbytes), with --inference"}, \
    {OPT_FORMAT, 'f', "format", "FMT", "table, json or csv (default table)"}, \
    {OPT_TIMELINE, 0, "timeline", "FILE", \
     "write every allocation and free to FILE as CSV"}, \
    {OPT_HELP, 'h', "help", NULL, "show this help and exit"},

static const option_spec estimate_options[] = {COMMON_OPTIONS};

/* plan, techniques and maxbatch also take a GPU profile and a global
 * batch */
static const option_spec search_options[] = {
    COMMON_OPTIONS
    {OPT_GPU, 'g', "gpu", "NAME",
     "GPU profile: a gpus/NAME.yaml name or a profile file; gives the step "
     "time, and the budget when --budget is absent (memory less the CUDA "
     "context) or a fraction (--budget 0.9)"},
    {OPT_GLOBAL_BATCH, 0, "global-batch", "N",
     "samples per optimizer step for plan (default 32)"},
};

#define N_ESTIMATE_OPTIONS (sizeof estimate_options / sizeof estimate_options[0])
#define N_SEARCH_OPTIONS (sizeof search_options / sizeof search_options[0])

static void estimate_help(FILE *f)
{
    fputs("Usage: vramplan estimate MODEL [OPTIONS]\n"
          "\n"
          "Simulate training steps of MODEL (a vramplan YAML file or a Hugging "
          "Face\n"
          "config.json) as PyTorch 2.11 runs them on one GPU, through a model "
          "of its\n"
          "CUDA caching allocator, and report the peak memory.\n"
          "\n"
          "Options:\n", f);
    options_help(f, estimate_options, N_ESTIMATE_OPTIONS);
    fputs("\n"
          "--checkpoint takes 'none', 'all' (every layer or repeated block) or "
          "a\n"
          "comma-separated list of segment names or patterns, where '*' "
          "matches\n"
          "within one dot-separated part: 'layers.0,layers.1', 'h.*'.\n"
          "\n" SIZE_HELP "\n"
          "--format table is for people (binary units, rounded); json and csv "
          "give\n"
          "exact byte counts. The timeline CSV has the columns\n"
          "seq,step,phase,op,category,action,bytes,allocated,reserved.\n"
          "\n" EXIT_STATUS_HELP, f);
}

typedef struct estimate_args {
    const char *model_path;
    const char *gpu;        /* --gpu NAME, NULL for none                   */
    const char *budget;     /* --budget as written                         */
    uint64_t global_batch;  /* --global-batch, 0 when not given            */
    const char *checkpoint; /* spec, NULL for none                         */
    const char *selective;  /* --selective spec, NULL for none             */
    const char *timeline;   /* CSV path, NULL for none                     */
    const printer *format;
    vp_setup setup;
} estimate_args;

/* Parse the arguments of `estimate` into *a. Returns -1 to go on, or the
 * exit code (after --help or a usage error). */
static int estimate_parse(int argc, char **argv, estimate_args *a,
                          const option_spec *specs, size_t n_specs,
                          void (*help)(FILE *))
{
    arg_scan scan = {argc, argv, 1, false};
    const option_spec *o;
    const char *val;
    uint64_t v;
    int k;

    memset(a, 0, sizeof *a);
    vp_setup_init(&a->setup);
    a->format = &printers[0];

    while ((k = arg_next(&scan, specs, n_specs, &o, &val)) != ARG_END) {
        if (k == ARG_ERROR)
            return CLI_USAGE;
        if (k == ARG_OPERAND) {
            if (a->model_path != NULL)
                return usage_error("unexpected argument '%s' (estimate takes "
                                   "one MODEL)", val);
            a->model_path = val;
            continue;
        }
        switch (o->id) {
        case OPT_HELP:
            help(stdout);
            return CLI_OK;
        case OPT_GPU:
            a->gpu = val;
            break;
        case OPT_OFFLOAD_OPT:
            a->setup.offload_optimizer = true;
            break;
        case OPT_SELECTIVE:
            a->selective = val;
            break;
        case OPT_OFFLOAD_ACT:
            a->setup.offload_activations = true;
            break;
        case OPT_COMPRESS:
            if (!option_u64(o, val, 2, 8, &v) || (v != 2 && v != 4 && v != 8))
                return usage_error("invalid value '%s' for "
                                   "--compress-activations (2, 4 or 8)",
                                   val);
            a->setup.act_bits = (uint32_t)v;
            break;
        case OPT_INT8:
            a->setup.weight_bits = 8;
            break;
        case OPT_GLOBAL_BATCH:
            if (!option_u64(o, val, 1, UINT32_MAX, &a->global_batch))
                return CLI_USAGE;
            break;
        case OPT_BATCH:
            if (!option_u64(o, val, 1, UINT64_MAX, &a->setup.batch))
                return CLI_USAGE;
            break;
        case OPT_SEQ:
            if (!option_u64(o, val, 1, UINT64_MAX, &a->setup.seq))
                return CLI_USAGE;
            break;
        case OPT_PRECISION:
            if (vp_precision_parse(val, &a->setup.precision) != VP_OK)
                return usage_error("unknown precision '%s' (expected one "
                                   "of:" VP_PRECISION_MAP(LIST_ITEM) ")",
                                   val);
            break;
        case OPT_OPTIMIZER:
            if (vp_optimizer_parse(val, &a->setup.optimizer) != VP_OK)
                return usage_error("unknown optimizer '%s' (expected one "
                                   "of:" VP_OPTIMIZER_MAP(LIST_ITEM) ")",
                                   val);
            break;
        case OPT_CHECKPOINT:
            if (val[0] == '\0')
                return usage_error("--checkpoint needs a SPEC (none, all or "
                                   "segment names)");
            a->checkpoint = val;
            break;
        case OPT_ACCUM:
            if (!option_u64(o, val, 1, UINT32_MAX, &v))
                return CLI_USAGE;
            a->setup.accum = (uint32_t)v;
            break;
        case OPT_KEEP_GRADS:
            a->setup.set_to_none = false;
            break;
        case OPT_SET_TO_NONE:
            a->setup.set_to_none = true;
            break;
        case OPT_INFERENCE:
            a->setup.inference = true;
            break;
        case OPT_ATTENTION:
            if (vp_attn_impl_parse(val, &a->setup.attn) != VP_OK)
                return usage_error("unknown attention implementation '%s' "
                                   "(expected one of: sdpa flash efficient "
                                   "eager math)", val);
            a->setup.attn_set = true;
            break;
        case OPT_STEPS:
            if (!option_u64(o, val, 1, VP_MAX_STEPS, &v))
                return CLI_USAGE;
            a->setup.steps = (uint32_t)v;
            break;
        case OPT_BUDGET:
            a->budget = val;
            if (specs == search_options && strchr(val, '.') &&
                strspn(val, "0123456789.") == strlen(val) &&
                strtod(val, NULL) <= 1.0)
                break; /* a fraction of --gpu's memory: resolved later */
            if (!option_size(o, val, &a->setup.alloc.limit))
                return CLI_USAGE;
            if (a->setup.alloc.limit == 0)
                return usage_error("invalid value '%s' for --budget: the "
                                   "budget must be more than 0 bytes", val);
            break;
        case OPT_CONTEXT:
            if (!option_size(o, val, &a->setup.context_bytes))
                return CLI_USAGE;
            break;
        case OPT_CUBLAS_WORKSPACE:
            if (!option_size(o, val, &a->setup.cublas_workspace))
                return CLI_USAGE;
            break;
        case OPT_EXPANDABLE:
            a->setup.alloc.expandable_segments = true;
            break;
        case OPT_FORMAT:
            if ((a->format = printer_find(val)) == NULL)
                return usage_error("unknown format '%s' (expected table, "
                                   "json or csv)", val);
            break;
        case OPT_TIMELINE:
            if (val[0] == '\0')
                return usage_error("--timeline needs a FILE");
            a->timeline = val;
            break;
        }
    }
    if (a->model_path == NULL)
        return usage_error("estimate needs a MODEL file");
    return -1;
}

/* The message for VP_EOOM; exit code 1. */
static int report_no_fit(const vp_setup *s, const vp_error *err)
{
    char size[32];

    fputs("vramplan: error: does not fit", stderr);
    if (s->alloc.limit)
        fprintf(stderr, " in the budget of %s (%" PRIu64 " bytes)",
                vp_size_format(s->alloc.limit, size, sizeof size),
                s->alloc.limit);
    if (err->msg[0] != '\0')
        fprintf(stderr, ": %s", err->msg);
    fputc('\n', stderr);
    return CLI_NOFIT;
}

/* The segments a --checkpoint or --selective SPEC names, in a new array
 * (*out, one flag per segment; the caller frees it). Returns -1 to go on,
 * or an exit code after printing why. */
static int select_segments(const vp_graph *graph, const char *spec,
                           const char *option, bool **out)
{
    size_t n = vp_graph_segment_count(graph);
    vp_error err;

    *out = calloc(n > 0 ? n : 1, sizeof **out);
    if (*out == NULL)
        return fail("out of memory");
    if (vp_graph_checkpoint_select(graph, spec, *out, &err) != VP_OK) {
        fprintf(stderr, "vramplan: error: %s: %s\n", option,
                err.msg[0] ? err.msg : vp_strerror(err.code));
        return err.code == VP_EARG ? CLI_USAGE : exit_code_for(err.code);
    }
    return -1;
}

static int estimate_run(const estimate_args *a)
{
    vp_setup setup = a->setup;
    vp_model *model = NULL;
    vp_graph *graph = NULL;
    bool *ckpt = NULL, *sel = NULL;
    FILE *timeline = NULL;
    vp_estimate est;
    vp_error err;
    vp_status st;
    report r;
    int rc;

    vp_error_clear(&err);
    model = vp_model_load(a->model_path, &err);
    if (model == NULL) {
        rc = report_error(&err);
        goto done;
    }
    graph = vp_graph_build(model, setup.batch, setup.seq, &err);
    if (graph == NULL) {
        rc = report_error(&err);
        goto done;
    }

    if (a->checkpoint != NULL && strcmp(a->checkpoint, "auto") == 0) {
        size_t n = vp_graph_segment_count(graph);
        vp_ckpt_plan plan;

        ckpt = calloc(n > 0 ? n : 1, sizeof *ckpt);
        if (ckpt == NULL) {
            rc = fail("out of memory");
            goto done;
        }
        if (setup.alloc.limit == 0) {
            rc = usage_error("--checkpoint auto needs --budget");
            goto done;
        }
        sel = calloc(n > 0 ? n : 1, sizeof *sel);
        if (sel == NULL) {
            rc = fail("out of memory");
            goto done;
        }
        st = vp_checkpoint_auto_sel(model, &setup, ckpt, sel, n, &plan,
                                    &err);
        if (st == VP_EOOM) {
            rc = report_no_fit(&setup, &err);
            goto done;
        }
        if (st != VP_OK) {
            rc = report_error(&err);
            goto done;
        }
        if (a->format == &printers[0]) {
            char fl[32];
            printf("checkpoint auto: %zu of %zu segments checkpointed, %zu "
                   "with selective recomputation, recompute %s "
                   "(%.1f%% of the step's FLOPs), %u simulations\n",
                   plan.n_checkpointed, plan.n_segments, plan.n_selective,
                   format_si(plan.recompute_flops, "FLOP", fl, sizeof fl),
                   plan.step_flops > 0
                       ? 100.0 * plan.recompute_flops / plan.step_flops
                       : 0.0,
                   plan.simulations);
        }
        if (a->format == &printers[0]) {
            for (int which = 0; which < 2; which++) {
                const bool *set = which ? sel : ckpt;
                size_t shown = 0, count = 0;
                for (size_t i = 0; i < n; i++)
                    count += set[i];
                if (!count)
                    continue;
                printf("  %s:", which ? "selective" : "checkpointed");
                for (size_t i = 0; i < n; i++) {
                    if (!set[i])
                        continue;
                    if (shown == 16) {
                        printf(" ... (%zu more)", count - shown);
                        break;
                    }
                    printf(" %s", vp_graph_segment(graph, i)->name);
                    shown++;
                }
                putchar('\n');
            }
        }
        setup.checkpoint = ckpt;
        setup.n_checkpoint = n;
        setup.selective = sel;
        setup.n_selective = n;
    } else if (a->checkpoint != NULL) {
        if ((rc = select_segments(graph, a->checkpoint, "--checkpoint",
                                  &ckpt)) >= 0)
            goto done;
        setup.checkpoint = ckpt;
        setup.n_checkpoint = vp_graph_segment_count(graph);
    }

    if (a->selective != NULL && sel == NULL) {
        if ((rc = select_segments(graph, a->selective, "--selective",
                                  &sel)) >= 0)
            goto done;
        setup.selective = sel;
        setup.n_selective = vp_graph_segment_count(graph);
    }

    if (a->timeline != NULL) {
        timeline = fopen(a->timeline, "w");
        if (timeline == NULL) {
            rc = fail("cannot open '%s' for writing: %s", a->timeline,
                      strerror(errno));
            goto done;
        }
        fputs("seq,step,phase,op,category,action,bytes,allocated,reserved\n",
              timeline);
    }

    memset(&est, 0, sizeof est);
    st = vp_simulate(graph, &setup, &est,
                     timeline != NULL ? timeline_event : NULL, timeline, &err);
    if (timeline != NULL) {
        int bad = ferror(timeline);

        if (fclose(timeline) != 0 || bad) {
            timeline = NULL;
            rc = fail("cannot write '%s'", a->timeline);
            goto done;
        }
        timeline = NULL;
    }
    if (st == VP_EOOM) {
        rc = report_no_fit(&setup, &err);
        goto done;
    }
    if (st != VP_OK) {
        rc = report_error(&err);
        goto done;
    }

    r.model_path = a->model_path;
    r.graph = graph;
    r.setup = &setup;
    r.checkpoint = a->checkpoint != NULL ? a->checkpoint : "none";
    r.est = &est;
    a->format->print(stdout, &r);
    rc = CLI_OK;

done:
    if (timeline != NULL)
        fclose(timeline);
    free(ckpt);
    free(sel);
    vp_graph_free(graph);
    vp_model_free(model);
    return rc;
}

static int cmd_estimate(int argc, char **argv)
{
    estimate_args a;
    int rc = estimate_parse(argc, argv, &a, estimate_options,
                            N_ESTIMATE_OPTIONS, estimate_help);

    return rc >= 0 ? rc : estimate_run(&a);
}

/* ------------------------------------------------------------------ */
/* maxbatch                                                            */
/* ------------------------------------------------------------------ */

static void maxbatch_help(FILE *f)
{
    fputs("Usage: vramplan maxbatch MODEL --budget SIZE [OPTIONS]\n"
          "       vramplan maxbatch MODEL --gpu NAME [--budget FRACTION] "
          "[OPTIONS]\n"
          "\n"
          "The largest micro-batch whose simulated training steps fit in "
          "the\n"
          "budget, applied as torch.cuda.set_per_process_memory_fraction "
          "applies\n"
          "it: no new segment may take reserved bytes past the budget "
          "(cached\n"
          "segments are freed and the allocation retried first). The search\n"
          "doubles from 1, then bisects. --batch is ignored.\n"
          "\n"
          "Options:\n", f);
    options_help(f, search_options, N_SEARCH_OPTIONS);
    fputs("\n" SIZE_HELP "\n" EXIT_STATUS_HELP, f);
}

/* Apply --gpu: the hardware profile, the CUDA context, and the budget
 * (absent: the GPU's memory less the context; a fraction: of the GPU's
 * memory, as set_per_process_memory_fraction takes it). Returns -1 to go
 * on, or an exit code. */
static int apply_gpu(estimate_args *a, vp_hw *hw, bool *have_hw)
{
    *have_hw = false;
    if (a->gpu == NULL) {
        if (a->setup.alloc.limit == 0 && a->budget != NULL)
            return usage_error("--budget %s is a fraction: give --gpu too",
                               a->budget);
        return -1;
    }
    if (cli_gpu_hw(a->gpu, hw) != 0)
        return CLI_USAGE; /* cli_gpu_hw printed why */
    *have_hw = true;
    a->setup.context_bytes = hw->context;
    a->setup.alloc.device_total = hw->memory;
    if (a->budget == NULL) {
        a->setup.alloc.limit =
            hw->memory > hw->context ? hw->memory - hw->context : 0;
    } else if (a->setup.alloc.limit == 0) {
        double f = strtod(a->budget, NULL);
        if (!(f > 0.0 && f <= 1.0))
            return usage_error("invalid fraction '%s' for --budget (0 to 1)",
                               a->budget);
        a->setup.alloc.limit = (uint64_t)(f * (double)hw->memory);
    }
    return -1;
}

static bool arg_given(int argc, char **argv, const char *name);

static int cmd_maxbatch(int argc, char **argv)
{
    estimate_args a;
    vp_model *model = NULL;
    vp_maxbatch_result mb;
    vp_error err;
    vp_status st;
    vp_hw hw;
    bool have_hw;
    int rc;

    if (arg_given(argc, argv, "--gpu-family"))
        return cli_mig_maxbatch(argc, argv);
    rc = estimate_parse(argc, argv, &a, search_options, N_SEARCH_OPTIONS,
                        maxbatch_help);
    if (rc >= 0)
        return rc;
    if ((rc = apply_gpu(&a, &hw, &have_hw)) >= 0)
        return rc;
    if (a.setup.alloc.limit == 0)
        return usage_error("maxbatch needs --budget or --gpu");
    if (a.checkpoint != NULL && strcmp(a.checkpoint, "auto") == 0)
        return usage_error("maxbatch takes a fixed --checkpoint (none, all "
                           "or names), not auto");
    if (a.setup.steps == 4)
        a.setup.steps = 2; /* two steps reach the steady state */
    vp_error_clear(&err);
    model = vp_model_load(a.model_path, &err);
    if (model == NULL)
        return report_error(&err);
    st = vp_maxbatch(model, &a.setup, a.checkpoint, 0, &mb, &err);
    if (st != VP_OK) {
        rc = st == VP_EARG && err.msg[0] ? usage_error("%s", err.msg)
                                        : report_error(&err);
        vp_model_free(model);
        return rc;
    }
    char b1[32], b2[32], b3[32];
    if (a.format == &printers[1]) {
        printf("{\"model\": ");
        json_string(stdout, a.model_path, 512);
        printf(", \"budget\": %" PRIu64 ", \"max_batch\": %" PRIu64
               ", \"trials\": %" PRIu32 ", \"peak_alloc\": %" PRIu64
               ", \"peak_reserved\": %" PRIu64 ", \"device_used\": %" PRIu64
               "}\n",
               a.setup.alloc.limit, mb.max_batch, mb.trials,
               mb.at_max.peak_alloc, mb.at_max.peak_reserved,
               mb.at_max.device_used);
    } else {
        printf("model        %s\n", a.model_path);
        printf("budget       %s (%" PRIu64 " bytes) for the caching "
               "allocator\n",
               vp_size_format(a.setup.alloc.limit, b1, sizeof b1),
               a.setup.alloc.limit);
        printf("setup        seq %" PRIu64 ", %s, %s, checkpoint %s\n",
               a.setup.seq ? a.setup.seq : vp_model_default_seq(model),
               vp_precision_name(a.setup.precision),
               vp_optimizer_name(a.setup.optimizer),
               a.checkpoint ? a.checkpoint : "none");
        if (mb.max_batch == 0) {
            printf("max batch    none: batch 1 does not fit (%u "
                   "simulations)\n",
                   mb.trials);
            vp_model_free(model);
            return CLI_NOFIT;
        }
        printf("max batch    %" PRIu64 " (%u simulations)\n", mb.max_batch,
               mb.trials);
        printf("at that batch peak allocated %s, peak reserved %s, device "
               "used %s\n",
               vp_size_format(mb.at_max.peak_alloc, b1, sizeof b1),
               vp_size_format(mb.at_max.peak_reserved, b2, sizeof b2),
               vp_size_format(mb.at_max.device_used, b3, sizeof b3));
    }
    vp_model_free(model);
    return mb.max_batch ? CLI_OK : CLI_NOFIT;
}

/* ------------------------------------------------------------------ */
/* plan (one GPU)                                                      */
/* ------------------------------------------------------------------ */

static void plan_help(FILE *f)
{
    fputs("Usage: vramplan plan MODEL --gpu NAME [--budget SIZE|FRACTION] "
          "[OPTIONS]\n"
          "       vramplan plan MODEL --gpus N --gpu NAME ...   (clusters)\n"
          "\n"
          "Search the training setup of MODEL on one GPU: precision, "
          "optimizer\n"
          "variant (AdamW foreach, fused, 8-bit), activation checkpointing "
          "(none,\n"
          "every layer, or the least recomputation that fits) and the split "
          "of\n"
          "--global-batch into micro-batches with gradient accumulation. "
          "Every\n"
          "candidate is simulated under the budget and timed with the GPU\n"
          "profile's rates; the fastest that fits wins, and the others are "
          "listed\n"
          "with the reason each lost. --precision and --optimizer restrict "
          "the\n"
          "search to one value.\n"
          "\n"
          "Options:\n", f);
    options_help(f, search_options, N_SEARCH_OPTIONS);
    fputs("\n" SIZE_HELP "\n" EXIT_STATUS_HELP, f);
}

static bool arg_given(int argc, char **argv, const char *name)
{
    size_t n = strlen(name);
    for (int i = 1; i < argc; i++)
        if (strncmp(argv[i], name, n) == 0 &&
            (argv[i][n] == '\0' || argv[i][n] == '='))
            return true;
    return false;
}

static int cmd_plan(int argc, char **argv)
{
    estimate_args a;
    vp_plan_request req;
    vp_plan_result *res = NULL;
    vp_model *model = NULL;
    vp_error err;
    bool have_hw;
    int rc;

    if (arg_given(argc, argv, "--gpus"))
        return cli_plan_cluster(argc, argv);
    if (arg_given(argc, argv, "--gpu-family"))
        return cli_mig_plan(argc, argv);
    rc = estimate_parse(argc, argv, &a, search_options, N_SEARCH_OPTIONS,
                        plan_help);
    if (rc >= 0)
        return rc;
    memset(&req, 0, sizeof req);
    if ((rc = apply_gpu(&a, &req.hw, &have_hw)) >= 0)
        return rc;
    if (!have_hw)
        return usage_error("plan needs --gpu NAME (its rates time the "
                           "candidates)");
    if (arg_given(argc, argv, "--precision") || arg_given(argc, argv, "-p"))
        req.precisions[a.setup.precision] = true;
    if (arg_given(argc, argv, "--optimizer") || arg_given(argc, argv, "-o"))
        req.optimizers[a.setup.optimizer] = true;
    req.base = a.setup;
    req.global_batch = a.global_batch ? a.global_batch : 32;
    vp_error_clear(&err);
    model = vp_model_load(a.model_path, &err);
    if (model == NULL)
        return report_error(&err);
    res = malloc(sizeof *res);
    if (res == NULL) {
        vp_model_free(model);
        return fail("out of memory");
    }
    vp_status st = vp_plan_single(model, &req, res, &err);
    if (st != VP_OK) {
        rc = report_error(&err);
        goto done;
    }
    char b1[32], b2[32];
    bool any = res->n && res->cand[0].fits;
    if (a.format == &printers[1]) {
        printf("{\"model\": ");
        json_string(stdout, a.model_path, 512);
        printf(", \"gpu\": ");
        json_string(stdout, req.hw.name, 64);
        printf(", \"budget\": %" PRIu64 ", \"global_batch\": %" PRIu64
               ", \"simulations\": %" PRIu32 ", \"candidates\": [",
               req.base.alloc.limit, req.global_batch, res->simulations);
        for (size_t i = 0; i < res->n; i++) {
            const vp_plan_candidate *k = &res->cand[i];
            printf("%s{\"precision\": \"%s\", \"optimizer\": \"%s\", "
                   "\"offload_optimizer\": %s, "
                   "\"checkpoint\": \"%s\", \"checkpointed\": %zu, "
                   "\"micro_batch\": %" PRIu64 ", \"accum\": %" PRIu32
                   ", \"fits\": %s, \"peak_alloc\": %" PRIu64
                   ", \"peak_reserved\": %" PRIu64
                   ", \"step_seconds\": %.6f, \"samples_per_s\": %.3f, "
                   "\"mfu\": %.4f, \"reason\": ",
                   i ? ", " : "", vp_precision_name(k->precision),
                   vp_optimizer_name(k->optimizer),
                   k->offload ? "true" : "false",
                   vp_ckpt_mode_name(k->ckpt), k->n_checkpointed,
                   k->micro_batch, k->accum, k->fits ? "true" : "false",
                   k->peak_alloc, k->peak_reserved, k->time.total,
                   k->samples_per_s, k->time.mfu);
            json_string(stdout, k->reason, sizeof k->reason);
            putchar('}');
        }
        printf("]}\n");
    } else {
        printf("model        %s (%s)\n", vp_model_name(model), a.model_path);
        printf("gpu          %s, budget %s for the caching allocator\n",
               req.hw.name,
               vp_size_format(req.base.alloc.limit, b1, sizeof b1));
        printf("target       global batch %" PRIu64 ", seq %" PRIu64 "\n",
               req.global_batch,
               a.setup.seq ? a.setup.seq : vp_model_default_seq(model));
        printf("searched     %zu setups, %" PRIu32 " simulations\n\n",
               res->n, res->simulations);
        printf("%4s  %-9s %-16s %-5s %12s %14s %11s %10s %6s\n", "rank",
               "precision", "optimizer", "ckpt", "micro x acc",
               "peak reserved", "step time", "samples/s", "MFU");
        for (size_t i = 0; i < res->n; i++) {
            const vp_plan_candidate *k = &res->cand[i];
            char mb[48], ck[48];
            snprintf(mb, sizeof mb, "%" PRIu64 " x %" PRIu32, k->micro_batch,
                     k->accum);
            if (k->ckpt == VP_CKPT_AUTO && k->n_segments)
                snprintf(ck, sizeof ck, "%zu/%zu", k->n_checkpointed,
                         k->n_segments);
            else
                snprintf(ck, sizeof ck, "%s", vp_ckpt_mode_name(k->ckpt));
            char on[24];
            snprintf(on, sizeof on, "%s%s", vp_optimizer_name(k->optimizer),
                     k->offload ? "+off" : "");
            if (!k->fits) {
                printf("%4s  %-9s %-16s %-5s %12s %14s %11s %10s %6s\n", "-",
                       vp_precision_name(k->precision), on, ck,
                       k->micro_batch ? mb : "-", "-", "-", "-", "-");
                continue;
            }
            printf("%4zu  %-9s %-16s %-5s %12s %14s %9.1f ms %10.1f %5.1f%%\n",
                   i + 1, vp_precision_name(k->precision), on, ck, mb,
                   vp_size_format(k->peak_reserved, b2, sizeof b2),
                   k->time.total * 1e3, k->samples_per_s,
                   100.0 * k->time.mfu);
        }
        if (any) {
            const vp_plan_candidate *k = &res->cand[0];
            printf("\nbest: %s, %s%s, checkpoint %s, micro-batch %" PRIu64
                   " with %" PRIu32 " accumulation steps\n",
                   vp_precision_name(k->precision),
                   vp_optimizer_name(k->optimizer),
                   k->offload ? " (state offloaded to the host)" : "",
                   vp_ckpt_mode_name(k->ckpt), k->micro_batch, k->accum);
            printf("\nwhy the others lost:\n");
        } else {
            printf("\nnothing fits in the budget:\n");
        }
        for (size_t i = any ? 1 : 0; i < res->n; i++) {
            const vp_plan_candidate *k = &res->cand[i];
            char on[32];
            snprintf(on, sizeof on, "%s%s", vp_optimizer_name(k->optimizer),
                     k->offload ? "+off" : "");
            printf("  %-9s %-18s %-5s %s\n", vp_precision_name(k->precision),
                   on, vp_ckpt_mode_name(k->ckpt), k->reason);
        }
    }
    rc = any ? CLI_OK : CLI_NOFIT;
done:
    free(res);
    vp_model_free(model);
    return rc;
}

/* ------------------------------------------------------------------ */
/* techniques                                                          */
/* ------------------------------------------------------------------ */

static void techniques_help(FILE *f)
{
    fputs("Usage: vramplan techniques MODEL --budget SIZE [--gpu NAME] "
          "[OPTIONS]\n"
          "\n"
          "What each memory technique buys on MODEL with your setup: the "
          "peak\n"
          "memory, whether your batch fits the budget, the largest batch, "
          "and\n"
          "(with --gpu) the step time, for each technique alone and a few\n"
          "combinations. Every figure comes from the simulator.\n"
          "\n"
          "Options:\n", f);
    options_help(f, search_options, N_SEARCH_OPTIONS);
    fputs("\n" SIZE_HELP "\n" EXIT_STATUS_HELP, f);
}

static int cmd_techniques(int argc, char **argv)
{
    estimate_args a;
    vp_model *model = NULL;
    vp_technique_result out[VP_TECHNIQUES_MAX];
    size_t n = 0;
    vp_error err;
    vp_hw hw;
    bool have_hw;
    int rc;

    rc = estimate_parse(argc, argv, &a, search_options, N_SEARCH_OPTIONS,
                        techniques_help);
    if (rc >= 0)
        return rc;
    if ((rc = apply_gpu(&a, &hw, &have_hw)) >= 0)
        return rc;
    if (a.setup.alloc.limit == 0)
        return usage_error("techniques needs --budget or --gpu");
    if (a.checkpoint != NULL && strcmp(a.checkpoint, "auto") == 0)
        return usage_error("give techniques a fixed --checkpoint; 'checkpoint "
                           "optimal' is one of its rows");
    if (a.setup.steps == 4)
        a.setup.steps = 2;
    vp_error_clear(&err);
    model = vp_model_load(a.model_path, &err);
    if (model == NULL)
        return report_error(&err);
    vp_status st = vp_techniques(model, &a.setup, a.checkpoint,
                                 have_hw ? &hw : NULL, out, VP_TECHNIQUES_MAX,
                                 &n, &err);
    if (st != VP_OK) {
        rc = report_error(&err);
        vp_model_free(model);
        return rc;
    }
    char b1[32], b2[32], b3[32];
    if (a.format == &printers[1]) {
        printf("{\"model\": ");
        json_string(stdout, a.model_path, 512);
        printf(", \"budget\": %" PRIu64 ", \"batch\": %" PRIu64
               ", \"techniques\": [",
               a.setup.alloc.limit, a.setup.batch);
        for (size_t i = 0; i < n; i++) {
            const vp_technique_result *r = &out[i];
            printf("%s{\"name\": ", i ? ", " : "");
            json_string(stdout, r->name, sizeof r->name);
            printf(", \"applicable\": %s, \"fits\": %s, \"peak_alloc\": "
                   "%" PRIu64 ", \"peak_reserved\": %" PRIu64
                   ", \"max_batch\": %" PRIu64 ", \"step_seconds\": %.6f, "
                   "\"note\": ",
                   r->applicable ? "true" : "false",
                   r->fits ? "true" : "false", r->peak_alloc,
                   r->peak_reserved, r->max_batch, r->step_s);
            json_string(stdout, r->note, sizeof r->note);
            putchar('}');
        }
        printf("]}\n");
    } else {
        printf("model        %s (%s)\n", vp_model_name(model), a.model_path);
        printf("setup        batch %" PRIu64 ", %s, %s, budget %s%s%s\n\n",
               a.setup.batch, vp_precision_name(a.setup.precision),
               vp_optimizer_name(a.setup.optimizer),
               vp_size_format(a.setup.alloc.limit, b1, sizeof b1),
               have_hw ? ", gpu " : "", have_hw ? hw.name : "");
        printf("%-26s %12s %12s %5s %9s %11s  %s\n", "technique",
               "peak alloc", "reserved", "fits", "max batch", "step time",
               "notes");
        uint64_t base = n ? out[0].peak_alloc : 0;
        for (size_t i = 0; i < n; i++) {
            const vp_technique_result *r = &out[i];
            if (!r->applicable) {
                printf("%-26s %12s %12s %5s %9s %11s  %s\n", r->name, "-",
                       "-", "-", "-", "-", r->note);
                continue;
            }
            char t[32] = "-";
            if (r->step_s > 0)
                snprintf(t, sizeof t, "%.1f ms", r->step_s * 1e3);
            char d[48] = "";
            if (i > 0 && base)
                snprintf(d, sizeof d, "%+.1f%% memory",
                         100.0 * ((double)r->peak_alloc / (double)base - 1.0));
            printf("%-26s %12s %12s %5s %9" PRIu64 " %11s  %s%s%s\n",
                   r->name, vp_size_format(r->peak_alloc, b2, sizeof b2),
                   vp_size_format(r->peak_reserved, b3, sizeof b3),
                   r->fits ? "yes" : "no", r->max_batch, t, d,
                   d[0] && r->note[0] ? "; " : "", r->note);
        }
    }
    vp_model_free(model);
    return CLI_OK;
}

/* ------------------------------------------------------------------ */
/* Commands                                                            */
/* ------------------------------------------------------------------ */

typedef struct command {
    const char *name;
    const char *usage;   /* arguments, for the command list               */
    const char *summary;
    int (*run)(int argc, char **argv); /* argv[0] is the command's name   */
} command;

static const command commands[] = {
    {"estimate", "MODEL [OPTIONS]",
     "simulate training steps and report peak GPU memory", cmd_estimate},
    {"maxbatch", "MODEL --budget SIZE",
     "the largest micro-batch that fits in a memory budget", cmd_maxbatch},
    {"plan", "MODEL --gpu NAME",
     "search the fastest training setup that fits", cmd_plan},
    {"techniques", "MODEL --budget SIZE",
     "what each memory technique buys on a model", cmd_techniques},
    {"compare", "MODEL --gpus N,N... --gpu NAME,...",
     "the best cluster plan per cluster size and GPU", cli_compare},
    {"export", "MODEL --gpus N --gpu NAME --to FMT",
     "write a cluster plan as a DeepSpeed, Megatron-LM or torchrun config",
     cli_export},
    {"probe", "[OPTIONS] -- CMD ARGS...",
     "find the largest batch by running the real command", cli_probe},
    {"replay", "MODEL --budget SIZE",
     "replay the simulated step's segments and GEMMs on a real GPU",
     cli_replay},
    {"calibrate", "[OPTIONS]",
     "measure this GPU and write a GPU profile", cli_calibrate},
    {"fit", "FILE.jsonl... [OPTIONS]",
     "fit framework constants to measured runs", cli_fit},
    {"validate", "FILE.jsonl... [OPTIONS]",
     "compare the simulator with measured PyTorch runs", cli_validate},
    {"serve", "MODEL --gpu NAME", "size a vLLM server: KV blocks, "
     "concurrency", cli_serve},
    {"batching", "MODEL --lengths FILE --gpu NAME",
     "tokens per batch and batch per length bucket, padded or packed",
     cli_batching},
    /* ------------------------------------------------------------------
     * NEW COMMANDS GO HERE: validate, maxbatch, plan.
     * Add a cmd_<name>(argc, argv) above (parse with arg_next and an
     * option_spec table, print library errors with report_error, return a
     * CLI_* exit code) and one line in this table; --help and dispatch
     * pick it up from here.
     * ------------------------------------------------------------------ */
};

static void main_help(FILE *f)
{
    fputs("Usage: vramplan COMMAND [ARGS]\n"
          "       vramplan --help | --version\n"
          "\n"
          "vramplan estimates the GPU memory that a PyTorch training step "
          "needs,\n"
          "by simulating its allocations through a model of the CUDA caching\n"
          "allocator.\n"
          "\n"
          "Commands:\n", f);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        char left[96];
        snprintf(left, sizeof left, "%s %s", commands[i].name,
                 commands[i].usage);
        if (strlen(left) > 30)
            fprintf(f, "  %s\n  %-30s %s\n", left, "", commands[i].summary);
        else
            fprintf(f, "  %-30s %s\n", left, commands[i].summary);
    }
    fputs("\n"
          "Options:\n"
          "  -h, --help       show this help and exit\n"
          "  -V, --version    show the version and exit\n"
          "\n"
          "Run 'vramplan COMMAND --help' for the options of a command.\n"
          "\n" EXIT_STATUS_HELP, f);
}

int main(int argc, char **argv)
{
    const char *name = argc > 1 ? argv[1] : NULL;
    int rc = -1;

    if (name == NULL)
        return usage_error("no command given");
    if (strcmp(name, "-h") == 0 || strcmp(name, "--help") == 0) {
        main_help(stdout);
        rc = CLI_OK;
    } else if (strcmp(name, "-V") == 0 || strcmp(name, "--version") == 0) {
        printf("vramplan %s\n", VRAMPLAN_VERSION);
        rc = CLI_OK;
    } else if (name[0] == '-') {
        return usage_error("unknown option '%s'", name);
    } else {
        for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
            if (strcmp(commands[i].name, name) == 0) {
                rc = commands[i].run(argc - 1, argv + 1);
                break;
            }
        if (rc < 0)
            return usage_error("unknown command '%s'", name);
    }

    if (fflush(stdout) != 0 || ferror(stdout))
        return fail("cannot write the output: %s", strerror(errno));
    return rc;
}
