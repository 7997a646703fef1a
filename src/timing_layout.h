/* Memory-bound kernels by their inputs' layout and HF's Python RMSNorm by
 * its input's width (docs/STEP_TIME.md "Memory-bound kernels by input
 * layout"). Private to the step-time model. */
#ifndef VP_TIMING_LAYOUT_H
#define VP_TIMING_LAYOUT_H

#include "vramplan/vramplan.h"

/* How many times the contiguous kernel's byte time one memory-bound
 * kernel of op o (phase ph, 0 forward, 1 backward) takes, `bytes` the
 * allocation it writes: 1 on contiguous inputs. */
double vp__layout_ratio(const vp_graph *g, const vp_op *o, int ph,
                        double bytes);

/* The same for a transposed [B, S, H, d] made contiguous (HF's
 * transpose(1, 2).contiguous() of an attention output in [B, H, S, d])
 * and for a binary kernel with a broadcast operand, on fp32 elements
 * (wide) or 16-bit ones. */
double vp__layout_transpose_copy(bool wide);
double vp__layout_broadcast(bool wide);

/* The same for a kernel of class kind (VP_HW_MEM_*) whose operands have
 * layout (sim_internal.h VP__LAY_*): contiguous 1, a broadcast operand,
 * a slice of a chunked tensor (a binary, a unary activation, else a
 * copy). */
double vp__layout_of(int layout, int kind, bool wide);

/* Bytes the sweep's rmsnorm_py rate is charged per element of HF's
 * Python RMSNorm, its input `width` bytes an element (2 or 4): its
 * input and output at 16 bits, 28/36 of that on a wider input. */
double vp__rmsnorm_py_bytes(double width);

/* Bytes HF's RoPE moves on one rotated tensor of n elements in phase ph
 * (0 forward, 1 backward), each times its layout's ratio, `in` and `out`
 * the rotated tensor's and the result's bytes an element; *k gets its
 * kernels. */
double vp__rope_bytes(double n, double in, double out, int ph, double *k);

#endif
