/* The option parser of every command: a table of options (cli_opt) in,
 * typed values with "given" flags out, so that a default never stands in
 * for an explicit value. Long options ("--batch 8", "--batch=8"), short
 * ones ("-b 8"), operands, "--"; usage errors name the option and suggest
 * the closest one. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#define HELP_COLUMN 30 /* where option descriptions start             */
#define HELP_WIDTH 79

static bool visible(const cli_spec *s, const cli_opt *o)
{
    return o->only == 0 || s->command == 0 || (o->only & s->command) != 0;
}

static const cli_opt *find_long(const cli_spec *s, const char *name,
                                size_t len)
{
    for (size_t k = 0; k < s->n_opts; k++)
        if (visible(s, &s->opts[k]) && strlen(s->opts[k].name) == len &&
            strncmp(s->opts[k].name, name, len) == 0)
            return &s->opts[k];
    return NULL;
}

static const cli_opt *find_short(const cli_spec *s, char c)
{
    for (size_t k = 0; k < s->n_opts; k++)
        if (visible(s, &s->opts[k]) && s->opts[k].short_name == c)
            return &s->opts[k];
    return NULL;
}

/* "unknown option '--bacth' (did you mean '--batch'?)" */
static int unknown_option(const cli_spec *s, const char *arg)
{
    const char *names[CLI_MAX_OPTS + 1];
    char word[64];
    size_t n = 0;

    for (size_t k = 0; k < s->n_opts && n < CLI_MAX_OPTS; k++)
        if (visible(s, &s->opts[k]))
            names[n++] = s->opts[k].name;
    names[n] = NULL;
    snprintf(word, sizeof word, "%.*s", (int)strcspn(arg + strspn(arg, "-"),
                                                     "="),
             arg + strspn(arg, "-"));
    const char *best = word[0] ? vp_suggest(word, names) : NULL;
    if (best != NULL)
        return cli_usage_error("unknown option '%s' (did you mean '--%s'?)",
                               arg, best);
    return cli_usage_error("unknown option '%s'", arg);
}

const char *cli_list_words(const char *const *words, char *buf, size_t n)
{
    size_t count = 0, used = 0;

    while (words[count] != NULL)
        count++;
    buf[0] = '\0';
    for (size_t i = 0; i < count && used < n; i++) {
        int w = snprintf(buf + used, n - used, "%s%s",
                         i == 0 ? "" : i + 1 == count ? " or " : ", ",
                         words[i]);
        used += w > 0 ? (size_t)w : 0;
    }
    return buf;
}

/* A whole decimal number: digits only (no sign, spaces or exponent),
 * checked with strtoull, errno and the end pointer. */
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

/* A finite decimal number: digits and one '.', no sign or exponent. */
static bool parse_decimal(const char *text, double *out)
{
    char *end;

    if (text[0] == '\0' || strspn(text, "0123456789.") != strlen(text) ||
        strchr(text, '.') != strrchr(text, '.') || strcmp(text, ".") == 0)
        return false;
    errno = 0;
    *out = strtod(text, &end);
    return errno == 0 && *end == '\0' && isfinite(*out);
}

static int bad_enum(const cli_opt *o, const char *val)
{
    const char *best = vp_suggest(val, o->choices);
    char list[400];

    if (best != NULL)
        return cli_usage_error("unknown %s '%s' (did you mean '%s'?)",
                               o->what, val, best);
    return cli_usage_error("unknown %s '%s' (expected %s)", o->what, val,
                           cli_list_words(o->choices, list, sizeof list));
}

/* Check and keep an option's value; -1, or CLI_USAGE after the error. */
static int set_value(const cli_opt *o, const char *val, cli_val *v)
{
    vp_error err;

    switch (o->type) {
    case CLI_ARG_FLAG:
        break;
    case CLI_ARG_U64:
        if (parse_u64(val, o->min, o->max, &v->u))
            break;
        if (o->max == UINT64_MAX)
            return cli_usage_error("invalid value '%s' for --%s: expected "
                                   "an integer >= %" PRIu64, val, o->name,
                                   o->min);
        return cli_usage_error("invalid value '%s' for --%s: expected an "
                               "integer from %" PRIu64 " to %" PRIu64, val,
                               o->name, o->min, o->max);
    case CLI_ARG_SIZE:
        if (vp_size_parse(val, &v->u, &err) != VP_OK)
            return cli_usage_error("--%s: %s", o->name, err.msg);
        break;
    case CLI_ARG_DOUBLE:
        if (!parse_decimal(val, &v->d) || v->d < o->dmin || v->d > o->dmax)
            return cli_usage_error("invalid value '%s' for --%s: expected a "
                                   "number from %g to %g", val, o->name,
                                   o->dmin, o->dmax);
        break;
    case CLI_ARG_ENUM:
        for (v->choice = 0; o->choices[v->choice] != NULL; v->choice++)
            if (strcmp(o->choices[v->choice], val) == 0)
                break;
        if (o->choices[v->choice] == NULL)
            return bad_enum(o, val);
        break;
    case CLI_ARG_STRING:
        if (val[0] == '\0')
            return cli_usage_error("--%s needs a %s", o->name, o->metavar);
        break;
    }
    return -1;
}

static int keep(const cli_opt *o, const char *val, int at, cli_val *v)
{
    int rc = set_value(o, val, v);

    if (rc >= 0)
        return rc;
    v->given = true;
    v->at = at;
    v->text = val;
    if (o->repeat) {
        const char **l = realloc(v->list, (v->n_list + 1) * sizeof *l);
        if (l == NULL)
            return cli_fail("out of memory");
        v->list = l;
        v->list[v->n_list++] = val;
    }
    return -1;
}

/* One option argument at argv[*i] (and its value at argv[*i + 1]). */
static int option(const cli_spec *s, int argc, char **argv, int *i,
                  cli_args *a)
{
    const char *arg = argv[*i], *eq = NULL, *val = NULL;
    const cli_opt *o;

    if (arg[1] == '-') {
        eq = strchr(arg + 2, '=');
        o = find_long(s, arg + 2, eq ? (size_t)(eq - arg - 2) : strlen(arg + 2));
    } else {
        o = arg[2] == '\0' ? find_short(s, arg[1]) : NULL;
    }
    if (o == NULL)
        return unknown_option(s, arg);
    if (o->id == CLI_OPT_HELP) {
        s->help(stdout);
        return CLI_OK;
    }
    if (o->metavar == NULL) {
        if (eq != NULL)
            return cli_usage_error("option --%s takes no value", o->name);
    } else if (eq != NULL) {
        val = eq + 1;
    } else if (*i + 1 < argc) {
        val = argv[++*i];
    } else {
        return cli_usage_error("option --%s needs a value (%s)", o->name,
                               o->metavar);
    }
    return keep(o, val != NULL ? val : "", *i, &a->v[o->id]);
}

int cli_args_parse(const cli_spec *s, int argc, char **argv, cli_args *a)
{
    bool only_operands = false;

    memset(a, 0, sizeof *a);
    a->operands = calloc((size_t)(argc > 0 ? argc : 1), sizeof *a->operands);
    if (a->operands == NULL)
        return cli_fail("out of memory");
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        int rc;

        if (!only_operands && strcmp(arg, "--") == 0) {
            if (s->rest) {
                a->rest = argv + i + 1;
                a->n_rest = (size_t)(argc - i - 1);
                break;
            }
            only_operands = true;
        } else if (only_operands || arg[0] != '-' || arg[1] == '\0') {
            if (a->n_operands == s->max_operands)
                return cli_usage_error("unexpected argument '%s' (%s)", arg,
                                       s->extra_hint);
            a->operands[a->n_operands++] = arg;
        } else if ((rc = option(s, argc, argv, &i, a)) >= 0) {
            return rc;
        }
    }
    return -1;
}

void cli_args_free(cli_args *a)
{
    for (size_t k = 0; k < CLI_MAX_OPTS; k++)
        free(a->v[k].list);
    free(a->operands);
    memset(a, 0, sizeof *a);
}

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

void cli_opts_help(FILE *f, const cli_spec *s)
{
    char left[64];

    for (size_t k = 0; k < s->n_opts; k++) {
        const cli_opt *o = &s->opts[k];

        if (!visible(s, o))
            continue;
        snprintf(left, sizeof left, "%c%c%c --%s%s%s",
                 o->short_name ? '-' : ' ',
                 o->short_name ? o->short_name : ' ',
                 o->short_name ? ',' : ' ', o->name, o->metavar ? " " : "",
                 o->metavar ? o->metavar : "");
        if (strlen(left) + 4 > HELP_COLUMN)
            fprintf(f, "  %s\n%*s", left, HELP_COLUMN, "");
        else
            fprintf(f, "  %-*s", HELP_COLUMN - 2, left);
        help_wrap(f, o->help);
    }
}

void cli_help_page(FILE *f, const char *head, const cli_opt *opts, size_t n,
                   const char *tail)
{
    cli_spec s = {opts, n, 0, 0, NULL, false, NULL};

    fputs(head, f);
    cli_opts_help(f, &s);
    fputs(tail, f);
    cli_exit_help(f);
}
