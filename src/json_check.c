/* Strict JSON syntax (RFC 8259) for Hugging Face config.json files. The
 * files are then read with the YAML loader, which accepts more than JSON
 * (unquoted keys, comments, trailing commas): this check refuses those
 * first, with the line and column of the first fault. */
#include <string.h>

#include "util.h"

typedef struct {
    const char *s;
    size_t n, i;
    uint32_t line, col;
    int depth;
    const char *path;
    vp_error *err;
} jp;

static vp_status jfail(jp *p, const char *what)
{
    return vp_error_at(p->err, VP_ESYNTAX, p->path, p->line, p->col, 1,
                       "malformed JSON: %s", what);
}

static void adv(jp *p)
{
    if (p->s[p->i] == '\n') {
        p->line++;
        p->col = 1;
    } else if (((unsigned char)p->s[p->i] & 0xc0) != 0x80) {
        p->col++; /* count characters, not UTF-8 continuation bytes */
    }
    p->i++;
}

static void ws(jp *p)
{
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' ||
                           p->s[p->i] == '\n' || p->s[p->i] == '\r'))
        adv(p);
}

static bool lit(jp *p, const char *w)
{
    size_t k = strlen(w);
    if (p->n - p->i < k || memcmp(p->s + p->i, w, k) != 0)
        return false;
    for (size_t j = 0; j < k; j++)
        adv(p);
    return true;
}

static vp_status value(jp *p);

static vp_status string(jp *p)
{
    adv(p); /* opening quote */
    while (p->i < p->n) {
        unsigned char c = (unsigned char)p->s[p->i];
        if (c == '"') {
            adv(p);
            return VP_OK;
        }
        if (c < 0x20)
            return jfail(p, "control character in a string");
        if (c == '\\') {
            adv(p);
            if (p->i >= p->n)
                break;
            char e = p->s[p->i];
            if (e == 'u') {
                adv(p);
                for (int k = 0; k < 4; k++) {
                    if (p->i >= p->n || !strchr("0123456789abcdefABCDEF",
                                                p->s[p->i]) ||
                        p->s[p->i] == '\0')
                        return jfail(p, "bad \\u escape");
                    adv(p);
                }
                continue;
            }
            if (!strchr("\"\\/bfnrt", e) || e == '\0')
                return jfail(p, "bad escape in a string");
        }
        adv(p);
    }
    return jfail(p, "unterminated string");
}

static vp_status number(jp *p)
{
    if (p->s[p->i] == '-')
        adv(p);
    if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9')
        return jfail(p, "expected a digit");
    if (p->s[p->i] == '0')
        adv(p);
    else
        while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9')
            adv(p);
    if (p->i < p->n && p->s[p->i] == '.') {
        adv(p);
        if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9')
            return jfail(p, "expected a digit after '.'");
        while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9')
            adv(p);
    }
    if (p->i < p->n && (p->s[p->i] == 'e' || p->s[p->i] == 'E')) {
        adv(p);
        if (p->i < p->n && (p->s[p->i] == '+' || p->s[p->i] == '-'))
            adv(p);
        if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9')
            return jfail(p, "expected a digit in the exponent");
        while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9')
            adv(p);
    }
    return VP_OK;
}

static vp_status container(jp *p, char close)
{
    if (++p->depth > VP_MAX_NEST)
        return vp_error_at(p->err, VP_ELIMIT, p->path, p->line, p->col, 1,
                           "nesting deeper than %d levels", VP_MAX_NEST);
    adv(p);
    ws(p);
    if (p->i < p->n && p->s[p->i] == close) {
        adv(p);
        p->depth--;
        return VP_OK;
    }
    for (;;) {
        ws(p);
        if (close == '}') {
            if (p->i >= p->n || p->s[p->i] != '"')
                return jfail(p, "expected a quoted key");
            vp_status st = string(p);
            if (st != VP_OK)
                return st;
            ws(p);
            if (p->i >= p->n || p->s[p->i] != ':')
                return jfail(p, "expected ':' after the key");
            adv(p);
        }
        vp_status st = value(p);
        if (st != VP_OK)
            return st;
        ws(p);
        if (p->i < p->n && p->s[p->i] == ',') {
            adv(p);
            ws(p);
            if (p->i < p->n && p->s[p->i] == close)
                return jfail(p, "trailing comma");
            continue;
        }
        if (p->i < p->n && p->s[p->i] == close) {
            adv(p);
            p->depth--;
            return VP_OK;
        }
        return jfail(p, close == '}' ? "expected ',' or '}'"
                                     : "expected ',' or ']'");
    }
}

static vp_status value(jp *p)
{
    ws(p);
    if (p->i >= p->n)
        return jfail(p, "unexpected end of input");
    char c = p->s[p->i];
    if (c == '{')
        return container(p, '}');
    if (c == '[')
        return container(p, ']');
    if (c == '"')
        return string(p);
    if (c == '-' || (c >= '0' && c <= '9'))
        return number(p);
    if (lit(p, "true") || lit(p, "false") || lit(p, "null"))
        return VP_OK;
    return jfail(p, "expected a value");
}

vp_status vp__json_check(const char *buf, size_t len, const char *path,
                         vp_error *err)
{
    jp p = {buf, len, 0, 1, 1, 0, path, err};
    if (len >= 3 && (unsigned char)buf[0] == 0xef &&
        (unsigned char)buf[1] == 0xbb && (unsigned char)buf[2] == 0xbf)
        p.i = 3; /* UTF-8 byte order mark */
    ws(&p);
    if (p.i >= p.n)
        return VP_OK; /* empty: the loader reports it */
    vp_status st = value(&p);
    if (st != VP_OK)
        return st;
    ws(&p);
    if (p.i < p.n)
        return jfail(&p, "more after the end of the value");
    return VP_OK;
}
