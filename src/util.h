/* Small shared helpers of the library's modules: invariants, the arena,
 * file reading, array growth, name suggestions and glob matching, and the
 * strict JSON syntax check. Not installed. */
#ifndef VRAMPLAN_UTIL_H
#define VRAMPLAN_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "vramplan/error.h"
#include "vramplan/model.h" /* the input limits, VP_MAX_* */
#include "vramplan/units.h" /* checked arithmetic */

/* Broken invariants only; bad input always takes the vp_error path. */
#define VP_ASSERT(x)                                                       \
    do {                                                                   \
        if (!(x))                                                          \
            vp__abort(__FILE__, __LINE__, #x);                             \
    } while (0)
_Noreturn void vp__abort(const char *file, int line, const char *expr);

/* Evaluate x, a vp_status; return it from the calling function unless it
 * is VP_OK. */
#define VP_TRY(x)                                                          \
    do {                                                                   \
        vp_status st_ = (x);                                               \
        if (st_ != VP_OK)                                                  \
            return st_;                                                    \
    } while (0)

/* ---- arena: strings and small objects freed in one call ---------------- */
typedef struct vp_arena_chunk vp_arena_chunk;
typedef struct vp_arena {
    vp_arena_chunk *head;
} vp_arena;
void *vp__arena_alloc(vp_arena *a, size_t n);           /* zeroed, NULL on OOM */
char *vp__arena_strdup(vp_arena *a, const char *s);
char *vp__arena_printf(vp_arena *a, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void vp__arena_destroy(vp_arena *a);

/* Read a whole file of at most max bytes (one more is read, so that the
 * caller can refuse a larger file). *buf is malloc'ed (caller frees), NUL
 * terminated. VP_EIO or VP_ENOMEM with *err set. */
vp_status vp__read_file(const char *path, size_t max, char **buf,
                        size_t *len, vp_error *err);

/* Open an input file for reading: a regular file only (a directory, a
 * FIFO or a device is VP_EIO saying so, without waiting for a writer). */
vp_status vp__fopen_input(const char *path, FILE **out, vp_error *err);

/* Grow *p (an array of *cap elements of size elem) to hold at least need. */
bool vp__grow(void **p, size_t *cap, size_t need, size_t elem);

/* The median of v[0..n) (n >= 1), sorting v in place. */
double vp__median_sort(double *v, size_t n);

/* (key, value) pairs of 64-bit words, v[0..2n), sorted by key, stable,
 * into v or tmp (room for n pairs): returns which, NULL when memory runs
 * out (util.c). */
uint64_t *vp__radix_pairs(uint64_t *v, uint64_t *tmp, size_t n);

/* A growing array of 64-bit words (a state written out to be compared). */
typedef struct vp_words {
    uint64_t *v;
    size_t n, cap;
} vp_words;
/* Append k words; false when memory runs out. Inline when they fit (a
 * state is written a few words at a time). */
bool vp__words_grow_add(vp_words *w, const uint64_t *v, size_t k);
static inline bool vp__words_add(vp_words *w, const uint64_t *v, size_t k)
{
    if (k > w->cap - w->n)
        return vp__words_grow_add(w, v, k);
    for (size_t i = 0; i < k; i++)
        w->v[w->n + i] = v[i];
    w->n += k;
    return true;
}

/* v x ppm / 1e6, rounded down, without overflow (ppm <= 1e6). */
static inline uint64_t vp__share_ppm(uint64_t v, uint32_t ppm)
{
    return v / 1000000 * ppm + v % 1000000 * ppm / 1000000;
}

/* A place in an input file, as errors give it (error.h): 1-based line and
 * column, and the width of the token. */
typedef struct vp_srcpos {
    uint32_t line, col, width;
} vp_srcpos;

/* An error at a place in the file `path`. */
vp_status vp__error_at_pos(vp_error *err, vp_status code, const char *path,
                           vp_srcpos at, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 5, 6)))
#endif
    ;

/* free() each of ptrs[0 .. n). */
void vp__free_each(void *const *ptrs, size_t n);

/* ---- enum names: a table of strings indexed by the enum's values ------- */
/* The callback of a public X-macro map (VP_PRECISION_MAP, ...) that keeps
 * the strings: {VP_PRECISION_MAP(VP__NAME_STR)} is the names table in the
 * map's order, which is the enum's (the enum is generated from the same
 * map). */
#define VP__NAME_STR(name, str) str,
/* names[v], or "unknown" for a value outside the table. */
const char *vp__enum_name(const char *const *names, size_t n, int v);
/* The index of s in names, or -1 (s NULL or not there). */
int vp__enum_index(const char *const *names, size_t n, const char *s);

/* The public name function of an enum, `const char *stem_name(type)`,
 * and its parser, `vp_status stem_parse(const char *, type *)` (VP_EARG
 * for a string that is not a name), over a static array `table`. */
#define VP__ENUM_NAME_FN(type, stem, table)                                \
    const char *stem##_name(type v)                                        \
    {                                                                      \
        return vp__enum_name(table, sizeof table / sizeof table[0],        \
                             (int)v);                                      \
    }
#define VP__ENUM_PARSE_FN(type, stem, table)                               \
    vp_status stem##_parse(const char *s, type *out)                       \
    {                                                                      \
        int i_ = vp__enum_index(table, sizeof table / sizeof table[0], s); \
        if (i_ < 0)                                                        \
            return VP_EARG;                                                \
        *out = (type)i_;                                                   \
        return VP_OK;                                                      \
    }

/* Closest of candidates to word, or NULL if nothing is close. */
const char *vp__suggest(const char *word, const char *const *candidates);

/* Glob match: '*' matches any run of characters except '.'. */
bool vp__glob_match(const char *pattern, const char *name);

/* Strict JSON syntax check (VP_ESYNTAX with line:column, VP_ELIMIT for
 * nesting deeper than VP_MAX_NEST). */
vp_status vp__json_check(const char *buf, size_t len, const char *path,
                         vp_error *err);

#endif
