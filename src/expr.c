/* Integer expressions for the sizes of the graph form: "4*mid", "seq/16".
 * A recursive-descent parser over + - * / % and parentheses, every step
 * checked for overflow. */
#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "expr.h"

typedef struct {
    const char *s;
    size_t pos;
    const vp_expr_var *vars;
    size_t n_vars;
    vp_status st;
    char *msg;
    size_t msg_len;
    int depth;
} parser;

static void fail(parser *p, vp_status st, const char *what)
{
    if (p->st == VP_OK) {
        p->st = st;
        snprintf(p->msg, p->msg_len, "%s", what);
    }
}

static void skip_ws(parser *p)
{
    while (p->s[p->pos] == ' ' || p->s[p->pos] == '\t')
        p->pos++;
}

static int64_t parse_sum(parser *p);

static int64_t parse_atom(parser *p)
{
    skip_ws(p);
    char c = p->s[p->pos];
    if (c == '(') {
        if (++p->depth > 64) {
            fail(p, VP_ELIMIT, "expression nested too deeply");
            return 0;
        }
        p->pos++;
        int64_t v = parse_sum(p);
        skip_ws(p);
        if (p->st == VP_OK && p->s[p->pos] != ')') {
            fail(p, VP_ESCHEMA, "expected ')'");
            return 0;
        }
        p->pos++;
        p->depth--;
        return v;
    }
    if (c == '-') {
        p->pos++;
        int64_t v = parse_atom(p);
        if (v == INT64_MIN) {
            fail(p, VP_EOVERFLOW, "expression overflows 64 bits");
            return 0;
        }
        return -v;
    }
    if (isdigit((unsigned char)c)) {
        int64_t v = 0;
        while (isdigit((unsigned char)p->s[p->pos])) {
            int d = p->s[p->pos] - '0';
            if (v > (INT64_MAX - d) / 10) {
                fail(p, VP_EOVERFLOW, "number overflows 64 bits");
                return 0;
            }
            v = v * 10 + d;
            p->pos++;
        }
        return v;
    }
    if (isalpha((unsigned char)c) || c == '_') {
        size_t start = p->pos;
        while (isalnum((unsigned char)p->s[p->pos]) || p->s[p->pos] == '_')
            p->pos++;
        size_t len = p->pos - start;
        for (size_t i = p->n_vars; i-- > 0;) {
            if (strlen(p->vars[i].name) == len &&
                memcmp(p->vars[i].name, p->s + start, len) == 0)
                return p->vars[i].value;
        }
        p->pos = start;
        char m[160];
        snprintf(m, sizeof m, "unknown name '%.*s' in expression",
                 (int)(len > 64 ? 64 : len), p->s + start);
        fail(p, VP_ESCHEMA, m);
        return 0;
    }
    fail(p, VP_ESCHEMA, c ? "unexpected character in expression"
                          : "expression ends early");
    return 0;
}

static int64_t parse_product(parser *p)
{
    int64_t v = parse_atom(p);
    for (;;) {
        if (p->st != VP_OK)
            return 0;
        skip_ws(p);
        char op = p->s[p->pos];
        if (op != '*' && op != '/' && op != '%')
            return v;
        size_t at = p->pos++;
        int64_t r = parse_atom(p);
        if (p->st != VP_OK)
            return 0;
        if (op == '*') {
            int64_t out;
            if (__builtin_mul_overflow(v, r, &out)) {
                p->pos = at;
                fail(p, VP_EOVERFLOW, "expression overflows 64 bits");
                return 0;
            }
            v = out;
        } else {
            if (r == 0) {
                p->pos = at;
                fail(p, VP_ERANGE, "division by zero");
                return 0;
            }
            if (v == INT64_MIN && r == -1) {
                fail(p, VP_EOVERFLOW, "expression overflows 64 bits");
                return 0;
            }
            if (op == '/') {
                int64_t q = v / r;
                if ((v % r != 0) && ((v < 0) != (r < 0)))
                    q--; /* floor */
                v = q;
            } else {
                v = v % r;
            }
        }
    }
}

static int64_t parse_sum(parser *p)
{
    int64_t v = parse_product(p);
    for (;;) {
        if (p->st != VP_OK)
            return 0;
        skip_ws(p);
        char op = p->s[p->pos];
        if (op != '+' && op != '-')
            return v;
        size_t at = p->pos++;
        int64_t r = parse_product(p);
        if (p->st != VP_OK)
            return 0;
        int64_t out;
        bool ovf = op == '+' ? __builtin_add_overflow(v, r, &out)
                             : __builtin_sub_overflow(v, r, &out);
        if (ovf) {
            p->pos = at;
            fail(p, VP_EOVERFLOW, "expression overflows 64 bits");
            return 0;
        }
        v = out;
    }
}

vp_status vp__expr_eval(const char *text, const vp_expr_var *vars,
                        size_t n_vars, int64_t *out, size_t *pos, char *msg,
                        size_t msg_len)
{
    parser p = {text, 0, vars, n_vars, VP_OK, msg, msg_len, 0};
    if (msg_len)
        msg[0] = '\0';
    int64_t v = parse_sum(&p);
    if (p.st == VP_OK) {
        skip_ws(&p);
        if (p.s[p.pos] != '\0')
            fail(&p, VP_ESCHEMA, "unexpected character in expression");
    }
    *pos = p.pos;
    if (p.st == VP_OK)
        *out = v;
    return p.st;
}
