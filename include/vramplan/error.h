/* vramplan: errors.
 *
 * Every fallible library call returns a vp_status (VP_OK is 0, errors are
 * negative) or NULL, and fills a caller-owned vp_error. The library never
 * prints and never exits. For input files the error carries the file, the
 * 1-based line and column, and the width of the offending token so that a
 * front end can underline it. */
#ifndef VRAMPLAN_ERROR_H
#define VRAMPLAN_ERROR_H

#include <stdint.h>

#define VP_ERRNO_MAP(XX)                                              \
    XX(NOMEM, -1, "out of memory")                                    \
    XX(IO, -2, "I/O error")                                           \
    XX(SYNTAX, -3, "syntax error")                                    \
    XX(SCHEMA, -4, "invalid model")                                   \
    XX(OVERFLOW, -5, "byte count overflows 64 bits")                  \
    XX(UNIT, -6, "unknown unit")                                      \
    XX(RANGE, -7, "value out of range")                               \
    XX(UNSUPPORTED, -8, "unsupported")                                \
    XX(ARG, -9, "invalid argument")                                   \
    XX(OOM, -10, "does not fit in the memory budget")                 \
    XX(LIMIT, -11, "input exceeds a limit")

typedef enum {
    VP_OK = 0,
#define VP__ERR_ENUM(name, val, msg) VP_E##name = val,
    VP_ERRNO_MAP(VP__ERR_ENUM)
#undef VP__ERR_ENUM
} vp_status;

typedef struct vp_error {
    vp_status code;
    char path[256];  /* input file, "" when the error is not about a file   */
    uint32_t line;   /* 1-based; 0 when unknown                              */
    uint32_t col;    /* 1-based; 0 when unknown                              */
    uint32_t width;  /* width of the offending token in columns, 0 unknown  */
    char msg[512];   /* human-readable message, without the position prefix */
} vp_error;

/* Short description of a status code ("out of memory"); never NULL. */
const char *vp_strerror(vp_status code);
/* Name of a status code ("VP_ENOMEM"); never NULL. */
const char *vp_err_name(vp_status code);

/* The candidate closest to `word` (edit distance, at most 1 for words of
 * up to 4 letters, 2 up to 8, else 3), or NULL when none is that close:
 * for "did you mean" messages. `candidates` is NULL-terminated. */
const char *vp_suggest(const char *word, const char *const *candidates);

/* Reset *err to VP_OK with empty fields. NULL is a no-op. */
void vp_error_clear(vp_error *err);

/* Fill *err (NULL is a no-op) and return code. msg is printf-style. */
vp_status vp_error_set(vp_error *err, vp_status code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Like vp_error_set, with a position in a file (line, col 1-based). */
vp_status vp_error_at(vp_error *err, vp_status code, const char *path,
                      uint32_t line, uint32_t col, uint32_t width,
                      const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 7, 8)))
#endif
    ;

#endif
