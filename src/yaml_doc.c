/* YAML documents with positions: a safe loader (no aliases, bounded depth
 * and size, no duplicate keys) and typed accessors whose errors point at the
 * offending node as file:line:column. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "yaml_doc.h"

static vp_status mark_error(vp_ydoc *d, yaml_mark_t m, uint32_t width,
                            vp_status code, vp_error *err, const char *fmt,
                            va_list ap)
{
    char msg[sizeof(err->msg)];
    vsnprintf(msg, sizeof msg, fmt, ap);
    return vp_error_at(err, code, d->path, (uint32_t)m.line + 1,
                       (uint32_t)m.column + 1, width, "%s", msg);
}

static vp_status at_mark(vp_ydoc *d, yaml_mark_t m, uint32_t width,
                         vp_status code, vp_error *err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vp_status st = mark_error(d, m, width, code, err, fmt, ap);
    va_end(ap);
    return st;
}

vp_srcpos vp__ypos(const yaml_node_t *n)
{
    uint32_t width = 1;
    if (n && n->type == YAML_SCALAR_NODE) {
        width = (uint32_t)n->data.scalar.length;
        if (n->data.scalar.style == YAML_SINGLE_QUOTED_SCALAR_STYLE ||
            n->data.scalar.style == YAML_DOUBLE_QUOTED_SCALAR_STYLE)
            width += 2;
        if (width == 0)
            width = 1;
        if (width > 200)
            width = 200;
    }
    yaml_mark_t m = n ? n->start_mark : (yaml_mark_t){0, 0, 0};
    return (vp_srcpos){(uint32_t)m.line + 1, (uint32_t)m.column + 1, width};
}

vp_status vp__yerr(vp_ydoc *d, const yaml_node_t *n, vp_status code,
                   vp_error *err, const char *fmt, ...)
{
    vp_srcpos at = vp__ypos(n);
    yaml_mark_t m = {0, at.line - 1, at.col - 1};
    va_list ap;
    va_start(ap, fmt);
    vp_status st = mark_error(d, m, at.width, code, err, fmt, ap);
    va_end(ap);
    return st;
}

static const char *parser_problem(const yaml_parser_t *p)
{
    if (p->problem)
        return p->problem;
    switch (p->error) {
    case YAML_MEMORY_ERROR:
        return "out of memory";
    case YAML_READER_ERROR:
        return "invalid character encoding";
    default:
        return "malformed YAML";
    }
}

static vp_status parser_error(vp_ydoc *d, yaml_parser_t *p, vp_error *err)
{
    if (p->error == YAML_MEMORY_ERROR)
        return vp_error_set(err, VP_ENOMEM, "out of memory parsing %s",
                            d->path);
    yaml_mark_t m = p->problem_mark;
    if (p->error == YAML_READER_ERROR) {
        /* the reader reports a byte offset only: count lines up to it */
        size_t off = p->problem_offset;
        m.line = 0;
        m.column = off;
        if (d->buf && off <= d->len) {
            size_t line_start = 0;
            for (size_t i = 0; i < off; i++)
                if (d->buf[i] == '\n') {
                    m.line++;
                    line_start = i + 1;
                }
            m.column = off - line_start;
        }
    }
    if (p->context)
        return at_mark(d, m, 1, VP_ESYNTAX, err, "%s (%s)", parser_problem(p),
                       p->context);
    return at_mark(d, m, 1, VP_ESYNTAX, err, "%s", parser_problem(p));
}

/* Event pre-pass: refuse aliases/anchors, deep nesting, huge documents,
 * more than one document. */
static vp_status prepass(vp_ydoc *d, const char *buf, size_t len,
                         vp_error *err)
{
    yaml_parser_t p;
    if (!yaml_parser_initialize(&p))
        return vp_error_set(err, VP_ENOMEM, "out of memory");
    yaml_parser_set_input_string(&p, (const unsigned char *)buf, len);
    vp_status st = VP_OK;
    int depth = 0, docs = 0;
    uint64_t nodes = 0;
    for (;;) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&p, &ev)) {
            st = parser_error(d, &p, err);
            break;
        }
        yaml_event_type_t t = ev.type;
        yaml_mark_t m = ev.start_mark;
        const yaml_char_t *anchor = NULL;
        if (t == YAML_SCALAR_EVENT)
            anchor = ev.data.scalar.anchor;
        else if (t == YAML_SEQUENCE_START_EVENT)
            anchor = ev.data.sequence_start.anchor;
        else if (t == YAML_MAPPING_START_EVENT)
            anchor = ev.data.mapping_start.anchor;
        yaml_event_delete(&ev);
        if (t == YAML_ALIAS_EVENT || anchor) {
            st = at_mark(d, m, 1, VP_ESCHEMA, err,
                         "YAML anchors and aliases are not allowed in model "
                         "files");
            break;
        }
        if (t == YAML_DOCUMENT_START_EVENT && ++docs > 1) {
            st = at_mark(d, m, 1, VP_ESCHEMA, err,
                         "more than one YAML document in the file");
            break;
        }
        if (t == YAML_SCALAR_EVENT || t == YAML_SEQUENCE_START_EVENT ||
            t == YAML_MAPPING_START_EVENT) {
            if (++nodes > VP_MAX_YAML_NODES) {
                st = at_mark(d, m, 1, VP_ELIMIT, err,
                             "document has more than %u nodes",
                             VP_MAX_YAML_NODES);
                break;
            }
        }
        if (t == YAML_SEQUENCE_START_EVENT || t == YAML_MAPPING_START_EVENT) {
            if (++depth > VP_MAX_NEST) {
                st = at_mark(d, m, 1, VP_ELIMIT, err,
                             "nesting deeper than %d levels", VP_MAX_NEST);
                break;
            }
        } else if (t == YAML_SEQUENCE_END_EVENT ||
                   t == YAML_MAPPING_END_EVENT) {
            depth--;
        }
        if (t == YAML_STREAM_END_EVENT)
            break;
    }
    yaml_parser_delete(&p);
    return st;
}

typedef struct {
    const char *key;
    yaml_node_t *node;
} key_ref;

static int key_cmp(const void *a, const void *b)
{
    const key_ref *x = a, *y = b;
    int c = strcmp(x->key, y->key);
    if (c)
        return c;
    /* later position last */
    if (x->node->start_mark.index < y->node->start_mark.index)
        return -1;
    return x->node->start_mark.index > y->node->start_mark.index;
}

static vp_status check_duplicates(vp_ydoc *d, vp_error *err)
{
    for (yaml_node_t *n = d->doc.nodes.start; n < d->doc.nodes.top; n++) {
        if (n->type != YAML_MAPPING_NODE)
            continue;
        size_t cnt = (size_t)(n->data.mapping.pairs.top -
                              n->data.mapping.pairs.start);
        if (cnt < 2)
            continue;
        key_ref *refs = malloc(cnt * sizeof *refs);
        if (!refs)
            return vp_error_set(err, VP_ENOMEM, "out of memory");
        size_t k = 0;
        for (yaml_node_pair_t *pr = n->data.mapping.pairs.start;
             pr < n->data.mapping.pairs.top; pr++) {
            yaml_node_t *kn = yaml_document_get_node(&d->doc, pr->key);
            if (kn && kn->type == YAML_SCALAR_NODE)
                refs[k++] = (key_ref){(const char *)kn->data.scalar.value, kn};
        }
        qsort(refs, k, sizeof *refs, key_cmp);
        for (size_t i = 1; i < k; i++) {
            if (strcmp(refs[i].key, refs[i - 1].key) == 0) {
                yaml_node_t *dup = refs[i].node;
                yaml_node_t *first = refs[i - 1].node;
                vp_status st = vp__yerr(
                    d, dup, VP_ESCHEMA, err,
                    "duplicate key '%.64s' (first given on line %lu)",
                    refs[i].key, (unsigned long)first->start_mark.line + 1);
                free(refs);
                return st;
            }
        }
        free(refs);
    }
    return VP_OK;
}

vp_status vp__ydoc_load(vp_ydoc *d, const char *buf, size_t len,
                        vp_error *err)
{
    d->loaded = false;
    d->buf = buf;
    d->len = len;
    vp_status st = prepass(d, buf, len, err);
    if (st != VP_OK)
        return st;
    yaml_parser_t p;
    if (!yaml_parser_initialize(&p))
        return vp_error_set(err, VP_ENOMEM, "out of memory");
    yaml_parser_set_input_string(&p, (const unsigned char *)buf, len);
    if (!yaml_parser_load(&p, &d->doc)) {
        st = parser_error(d, &p, err);
        yaml_parser_delete(&p);
        return st;
    }
    yaml_parser_delete(&p);
    d->buf = NULL;
    d->loaded = true;
    if (!yaml_document_get_root_node(&d->doc))
        return vp_error_at(err, VP_ESCHEMA, d->path, 1, 1, 1,
                           "the file is empty");
    return check_duplicates(d, err);
}

void vp__ydoc_destroy(vp_ydoc *d)
{
    if (d->loaded)
        yaml_document_delete(&d->doc);
    d->loaded = false;
}

yaml_node_t *vp__ydoc_root(vp_ydoc *d)
{
    return yaml_document_get_root_node(&d->doc);
}

yaml_node_t *vp__ynode(vp_ydoc *d, int index)
{
    return yaml_document_get_node(&d->doc, index);
}

yaml_node_t *vp__ymap_get(vp_ydoc *d, yaml_node_t *map, const char *key,
                          yaml_node_t **key_out)
{
    if (!map || map->type != YAML_MAPPING_NODE)
        return NULL;
    for (yaml_node_pair_t *pr = map->data.mapping.pairs.start;
         pr < map->data.mapping.pairs.top; pr++) {
        yaml_node_t *kn = vp__ynode(d, pr->key);
        if (kn && kn->type == YAML_SCALAR_NODE &&
            strcmp((const char *)kn->data.scalar.value, key) == 0) {
            if (key_out)
                *key_out = kn;
            return vp__ynode(d, pr->value);
        }
    }
    return NULL;
}

static void list_choices(const char *const *c, char *buf, size_t n)
{
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; c[i] && used < n; i++) {
        int w = snprintf(buf + used, n - used, "%s%s", i ? ", " : "", c[i]);
        if (w < 0)
            break;
        used += (size_t)w;
    }
}

vp_status vp__ymap_check(vp_ydoc *d, yaml_node_t *map,
                         const char *const *allowed, const char *what,
                         vp_error *err)
{
    if (!map || map->type != YAML_MAPPING_NODE)
        return vp__yerr(d, map, VP_ESCHEMA, err, "%s must be a mapping",
                        what);
    for (yaml_node_pair_t *pr = map->data.mapping.pairs.start;
         pr < map->data.mapping.pairs.top; pr++) {
        yaml_node_t *kn = vp__ynode(d, pr->key);
        if (!kn || kn->type != YAML_SCALAR_NODE)
            return vp__yerr(d, kn, VP_ESCHEMA, err,
                            "keys of %s must be plain names", what);
        const char *k = (const char *)kn->data.scalar.value;
        bool ok = false;
        for (size_t i = 0; allowed[i]; i++)
            if (strcmp(k, allowed[i]) == 0)
                ok = true;
        if (ok)
            continue;
        const char *s = vp__suggest(k, allowed);
        if (s)
            return vp__yerr(d, kn, VP_ESCHEMA, err,
                            "unknown key '%.64s' in %s (did you mean '%s'?)",
                            k, what, s);
        char list[440];
        list_choices(allowed, list, sizeof list);
        return vp__yerr(d, kn, VP_ESCHEMA, err,
                        "unknown key '%.64s' in %s (expected one of: %s)", k,
                        what, list);
    }
    return VP_OK;
}

bool vp__yis_null(const yaml_node_t *n)
{
    if (!n || n->type != YAML_SCALAR_NODE)
        return false;
    if (n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return false;
    const char *v = (const char *)n->data.scalar.value;
    return !strcmp(v, "null") || !strcmp(v, "~") || !strcmp(v, "") ||
           !strcmp(v, "Null") || !strcmp(v, "NULL");
}

const char *vp__yscalar(const yaml_node_t *n)
{
    if (!n || n->type != YAML_SCALAR_NODE)
        return NULL;
    return (const char *)n->data.scalar.value;
}

static const char *kind_of(const yaml_node_t *n)
{
    if (!n)
        return "nothing";
    switch (n->type) {
    case YAML_MAPPING_NODE:
        return "a mapping";
    case YAML_SEQUENCE_NODE:
        return "a list";
    case YAML_SCALAR_NODE:
        if (n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
            return "a quoted string";
        return "a scalar";
    default:
        return "nothing";
    }
}

vp_status vp__yget_u64(vp_ydoc *d, yaml_node_t *n, uint64_t min, uint64_t max,
                       uint64_t *out, vp_error *err)
{
    const char *v = vp__yscalar(n);
    if (!v || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return vp__yerr(d, n, VP_ESCHEMA, err, "expected an integer, got %s",
                        kind_of(n));
    if (v[0] == '-') {
        return vp__yerr(d, n, VP_ERANGE, err,
                        "expected a positive integer, got '%.64s'", v);
    }
    const char *s = v[0] == '+' ? v + 1 : v;
    if (!isdigit((unsigned char)s[0]))
        return vp__yerr(d, n, VP_ESCHEMA, err,
                        "expected an integer, got '%.64s'", v);
    uint64_t x = 0;
    for (const char *c = s; *c; c++) {
        if (*c == '_')
            continue;
        if (!isdigit((unsigned char)*c))
            return vp__yerr(d, n, VP_ESCHEMA, err,
                            "expected an integer, got '%.64s'", v);
        unsigned dg = (unsigned)(*c - '0');
        if (x > (UINT64_MAX - dg) / 10)
            return vp__yerr(d, n, VP_ERANGE, err,
                            "'%.64s' is too large (at most %llu)", v,
                            (unsigned long long)max);
        x = x * 10 + dg;
    }
    if (x < min)
        return vp__yerr(d, n, VP_ERANGE, err,
                        "%llu is too small (at least %llu)",
                        (unsigned long long)x, (unsigned long long)min);
    if (x > max)
        return vp__yerr(d, n, VP_ERANGE, err,
                        "%llu is too large (at most %llu)",
                        (unsigned long long)x, (unsigned long long)max);
    *out = x;
    return VP_OK;
}

vp_status vp__yget_bool(vp_ydoc *d, yaml_node_t *n, bool *out, vp_error *err)
{
    const char *v = vp__yscalar(n);
    if (v && n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE) {
        if (!strcmp(v, "true") || !strcmp(v, "True") || !strcmp(v, "yes")) {
            *out = true;
            return VP_OK;
        }
        if (!strcmp(v, "false") || !strcmp(v, "False") || !strcmp(v, "no")) {
            *out = false;
            return VP_OK;
        }
    }
    return vp__yerr(d, n, VP_ESCHEMA, err,
                    "expected true or false, got %s%s%.64s%s", kind_of(n),
                    v ? " '" : "", v ? v : "", v ? "'" : "");
}

vp_status vp__yget_prob(vp_ydoc *d, yaml_node_t *n, double *out,
                        vp_error *err)
{
    const char *v = vp__yscalar(n);
    if (!v || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE || !*v)
        return vp__yerr(d, n, VP_ESCHEMA, err,
                        "expected a probability, got %s", kind_of(n));
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (*end || errno || isnan(x))
        return vp__yerr(d, n, VP_ESCHEMA, err,
                        "expected a probability, got '%.64s'", v);
    if (x < 0.0 || x >= 1.0)
        return vp__yerr(d, n, VP_ERANGE, err,
                        "a probability must be in [0, 1), got '%.64s'", v);
    *out = x;
    return VP_OK;
}

vp_status vp__yget_pos(vp_ydoc *d, yaml_node_t *n, double max, double *out,
                       vp_error *err)
{
    const char *v = vp__yscalar(n);
    if (!v || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE || !*v)
        return vp__yerr(d, n, VP_ESCHEMA, err, "expected a number, got %s",
                        kind_of(n));
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (*end || errno || !isfinite(x))
        return vp__yerr(d, n, VP_ESCHEMA, err,
                        "expected a number, got '%.64s'", v);
    if (x <= 0.0 || x > max)
        return vp__yerr(d, n, VP_ERANGE, err,
                        "must be above 0 and at most %g, got '%.64s'", max,
                        v);
    *out = x;
    return VP_OK;
}

vp_status vp__yget_str(vp_ydoc *d, yaml_node_t *n, const char **out,
                       vp_error *err)
{
    const char *v = vp__yscalar(n);
    if (!v)
        return vp__yerr(d, n, VP_ESCHEMA, err, "expected a string, got %s",
                        kind_of(n));
    *out = v;
    return VP_OK;
}

vp_status vp__yget_enum(vp_ydoc *d, yaml_node_t *n, const char *const *choices,
                        int *out, vp_error *err)
{
    const char *v = vp__yscalar(n);
    if (v) {
        for (int i = 0; choices[i]; i++) {
            if (!strcmp(v, choices[i])) {
                *out = i;
                return VP_OK;
            }
        }
    }
    char list[400]; /* with the message around it, within vp_error.msg */
    list_choices(choices, list, sizeof list);
    const char *s = v ? vp__suggest(v, choices) : NULL;
    if (s)
        return vp__yerr(d, n, VP_ESCHEMA, err,
                        "unknown value '%.64s' (did you mean '%s'?)", v, s);
    if (v)
        return vp__yerr(d, n, VP_ESCHEMA, err,
                        "unknown value '%.64s' (expected one of: %s)", v,
                        list);
    return vp__yerr(d, n, VP_ESCHEMA, err, "expected one of: %s", list);
}
