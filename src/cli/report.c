/* Errors and exit status of every command: one table of exit codes, one
 * printer for messages, and for errors in input files (models, GPU
 * profiles, case and bounds files, raw calibration output) the GCC form
 * with the source line and a caret, as jq and GCC show them. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#define SHOW_COLS 200           /* columns of a source line shown         */
#define SOURCE_MAX (1u << 20)   /* bytes of a source line read            */

void cli_exit_help(FILE *f)
{
    fputs("Exit status:\n"
          "  0    success (the setup fits; validate: every case within its "
          "bounds)\n"
          "  1    does not fit in the memory budget; validate: an error "
          "bound exceeded\n"
          "  2    usage, I/O or system error\n"
          "  3    invalid input: a model, GPU profile, case, bounds or "
          "calibration file\n"
          "  4    probe: a trial failed otherwise or timed out\n"
          "  130  probe: interrupted\n", f);
}

cli_exit cli_exit_for(vp_status st)
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
        return CLI_INPUT;
    default:
        return CLI_USAGE; /* VP_ENOMEM, VP_EIO, VP_EARG */
    }
}

static void verror(const char *kind, const char *fmt, va_list ap)
{
    fprintf(stderr, "vramplan: %s: ", kind);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
}

int cli_fail(const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    verror("error", fmt, ap);
    va_end(ap);
    return CLI_USAGE;
}

int cli_usage_error(const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    verror("error", fmt, ap);
    va_end(ap);
    fputs("Use vramplan --help for help with command-line options.\n",
          stderr);
    return CLI_USAGE;
}

void cli_warn(const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    verror("warning", fmt, ap);
    va_end(ap);
}

/* Line `line` (1-based) of path, without its line break; malloc'ed, NULL
 * when it cannot be read or is not text (a NUL byte). At most SOURCE_MAX
 * bytes of it. */
static char *read_line(const char *path, uint32_t line, size_t *len)
{
    FILE *f = fopen(path, "rb");
    uint32_t at = 1;
    char *text;
    int c;

    if (f == NULL)
        return NULL;
    while (at < line && (c = getc(f)) != EOF)
        at += c == '\n';
    text = at == line ? malloc(SOURCE_MAX + 1) : NULL;
    *len = 0;
    while (text != NULL && (c = getc(f)) != EOF && c != '\n' && c != '\0')
        if (*len < SOURCE_MAX)
            text[(*len)++] = (char)c;
    fclose(f);
    if (text == NULL || c == '\0') {
        free(text);
        return NULL;
    }
    if (*len > 0 && text[*len - 1] == '\r')
        (*len)--;
    text[*len] = '\0';
    return text;
}

/* The byte where column c (1-based; UTF-8 sequences are one column)
 * starts, or len past the end. */
static size_t col_offset(const char *s, size_t len, size_t c)
{
    size_t i = 0;

    for (size_t k = 1; k < c && i < len; k++) {
        i++;
        while (i < len && ((unsigned char)s[i] & 0xC0) == 0x80)
            i++;
    }
    return i;
}

/* The source line of an error and a caret under columns col..col+width-1;
 * a line of more than SHOW_COLS columns is shown as a window around col,
 * its cut ends marked "...". Tabs are kept in the padding so that the
 * caret lines up. Nothing when the line cannot be read. */
static void show_source(const char *path, uint32_t line, uint32_t col,
                        uint32_t width)
{
    size_t len, ncols, first = 1, last;
    char *text = read_line(path, line, &len);

    if (text == NULL || (len == 0 && col <= 1)) {
        free(text);
        return;
    }
    ncols = 0;
    for (size_t i = 0; i < len; i++)
        ncols += ((unsigned char)text[i] & 0xC0) != 0x80;
    last = ncols;
    if (ncols > SHOW_COLS) {
        first = col > SHOW_COLS / 2 ? col - SHOW_COLS / 2 : 1;
        if (first > ncols - SHOW_COLS + 1)
            first = ncols - SHOW_COLS + 1;
        last = first + SHOW_COLS - 1;
    }
    size_t from = col_offset(text, len, first);
    size_t to = col_offset(text, len, last + 1);
    fprintf(stderr, "    %s%.*s%s\n", first > 1 ? "..." : "",
            (int)(to - from), text + from, last < ncols ? "..." : "");
    if (col > 0) {
        fputs(first > 1 ? "       " : "    ", stderr);
        for (size_t c = first, at = from; c < col; c++) {
            fputc(at < len && text[at] == '\t' ? '\t' : ' ', stderr);
            at += col_offset(text + at, len - at, 2);
        }
        if (col <= last && width > last - col + 1)
            width = (uint32_t)(last - col + 1);
        for (uint32_t w = width ? width : 1; w > 0; w--)
            fputc('^', stderr);
        fputc('\n', stderr);
    }
    free(text);
}

int cli_report(const vp_error *err, const char *prefix)
{
    const char *msg = err->msg[0] ? err->msg : vp_strerror(err->code);

    if (prefix == NULL)
        prefix = "";
    if (err->path[0] == '\0')
        fprintf(stderr, "vramplan: error: %s%s\n", prefix, msg);
    else if (err->line == 0)
        fprintf(stderr, "%s: error: %s%s\n", err->path, prefix, msg);
    else if (err->col == 0)
        fprintf(stderr, "%s:%" PRIu32 ": error: %s%s\n", err->path,
                err->line, prefix, msg);
    else
        fprintf(stderr, "%s:%" PRIu32 ":%" PRIu32 ": error: %s%s\n",
                err->path, err->line, err->col, prefix, msg);
    if (err->path[0] != '\0' && err->line > 0)
        show_source(err->path, err->line, err->col, err->width);
    return err->code == VP_OK ? CLI_USAGE : (int)cli_exit_for(err->code);
}

int cli_report_no_fit(const vp_setup *s, const vp_error *err)
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

/* ---- numbers for people -------------------------------------------------- */

const char *cli_commas(uint64_t v, char *buf, size_t n)
{
    char digits[32];
    size_t len, o = 0;

    len = (size_t)snprintf(digits, sizeof digits, "%" PRIu64, v);
    for (size_t i = 0; i < len && o + 2 < n; i++) {
        if (i > 0 && (len - i) % 3 == 0)
            buf[o++] = ',';
        buf[o++] = digits[i];
    }
    buf[o] = '\0';
    return buf;
}

/* Powers of 1000: (124439808, "") -> "124.4M", (4.5e15, "FLOP") ->
 * "4.5 PFLOP", (12, "FLOP") -> "12 FLOP". */
const char *cli_si(double v, const char *unit, char *buf, size_t n)
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
