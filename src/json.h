/* vramplan internal: JSON documents read through jansson, with positions,
 * and schemas for the objects the library reads (ground-truth case lines,
 * their env line, validation bounds, vp-calibrate's raw output). Not
 * installed.
 *
 * jansson parses and owns the values; it keeps no positions, so
 * vp__jdoc_parse walks the (already validated) text once more and records,
 * for every value in document order, where it starts (1-based line and
 * column, UTF-8 sequences counting as one column) and, for a member of an
 * object, where its key is. Errors about a value then point at it,
 * file:line:column, as the YAML loaders' do. */
#ifndef VRAMPLAN_JSON_H
#define VRAMPLAN_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "vramplan/error.h"

/* Where a token is: 1-based line and column, width in columns. */
typedef struct vp_jpos {
    uint32_t line, col, width;
} vp_jpos;

/* One value of a document. Nodes are in document order; node 0 is the
 * root. */
typedef struct vp_jnode {
    json_t *value;          /* borrowed from the document's tree        */
    int parent;             /* the containing object or array, -1: root */
    int first_child, next;  /* members or elements in order, -1: none   */
    char *key;              /* the member's key (decoded), NULL if none */
    vp_jpos key_pos, pos;
} vp_jnode;

typedef struct vp_jdoc {
    json_t *root;
    const char *path;       /* for messages; borrowed                   */
    vp_jnode *nodes;
    size_t n_nodes, cap;
} vp_jdoc;

/* Parse exactly one JSON value from buf (len bytes; the text starts on
 * line first_line of path). Strict RFC 8259 (jansson): no comments,
 * trailing commas or unquoted keys; duplicate keys, nesting deeper than
 * VP_MAX_NEST and numbers out of range are refused. VP_ESYNTAX (or
 * VP_ELIMIT) with path:line:col, VP_ENOMEM. On success the caller owns *d
 * (vp__jdoc_destroy); on failure *d needs no destroy. */
vp_status vp__jdoc_parse(vp_jdoc *d, const char *buf, size_t len,
                         const char *path, uint32_t first_line,
                         vp_error *err);
void vp__jdoc_destroy(vp_jdoc *d);

/* The member `key` of the object at node obj, or -1. */
int vp__jdoc_member(const vp_jdoc *d, int obj, const char *key);

/* An error at node `node` (at its key when at_key and it has one; at the
 * start of the document when node < 0). Returns code. */
vp_status vp__jerr(const vp_jdoc *d, int node, bool at_key, vp_status code,
                   vp_error *err, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 6, 7)))
#endif
    ;

/* ---- schemas ------------------------------------------------------------
 *
 * An object is checked against a table of fields, one row each: its name,
 * its type and range, whether it is required, and the handler that takes
 * its value. A key that no row names is an error that names it (with a
 * "did you mean"); a row of type VP_JT_LATER is a field that a later
 * version will read: it is refused by name ("not supported yet") rather
 * than ignored. Adding a field is one row and its handler. */

typedef enum {
    VP_JT_STRING,  /* a non-empty string                                  */
    VP_JT_U64,     /* an integer in [min, max]                            */
    VP_JT_NUMBER,  /* a finite number in [lo, hi] (lo excluded if lo_open) */
    VP_JT_BOOL,
    VP_JT_ENUM,    /* one of choices                                      */
    VP_JT_ARRAY,   /* checked by the handler                              */
    VP_JT_OBJECT,  /* checked by the handler                              */
    VP_JT_ANY,     /* checked by the handler                              */
    VP_JT_LATER    /* refused: "not supported yet"                        */
} vp_jtype;

typedef struct vp_jfield vp_jfield;

/* A checked value, handed to the field's handler. */
typedef struct vp_jval {
    const vp_jdoc *doc;
    int node;               /* for errors: vp__jerr(doc, node, ...)       */
    const vp_jfield *field;
    json_t *json;
    const char *str;        /* VP_JT_STRING, VP_JT_ENUM                   */
    uint64_t u64;           /* VP_JT_U64                                  */
    double num;             /* VP_JT_NUMBER (and VP_JT_U64 as a double)   */
    bool b;                 /* VP_JT_BOOL                                 */
    int choice;             /* VP_JT_ENUM: index into field->choices      */
} vp_jval;

typedef vp_status (*vp_jhandler)(void *ctx, const vp_jval *v, vp_error *err);

struct vp_jfield {
    const char *name;
    vp_jtype type;
    bool required;
    uint64_t min, max;          /* VP_JT_U64                              */
    double lo, hi;              /* VP_JT_NUMBER                           */
    bool lo_open;               /* VP_JT_NUMBER: lo itself is refused     */
    const char *const *choices; /* VP_JT_ENUM, NULL-terminated            */
    vp_jhandler apply;          /* NULL: checked, kept as information     */
    size_t offset;              /* where the vp__jset_* handlers store the
                                   value in ctx                           */
};

/* Rows: a field checked and kept as information; one whose value a
 * vp__jset_* handler stores in member m of the context type T; one refused
 * as not supported yet. */
#define VP_JROW_INFO(n, t) {.name = n, .type = t, .max = UINT64_MAX, .hi = 1e300}
#define VP_JROW_STR(n, req, T, m)                                          \
    {.name = n, .type = VP_JT_STRING, .required = req,                     \
     .apply = vp__jset_str, .offset = offsetof(T, m)}
#define VP_JROW_U64(n, req, lo, hi_, T, m)                                 \
    {.name = n, .type = VP_JT_U64, .required = req, .min = lo, .max = hi_,  \
     .apply = vp__jset_u64, .offset = offsetof(T, m)}
#define VP_JROW_NUM(n, req, lo_, open, hi_, T, m)                          \
    {.name = n, .type = VP_JT_NUMBER, .required = req, .lo = lo_,          \
     .lo_open = open, .hi = hi_, .apply = vp__jset_num,                    \
     .offset = offsetof(T, m)}
#define VP_JROW_BOOL(n, req, T, m)                                         \
    {.name = n, .type = VP_JT_BOOL, .required = req,                       \
     .apply = vp__jset_bool, .offset = offsetof(T, m)}
#define VP_JROW_ENUM(n, req, ch, T, m)                                     \
    {.name = n, .type = VP_JT_ENUM, .required = req, .choices = ch,        \
     .apply = vp__jset_choice, .offset = offsetof(T, m)}
#define VP_JROW_LATER(n) {.name = n, .type = VP_JT_LATER}

/* Handlers that store a checked value at ctx + field->offset: a
 * const char * (string or enum name), an int (the enum's choice), a
 * uint64_t, a double, a bool, or the value's node (an int, for fields
 * checked later). */
vp_status vp__jset_str(void *ctx, const vp_jval *v, vp_error *err);
vp_status vp__jset_choice(void *ctx, const vp_jval *v, vp_error *err);
vp_status vp__jset_u64(void *ctx, const vp_jval *v, vp_error *err);
vp_status vp__jset_num(void *ctx, const vp_jval *v, vp_error *err);
vp_status vp__jset_bool(void *ctx, const vp_jval *v, vp_error *err);
vp_status vp__jset_node(void *ctx, const vp_jval *v, vp_error *err);

/* Check the object at node obj against fields[0..n) and call each present
 * field's handler with ctx, in the order of the text. `what` names the
 * object in messages ("a case", "the env line"). VP_ESCHEMA for an
 * unknown, missing or mistyped field, VP_ERANGE for a value out of range,
 * VP_EUNSUPPORTED for a VP_JT_LATER field, or the handler's status. */
vp_status vp__jschema_check(const vp_jdoc *d, int obj,
                            const vp_jfield *fields, size_t n,
                            const char *what, void *ctx, vp_error *err);

/* A kind of line in a JSON-lines file: its "kind" value and the rows of
 * its other fields. */
typedef struct vp_jkind {
    const char *name;
    const vp_jfield *rows;
    size_t n;
} vp_jkind;

/* Check a line (node 0 of d) whose string member "kind" names one of
 * kinds[0..n_kinds): *kind gets its index, and the line is checked against
 * that kind's rows (and "kind") with vp__jschema_check. VP_ESCHEMA for a
 * line that is not an object, has no "kind" string or an unknown one. */
vp_status vp__jdoc_check_kind(const vp_jdoc *d, const vp_jkind *kinds,
                              size_t n_kinds, const char *what, void *ctx,
                              int *kind, vp_error *err);

/* The lines of a JSON-lines file, one at a time, with a cap on a line's
 * length so that /dev/zero or a binary file stops at once. */
typedef struct vp_jlines {
    void *file;             /* FILE *                                     */
    const char *path;
    char *buf;
    size_t cap, max;
    uint32_t line;          /* of the line last returned                  */
} vp_jlines;

vp_status vp__jlines_open(vp_jlines *r, const char *path, size_t max_len,
                          vp_error *err);
/* The next line that holds anything but white space: *text (valid until
 * the next call, NUL-terminated, newline removed), *len, r->line its
 * number. *end is set at the end of the file. VP_ELIMIT for a line over
 * the cap, VP_ESYNTAX for a NUL byte, VP_EIO. */
vp_status vp__jlines_next(vp_jlines *r, const char **text, size_t *len,
                          bool *end, vp_error *err);
void vp__jlines_close(vp_jlines *r);

#endif
