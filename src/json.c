/* JSON documents through jansson, with positions; schemas of the objects
 * the library reads; a JSON-lines reader with a cap on the line length
 * (json.h). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "json.h"

/* ---- positions ------------------------------------------------------------ */

typedef struct scan {
    vp_jdoc *d;
    const char *p, *end;
    uint32_t line, col;
    int depth;
    vp_error *err;
} scan;

static void adv(scan *s)
{
    if (*s->p == '\n') {
        s->line++;
        s->col = 1;
    } else if (((unsigned char)*s->p & 0xC0) != 0x80) {
        s->col++; /* columns are characters, not UTF-8 continuation bytes */
    }
    s->p++;
}

static void skip_ws(scan *s)
{
    while (s->p < s->end && strchr(" \t\r\n", *s->p) != NULL && *s->p)
        adv(s);
}

/* Past a string token (the text is valid JSON: it is closed). */
static void skip_string(scan *s)
{
    adv(s);
    while (s->p < s->end && *s->p != '"') {
        if (*s->p == '\\')
            adv(s);
        adv(s);
    }
    adv(s);
}

static int new_node(scan *s, json_t *v, int parent)
{
    vp_jdoc *d = s->d;

    if (d->n_nodes == d->cap &&
        !vp__grow((void **)&d->nodes, &d->cap, d->n_nodes + 1,
                  sizeof *d->nodes))
        return -1;
    vp_jnode *n = &d->nodes[d->n_nodes];
    memset(n, 0, sizeof *n);
    n->value = v;
    n->parent = parent;
    n->first_child = n->next = -1;
    n->pos = (vp_jpos){s->line, s->col, 1};
    return (int)d->n_nodes++;
}

/* The key whose token starts at s->p, decoded; malloc'ed. */
static char *scan_key(scan *s, vp_jpos *pos)
{
    const char *start = s->p;
    uint32_t col = s->col;
    char *key;

    skip_string(s);
    *pos = (vp_jpos){s->line, col, s->col - col};
    if (memchr(start, '\\', (size_t)(s->p - start)) == NULL) {
        size_t n = (size_t)(s->p - start) - 2;
        key = malloc(n + 1);
        if (key != NULL) {
            memcpy(key, start + 1, n);
            key[n] = '\0';
        }
        return key;
    }
    json_t *j = json_loadb(start, (size_t)(s->p - start), JSON_DECODE_ANY,
                           NULL);
    key = j != NULL && json_is_string(j) ? strdup(json_string_value(j))
                                         : NULL;
    json_decref(j);
    return key;
}

static vp_status scan_value(scan *s, json_t *v, int parent, int *out);

/* The members or elements of the container at node `self`. */
static vp_status scan_children(scan *s, json_t *v, int self, char close)
{
    int last = -1, child;
    size_t index = 0;

    adv(s);
    skip_ws(s);
    while (*s->p != close) {
        char *key = NULL;
        vp_jpos key_pos = {0, 0, 0};
        json_t *cv;

        if (close == '}') {
            if ((key = scan_key(s, &key_pos)) == NULL)
                return vp_error_set(s->err, VP_ENOMEM, "out of memory");
            skip_ws(s);
            adv(s); /* ':' */
            skip_ws(s);
            cv = json_object_get(v, key);
        } else {
            cv = json_array_get(v, index++);
        }
        vp_status st = scan_value(s, cv, self, &child);
        if (st != VP_OK) {
            free(key);
            return st;
        }
        s->d->nodes[child].key = key;
        s->d->nodes[child].key_pos = key_pos;
        if (last < 0)
            s->d->nodes[self].first_child = child;
        else
            s->d->nodes[last].next = child;
        last = child;
        skip_ws(s);
        if (*s->p == ',') {
            adv(s);
            skip_ws(s);
        }
    }
    adv(s);
    return VP_OK;
}

static vp_status scan_value(scan *s, json_t *v, int parent, int *out)
{
    int self = new_node(s, v, parent);
    uint32_t col = s->col;

    if (self < 0)
        return vp_error_set(s->err, VP_ENOMEM, "out of memory");
    *out = self;
    if (*s->p == '{' || *s->p == '[') {
        if (++s->depth > VP_MAX_NEST)
            return vp_error_at(s->err, VP_ELIMIT, s->d->path, s->line, s->col,
                               1, "nesting deeper than %d levels",
                               VP_MAX_NEST);
        vp_status st = scan_children(s, v, self, *s->p == '{' ? '}' : ']');
        s->depth--;
        return st;
    }
    if (*s->p == '"')
        skip_string(s);
    else
        while (s->p < s->end && strchr(",]} \t\r\n", *s->p) == NULL)
            adv(s);
    s->d->nodes[self].pos.width = s->col > col ? s->col - col : 1;
    return VP_OK;
}

/* jansson reports where it stopped, after the token it names ("... near
 * 'TOKEN'"): the error points at that token's start instead. */
static vp_status syntax_error(const vp_jdoc *d, const char *buf, size_t len,
                              uint32_t first_line, const json_error_t *je,
                              vp_error *err)
{
    size_t at = je->position > 0 ? (size_t)je->position : 0, tok = 0;
    const char *near = strstr(je->text, " near '");

    if (at > len)
        at = len;
    if (near != NULL && strlen(near) > 8) {
        tok = strlen(near) - 8; /* " near '" and the closing quote */
        tok = tok <= at ? tok : 0;
    }
    scan s = {NULL, buf, buf + at - tok, first_line, 1, 0, err};
    while (s.p < s.end)
        adv(&s);
    uint32_t col = s.col;
    s.end = buf + at;
    while (s.p < s.end)
        adv(&s);
    return vp_error_at(err, VP_ESYNTAX, d->path, s.line, col,
                       tok > 0 && s.col > col ? s.col - col : 1,
                       "malformed JSON: %s", je->text);
}

vp_status vp__jdoc_parse(vp_jdoc *d, const char *buf, size_t len,
                         const char *path, uint32_t first_line,
                         vp_error *err)
{
    json_error_t je;
    int root;

    memset(d, 0, sizeof *d);
    d->path = path;
    d->root = json_loadb(buf, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY,
                        &je);
    if (d->root == NULL)
        return syntax_error(d, buf, len, first_line, &je, err);
    scan s = {d, buf, buf + len, first_line, 1, 0, err};
    skip_ws(&s);
    vp_status st = scan_value(&s, d->root, -1, &root);
    if (st != VP_OK)
        vp__jdoc_destroy(d);
    return st;
}

void vp__jdoc_destroy(vp_jdoc *d)
{
    if (d == NULL)
        return;
    for (size_t i = 0; i < d->n_nodes; i++)
        free(d->nodes[i].key);
    free(d->nodes);
    json_decref(d->root);
    memset(d, 0, sizeof *d);
}

int vp__jdoc_member(const vp_jdoc *d, int obj, const char *key)
{
    if (obj < 0 || (size_t)obj >= d->n_nodes)
        return -1;
    for (int c = d->nodes[obj].first_child; c >= 0; c = d->nodes[c].next)
        if (d->nodes[c].key != NULL && strcmp(d->nodes[c].key, key) == 0)
            return c;
    return -1;
}

vp_status vp__jerr(const vp_jdoc *d, int node, bool at_key, vp_status code,
                   vp_error *err, const char *fmt, ...)
{
    char msg[sizeof err->msg];
    vp_jpos pos = {0, 0, 0};
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (node >= 0 && (size_t)node < d->n_nodes) {
        const vp_jnode *n = &d->nodes[node];
        pos = at_key && n->key != NULL ? n->key_pos : n->pos;
    } else if (d->n_nodes > 0) {
        pos = d->nodes[0].pos;
    }
    return vp_error_at(err, code, d->path, pos.line, pos.col, pos.width,
                       "%s", msg);
}

/* ---- schemas -------------------------------------------------------------- */

#define MAX_FIELDS 96

static const char *json_kind(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return "an integer";
    case JSON_REAL:
        return "a number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    default:
        return "null";
    }
}

static vp_status check_enum(const vp_jdoc *d, int node, const vp_jfield *f,
                            vp_jval *v, vp_error *err)
{
    char list[300] = "";
    size_t used = 0;

    for (int i = 0; f->choices[i] != NULL; i++)
        if (strcmp(v->str, f->choices[i]) == 0) {
            v->choice = i;
            return VP_OK;
        }
    const char *s = vp__suggest(v->str, f->choices);
    if (s != NULL)
        return vp__jerr(d, node, false, VP_ESCHEMA, err,
                        "unknown value '%.64s' for '%s' (did you mean "
                        "'%s'?)", v->str, f->name, s);
    for (int i = 0; f->choices[i] != NULL && used < sizeof list; i++) {
        int w = snprintf(list + used, sizeof list - used, "%s%s",
                         i ? ", " : "", f->choices[i]);
        used += w > 0 ? (size_t)w : 0;
    }
    return vp__jerr(d, node, false, VP_ESCHEMA, err,
                    "unknown value '%.64s' for '%s' (expected one of: %s)",
                    v->str, f->name, list);
}

static vp_status check_number(const vp_jdoc *d, int node, const vp_jfield *f,
                              vp_jval *v, vp_error *err)
{
    if (f->type == VP_JT_U64) {
        if (!json_is_integer(v->json))
            return vp__jerr(d, node, false, VP_ESCHEMA, err,
                            "'%s' must be an integer, not %s", f->name,
                            json_kind(v->json));
        json_int_t i = json_integer_value(v->json);
        if (i < 0 || (uint64_t)i < f->min || (uint64_t)i > f->max) {
            if (f->max == UINT64_MAX || f->max >= (uint64_t)INT64_MAX)
                return vp__jerr(d, node, false, VP_ERANGE, err,
                                "'%s' must be at least %" PRIu64 ", not %"
                                JSON_INTEGER_FORMAT, f->name, f->min, i);
            return vp__jerr(d, node, false, VP_ERANGE, err,
                            "'%s' must be from %" PRIu64 " to %" PRIu64
                            ", not %" JSON_INTEGER_FORMAT, f->name, f->min,
                            f->max, i);
        }
        v->u64 = (uint64_t)i;
        v->num = (double)i;
        return VP_OK;
    }
    if (!json_is_number(v->json))
        return vp__jerr(d, node, false, VP_ESCHEMA, err,
                        "'%s' must be a number, not %s", f->name,
                        json_kind(v->json));
    v->num = json_number_value(v->json);
    if (v->num < f->lo || (f->lo_open && v->num == f->lo) || v->num > f->hi)
        return vp__jerr(d, node, false, VP_ERANGE, err,
                        "'%s' must be %s %g and at most %g, not %g", f->name,
                        f->lo_open ? "above" : "at least", f->lo, f->hi,
                        v->num);
    return VP_OK;
}

/* Check one value against its row and fill *v. */
static vp_status check_value(const vp_jdoc *d, int node, const vp_jfield *f,
                             vp_jval *v, vp_error *err)
{
    json_t *j = d->nodes[node].value;

    memset(v, 0, sizeof *v);
    v->doc = d;
    v->node = node;
    v->field = f;
    v->json = j;
    switch (f->type) {
    case VP_JT_STRING:
    case VP_JT_ENUM:
        if (!json_is_string(j) || json_string_length(j) == 0)
            return vp__jerr(d, node, false, VP_ESCHEMA, err,
                            "'%s' must be a non-empty string, not %s",
                            f->name, json_is_string(j) ? "\"\""
                                                       : json_kind(j));
        v->str = json_string_value(j);
        return f->type == VP_JT_ENUM ? check_enum(d, node, f, v, err)
                                     : VP_OK;
    case VP_JT_U64:
    case VP_JT_NUMBER:
        return check_number(d, node, f, v, err);
    case VP_JT_BOOL:
        if (!json_is_boolean(j))
            return vp__jerr(d, node, false, VP_ESCHEMA, err,
                            "'%s' must be true or false, not %s", f->name,
                            json_kind(j));
        v->b = json_is_true(j);
        return VP_OK;
    case VP_JT_ARRAY:
    case VP_JT_OBJECT:
        if (f->type == VP_JT_ARRAY ? !json_is_array(j) : !json_is_object(j))
            return vp__jerr(d, node, false, VP_ESCHEMA, err,
                            "'%s' must be %s, not %s", f->name,
                            f->type == VP_JT_ARRAY ? "an array"
                                                   : "an object",
                            json_kind(j));
        return VP_OK;
    case VP_JT_ANY:
        return VP_OK;
    case VP_JT_LATER:
        break;
    }
    return vp__jerr(d, node, true, VP_EUNSUPPORTED, err,
                    "field '%s' is not supported yet", f->name);
}

vp_status vp__jschema_check(const vp_jdoc *d, int obj,
                            const vp_jfield *fields, size_t n,
                            const char *what, void *ctx, vp_error *err)
{
    const char *names[MAX_FIELDS + 1];
    bool seen[MAX_FIELDS] = {false};

    VP_ASSERT(n <= MAX_FIELDS);
    if (!json_is_object(d->nodes[obj].value))
        return vp__jerr(d, obj, false, VP_ESCHEMA, err,
                        "%s must be a JSON object, not %s", what,
                        json_kind(d->nodes[obj].value));
    for (size_t i = 0; i < n; i++)
        names[i] = fields[i].name;
    names[n] = NULL;
    for (int c = d->nodes[obj].first_child; c >= 0; c = d->nodes[c].next) {
        const char *key = d->nodes[c].key;
        size_t i = 0;

        while (i < n && strcmp(fields[i].name, key) != 0)
            i++;
        if (i == n) {
            const char *s = vp__suggest(key, names);
            return vp__jerr(d, c, true, VP_ESCHEMA, err,
                            "unknown field '%.64s' in %s%s%s%s", key, what,
                            s ? " (did you mean '" : "", s ? s : "",
                            s ? "'?)" : "");
        }
        vp_jval v;
        vp_status st = check_value(d, c, &fields[i], &v, err);
        if (st == VP_OK && fields[i].apply != NULL)
            st = fields[i].apply(ctx, &v, err);
        if (st != VP_OK)
            return st;
        seen[i] = true;
    }
    for (size_t i = 0; i < n; i++)
        if (fields[i].required && !seen[i])
            return vp__jerr(d, obj, false, VP_ESCHEMA, err,
                            "%s has no \"%s\"", what, fields[i].name);
    return VP_OK;
}

vp_status vp__jdoc_check_kind(const vp_jdoc *d, const vp_jkind *kinds,
                              size_t n_kinds, const char *what, void *ctx,
                              int *kind, vp_error *err)
{
    static const vp_jfield kind_row = VP_JROW_INFO("kind", VP_JT_STRING);
    int node = vp__jdoc_member(d, 0, "kind");
    json_t *v = node >= 0 ? d->nodes[node].value : NULL;
    vp_jfield rows[MAX_FIELDS];
    size_t k = 0;

    if (!json_is_object(d->root))
        return vp__jerr(d, 0, false, VP_ESCHEMA, err,
                        "%s must be a JSON object, not %s", what,
                        json_kind(d->root));
    if (node < 0 || !json_is_string(v))
        return vp__jerr(d, node, false, VP_ESCHEMA, err,
                        "%s needs a \"kind\" string", what);
    while (k < n_kinds && strcmp(json_string_value(v), kinds[k].name) != 0)
        k++;
    if (k == n_kinds)
        return vp__jerr(d, node, false, VP_ESCHEMA, err,
                        "unknown kind '%.32s'", json_string_value(v));
    VP_ASSERT(kinds[k].n < MAX_FIELDS);
    rows[0] = kind_row;
    memcpy(rows + 1, kinds[k].rows, kinds[k].n * sizeof *rows);
    *kind = (int)k;
    return vp__jschema_check(d, 0, rows, kinds[k].n + 1, what, ctx, err);
}

#define SET(type, member)                                                  \
    do {                                                                   \
        (void)err;                                                         \
        *(type *)(void *)((char *)ctx + v->field->offset) = (member);      \
        return VP_OK;                                                      \
    } while (0)

vp_status vp__jset_str(void *ctx, const vp_jval *v, vp_error *err)
{
    SET(const char *, v->str);
}

vp_status vp__jset_choice(void *ctx, const vp_jval *v, vp_error *err)
{
    SET(int, v->choice);
}

vp_status vp__jset_u64(void *ctx, const vp_jval *v, vp_error *err)
{
    SET(uint64_t, v->u64);
}

vp_status vp__jset_num(void *ctx, const vp_jval *v, vp_error *err)
{
    SET(double, v->num);
}

vp_status vp__jset_bool(void *ctx, const vp_jval *v, vp_error *err)
{
    SET(bool, v->b);
}

vp_status vp__jset_node(void *ctx, const vp_jval *v, vp_error *err)
{
    SET(int, v->node);
}

#undef SET

/* ---- JSON lines ----------------------------------------------------------- */

vp_status vp__jlines_open(vp_jlines *r, const char *path, size_t max_len,
                          vp_error *err)
{
    memset(r, 0, sizeof *r);
    r->path = path;
    r->max = max_len;
    FILE *f;
    VP_TRY(vp__fopen_input(path, &f, err));
    r->file = f;
    return VP_OK;
}

/* One line into r->buf (without its newline); false at the end. */
static vp_status read_line(vp_jlines *r, size_t *len, bool *got,
                           vp_error *err)
{
    FILE *f = r->file;
    int c;

    *len = 0;
    *got = false;
    while ((c = getc(f)) != EOF && c != '\n') {
        *got = true;
        if (c == '\0')
            return vp_error_at(err, VP_ESYNTAX, r->path, r->line + 1,
                               (uint32_t)*len + 1, 1,
                               "NUL byte: not a text file");
        if (*len >= r->max)
            return vp_error_at(err, VP_ELIMIT, r->path, r->line + 1, 1, 1,
                               "line longer than %zu bytes", r->max);
        if (*len + 1 >= r->cap &&
            !vp__grow((void **)&r->buf, &r->cap, *len + 2, 1))
            return vp_error_set(err, VP_ENOMEM, "out of memory");
        r->buf[(*len)++] = (char)c;
    }
    if (ferror(f))
        return vp_error_at(err, VP_EIO, r->path, r->line + 1, 0, 0,
                           "cannot read '%s'", r->path);
    *got = *got || c == '\n';
    if (*got) {
        r->line++;
        if (*len > 0 && r->buf[*len - 1] == '\r')
            (*len)--;
        if (r->buf != NULL)
            r->buf[*len] = '\0';
    }
    return VP_OK;
}

vp_status vp__jlines_next(vp_jlines *r, const char **text, size_t *len,
                          bool *end, vp_error *err)
{
    bool got;

    *end = false;
    for (;;) {
        vp_status st = read_line(r, len, &got, err);
        if (st != VP_OK)
            return st;
        if (!got) {
            *end = true;
            return VP_OK;
        }
        if (*len > 0 && strspn(r->buf, " \t") < *len) {
            *text = r->buf;
            return VP_OK;
        }
    }
}

void vp__jlines_close(vp_jlines *r)
{
    if (r->file != NULL)
        fclose(r->file);
    free(r->buf);
    memset(r, 0, sizeof *r);
}
