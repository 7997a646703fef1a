/* Integer expressions of the graph form's sizes ("4*mid", "seq/16").
 * Not installed. */
#ifndef VRAMPLAN_EXPR_H
#define VRAMPLAN_EXPR_H

#include <stddef.h>
#include <stdint.h>

#include "vramplan/error.h"

typedef struct vp_expr_var {
    const char *name;
    int64_t value;
} vp_expr_var;
/* Evaluate an integer expression: literals, variables, + - * / % and
 * parentheses. Checked: VP_EOVERFLOW, VP_ERANGE (division by zero),
 * VP_ESCHEMA (syntax, unknown name). On error *pos is the byte offset. */
vp_status vp__expr_eval(const char *text, const vp_expr_var *vars,
                        size_t n_vars, int64_t *out, size_t *pos,
                        char *msg, size_t msg_len);

#endif
