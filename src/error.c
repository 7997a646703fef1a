/* vramplan: status codes and the error record (error.h).
 *
 * The names and messages come from VP_ERRNO_MAP, so adding a code there is
 * the only change a new error needs. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "vramplan/error.h"

const char *vp_strerror(vp_status code)
{
    switch (code) {
    case VP_OK:
        return "success";
#define VP__ERR_MSG(name, val, msg) \
    case VP_E##name:                \
        return msg;
        VP_ERRNO_MAP(VP__ERR_MSG)
#undef VP__ERR_MSG
    }
    return "unknown error";
}

const char *vp_err_name(vp_status code)
{
    switch (code) {
    case VP_OK:
        return "VP_OK";
#define VP__ERR_NAME(name, val, msg) \
    case VP_E##name:                 \
        return "VP_E" #name;
        VP_ERRNO_MAP(VP__ERR_NAME)
#undef VP__ERR_NAME
    }
    return "VP_EUNKNOWN";
}

const char *vp_suggest(const char *word, const char *const *candidates)
{
    return vp__suggest(word, candidates);
}

void vp_error_clear(vp_error *err)
{
    if (err == NULL)
        return;
    memset(err, 0, sizeof *err);
    err->code = VP_OK;
}

/* Fill *err. The message is formatted into a local buffer first, and the
 * path copied before anything is cleared, so callers may pass err->msg or
 * err->path as arguments (to add context to an earlier error). */
static vp_status error_fill(vp_error *err, vp_status code, const char *path,
                            uint32_t line, uint32_t col, uint32_t width,
                            const char *fmt, va_list ap)
{
    char msg[sizeof err->msg];
    char where[sizeof err->path];

    if (err == NULL)
        return code;
    if (fmt != NULL)
        vsnprintf(msg, sizeof msg, fmt, ap);
    else
        snprintf(msg, sizeof msg, "%s", vp_strerror(code));
    snprintf(where, sizeof where, "%s", path != NULL ? path : "");

    vp_error_clear(err);
    err->code = code;
    err->line = line;
    err->col = col;
    err->width = width;
    memcpy(err->msg, msg, sizeof msg);
    memcpy(err->path, where, sizeof where);
    return code;
}

vp_status vp_error_set(vp_error *err, vp_status code, const char *fmt, ...)
{
    va_list ap;
    vp_status rc;

    va_start(ap, fmt);
    rc = error_fill(err, code, NULL, 0, 0, 0, fmt, ap);
    va_end(ap);
    return rc;
}

vp_status vp_error_at(vp_error *err, vp_status code, const char *path,
                      uint32_t line, uint32_t col, uint32_t width,
                      const char *fmt, ...)
{
    va_list ap;
    vp_status rc;

    va_start(ap, fmt);
    rc = error_fill(err, code, path, line, col, width, fmt, ap);
    va_end(ap);
    return rc;
}
