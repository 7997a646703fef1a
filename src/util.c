/* Small shared helpers: the arena, array growth, name suggestions, glob
 * matching, aborts. */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"
#include "vramplan/resource.h"

_Noreturn void vp__abort(const char *file, int line, const char *expr)
{
    fprintf(stderr, "%s:%d: VP_ASSERT(%s) failed\n", file, line, expr);
    abort();
}

vp_status vp__error_at_pos(vp_error *err, vp_status code, const char *path,
                           vp_srcpos at, const char *fmt, ...)
{
    char msg[sizeof(err->msg)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return vp_error_at(err, code, path, at.line, at.col, at.width, "%s",
                       msg);
}

struct vp_arena_chunk {
    vp_arena_chunk *next;
    size_t used, size;
    max_align_t data[];
};

#define ARENA_CHUNK (64u * 1024u)

void *vp__arena_alloc(vp_arena *a, size_t n)
{
    size_t align = sizeof(max_align_t);
    if (n > SIZE_MAX - align)
        return NULL;
    n = (n + align - 1) / align * align;
    vp_arena_chunk *c = a->head;
    if (!c || c->size - c->used < n) {
        size_t size = n > ARENA_CHUNK ? n : ARENA_CHUNK;
        c = malloc(sizeof(*c) + size);
        if (!c)
            return NULL;
        c->used = 0;
        c->size = size;
        c->next = a->head;
        a->head = c;
    }
    void *p = (char *)c->data + c->used;
    c->used += n;
    memset(p, 0, n);
    return p;
}

char *vp__arena_strdup(vp_arena *a, const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = vp__arena_alloc(a, n);
    if (p)
        memcpy(p, s, n);
    return p;
}

char *vp__arena_printf(vp_arena *a, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return NULL;
    char *p = vp__arena_alloc(a, (size_t)n + 1);
    if (!p)
        return NULL;
    va_start(ap, fmt);
    vsnprintf(p, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return p;
}

void vp__arena_destroy(vp_arena *a)
{
    vp_arena_chunk *c = a->head;
    while (c) {
        vp_arena_chunk *next = c->next;
        free(c);
        c = next;
    }
    a->head = NULL;
}

vp_status vp__fopen_input(const char *path, FILE **out, vp_error *err)
{
    *out = NULL;
    /* O_NONBLOCK: opening a FIFO with no writer would wait forever */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return vp_error_set(err, VP_EIO, "cannot open '%s': %s", path,
                            strerror(errno));
    struct stat st;
    const char *why = NULL;
    if (fstat(fd, &st) != 0)
        why = strerror(errno);
    else if (S_ISDIR(st.st_mode))
        why = "it is a directory";
    else if (!S_ISREG(st.st_mode))
        why = "not a regular file (a FIFO, socket or device)";
    int fl = why ? 0 : fcntl(fd, F_GETFL);
    if (!why && (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0))
        why = strerror(errno);
    FILE *fp = why ? NULL : fdopen(fd, "rb");
    if (fp == NULL) {
        vp_status e = vp_error_set(err, VP_EIO, "cannot read '%s': %s", path,
                                   why ? why : strerror(errno));
        close(fd);
        return e;
    }
    *out = fp;
    return VP_OK;
}

vp_status vp__read_file(const char *path, size_t max, char **buf,
                        size_t *len, vp_error *err)
{
    *buf = NULL;
    *len = 0;
    FILE *fp;
    VP_TRY(vp__fopen_input(path, &fp, err));
    char *b = malloc(max + 2);
    if (!b) {
        fclose(fp);
        return vp_error_set(err, VP_ENOMEM, "out of memory");
    }
    size_t n = fread(b, 1, max + 1, fp);
    bool bad = ferror(fp) != 0;
    fclose(fp);
    if (bad) {
        free(b);
        return vp_error_set(err, VP_EIO, "cannot read '%s': %s", path,
                            strerror(errno));
    }
    b[n] = '\0';
    *buf = b;
    *len = n;
    return VP_OK;
}

vp_status vp_file_read(const char *path, size_t max, char **buf,
                       size_t *len, vp_error *err)
{
    vp_error_clear(err);
    return vp__read_file(path, max, buf, len, err);
}

/* (key, value) pairs v[0..n) sorted by key: a stable radix sort, a
 * digit a pass from the lowest bit in which two keys differ to the
 * highest (segment addresses are 2 MiB apart: two or three passes); tmp
 * has room for n pairs. Returns where the sorted pairs are (v or tmp),
 * NULL when memory for the counts runs out. */
uint64_t *vp__radix_pairs(uint64_t *v, uint64_t *tmp, size_t n)
{
    uint64_t diff = 0;
    for (size_t i = 1; i < n; i++)
        diff |= v[2 * i] ^ v[0];
    if (!diff)
        return v;
    unsigned low = 0, span = 0;
    while (!((diff >> low) & 1))
        low++;
    while (span < 64 - low && (diff >> low >> span))
        span++;
    /* the bits that differ (span, from bit low) in as few passes as
     * digits of at most 8 bits below 1,024 pairs (fewer counts to clear
     * and sum per pass), of 11 above, allow; the passes' digits of one
     * width (addresses of 29 bits: 3 passes of 10, not 4 of 8) */
    unsigned most = n < 1024 ? 8 : 11;
    unsigned passes = (span + most - 1) / most;
    unsigned bits = (span + passes - 1) / passes;
    size_t digits = (size_t)1 << bits;
    size_t *at = malloc((digits + 1) * sizeof *at);
    if (!at)
        return NULL;
    uint64_t *src = v, *dst = tmp;
    for (unsigned sh = low; sh < 64 && (diff >> sh); sh += bits) {
        memset(at, 0, (digits + 1) * sizeof *at);
        for (size_t i = 0; i < n; i++)
            at[((src[2 * i] >> sh) & (digits - 1)) + 1]++;
        for (size_t d = 0; d < digits; d++)
            at[d + 1] += at[d];
        for (size_t i = 0; i < n; i++) {
            size_t j = at[(src[2 * i] >> sh) & (digits - 1)]++;
            dst[2 * j] = src[2 * i];
            dst[2 * j + 1] = src[2 * i + 1];
        }
        uint64_t *t = src;
        src = dst;
        dst = t;
    }
    free(at);
    return src;
}

bool vp__grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return true;
    size_t ncap = *cap ? *cap : 16;
    while (ncap < need) {
        if (ncap > SIZE_MAX / 2)
            return false;
        ncap *= 2;
    }
    if (ncap > SIZE_MAX / elem)
        return false;
    void *np = realloc(*p, ncap * elem);
    if (!np)
        return false;
    *p = np;
    *cap = ncap;
    return true;
}

static int dcmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double vp__median_sort(double *v, size_t n)
{
    qsort(v, n, sizeof *v, dcmp);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2.0;
}

bool vp__words_grow_add(vp_words *w, const uint64_t *v, size_t k)
{
    if (k > SIZE_MAX - w->n ||
        !vp__grow((void **)&w->v, &w->cap, w->n + k, sizeof *w->v))
        return false;
    memcpy(w->v + w->n, v, k * sizeof *v);
    w->n += k;
    return true;
}

/* One dot-free part: '*' matches any run of characters. Greedy with one
 * backtrack point: linear in the lengths for each star (no exponential
 * blow-up however many stars). */
static bool part_match(const char *p, size_t pn, const char *s, size_t sn)
{
    size_t i = 0, j = 0, star = (size_t)-1, mark = 0;
    while (j < sn) {
        if (i < pn && p[i] == '*') {
            star = i++;
            mark = j;
        } else if (i < pn && p[i] == s[j]) {
            i++;
            j++;
        } else if (star != (size_t)-1) {
            i = star + 1;
            j = ++mark;
        } else {
            return false;
        }
    }
    while (i < pn && p[i] == '*')
        i++;
    return i == pn;
}

bool vp__glob_match(const char *pat, const char *s)
{
    /* '*' never crosses a '.': match part by part */
    for (;;) {
        const char *pd = strchr(pat, '.'), *sd = strchr(s, '.');
        size_t pn = pd ? (size_t)(pd - pat) : strlen(pat);
        size_t sn = sd ? (size_t)(sd - s) : strlen(s);
        if (!part_match(pat, pn, s, sn))
            return false;
        if (!pd || !sd)
            return !pd && !sd;
        pat = pd + 1;
        s = sd + 1;
    }
}

static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 64 || lb > 64)
        return 99;
    size_t prev[65], cur[65];
    for (size_t j = 0; j <= lb; j++)
        prev[j] = j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t sub = prev[j - 1] + (tolower((unsigned char)a[i - 1]) !=
                                        tolower((unsigned char)b[j - 1]));
            size_t del = prev[j] + 1, ins = cur[j - 1] + 1;
            cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
        memcpy(prev, cur, (lb + 1) * sizeof prev[0]);
    }
    return prev[lb];
}

void vp__free_each(void *const *ptrs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(ptrs[i]);
}

const char *vp__enum_name(const char *const *names, size_t n, int v)
{
    return v >= 0 && (size_t)v < n ? names[v] : "unknown";
}

int vp__enum_index(const char *const *names, size_t n, const char *s)
{
    for (size_t i = 0; s != NULL && i < n; i++)
        if (strcmp(names[i], s) == 0)
            return (int)i;
    return -1;
}

const char *vp__suggest(const char *word, const char *const *cands)
{
    const char *best = NULL;
    size_t best_d = 99;
    for (size_t i = 0; cands[i]; i++) {
        size_t dist = edit_distance(word, cands[i]);
        if (dist < best_d) {
            best_d = dist;
            best = cands[i];
        }
    }
    size_t len = strlen(word);
    size_t limit = len <= 4 ? 1 : len <= 8 ? 2 : 3;
    return best_d <= limit ? best : NULL;
}
