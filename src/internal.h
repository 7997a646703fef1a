/* vramplan internal headers, by noun (not installed):
 *   util.h            invariants, arena, files, growth, suggestions, globs,
 *                     JSON syntax check
 *   yaml_doc.h        YAML documents with positions (loaders only)
 *   expr.h            the graph form's size expressions
 *   model_internal.h  model descriptions as plain values
 *   graph_internal.h  the layer graph's storage and builders
 *   sim_internal.h    the simulator's engine and op table
 *   hashmap.h         a map of 64-bit keys to 64-bit values
 *   pickle.h          a Python pickle stream writer
 * This umbrella gathers the ones every module may use (not yaml_doc.h,
 * sim_internal.h, hashmap.h or pickle.h); a module of one noun includes
 * that noun's header. */
#ifndef VRAMPLAN_INTERNAL_H
#define VRAMPLAN_INTERNAL_H

#include "expr.h"
#include "graph_internal.h"
#include "model_internal.h"
#include "util.h"
#include "vramplan/vramplan.h"

/* ---- single-GPU kernel rules shared with the cluster planner (timing.c) */

/* NCHW batch norm in training mode by shape (timing.c bn_fit): the kernel
 * path of a precision (ATen's kernels, cuDNN's in fp32, cuDNN's for a half
 * input with fp32 parameters) and the bytes at the copy bandwidth of one
 * call's forward (bwd false) or backward over `elems` elements in
 * `channels` channels of `pixels` pixels. */
enum { VP__BN_NATIVE, VP__BN_CUDNN32, VP__BN_CUDNN16, VP__BN__N };
int vp__bn_path(vp_precision p);
double vp__bn_bytes(int path, bool bwd, double elems, double channels,
                    double pixels);

/* cuDNN's NCHW layout conversion around a convolution of `numel` output
 * elements, in each direction: the output written and read once more
 * (16-bit or fp32), in bytes at the copy bandwidth (timing.c conv_time). */
double vp__conv_layout_bytes(double numel, bool half);

/* nn.MultiheadAttention(batch_first=True)'s projection `o` (layout
 * torch_mha): its forward's kernels other than its GEMM and casts, in
 * bytes at the copy bandwidth (copy: in_proj's two strided copies, or
 * out_proj's one unless after flash; the transposed-copy ratio included)
 * and at the add bandwidth (add: in_proj's bias added in place, the
 * broadcast ratio included), for the setup's precision and attention
 * (timing.c mha_fwd). False, all zero, for any other op. */
typedef struct {
    double copy[2], add;
    /* the backward's kernels of the attention's q, k, v (out_proj's
     * record, its core needing a gradient; timing.c mha_bwd): bcopy bytes
     * at the copy bandwidth in bcopies kernels (SelectBackward's zero
     * fills and copy_, the efficient kernel's strided copies at the
     * transposed-copy ratio), badd bytes at the add bandwidth in badds
     * kernels (autograd's sums of the three select gradients) */
    double bcopy, bcopies, badd, badds;
} vp__mha_bytes;
bool vp__mha_kernels(const vp_graph *g, const vp_setup *s, const vp_op *o,
                     vp__mha_bytes *k);

/* ---- simulation with micro-batch hooks (sim.c) ----------------------- */

/* For a caller that sums what the events of a step cost (timing.c) and
 * can take accumulation's steady state in closed form (sim_steady.c):
 * mb_start is called at the start of every micro-batch after the first;
 * repeat(times) says that the micro-batch between the last two mb_start
 * calls repeats `times` more times, event for event, without its events
 * being sent. */
typedef struct vp__sim_hooks {
    void (*mb_start)(void *ud, uint32_t step);
    void (*repeat)(void *ud, uint32_t step, uint64_t times);
    /* NULL, or: the next allocation is written by a kernel the caller
     * times elsewhere (vp__written_by): one of the op's GEMMs (launch:
     * it is a launch of its own) or the kernel that writes the op's
     * next allocation too (not a launch) */
    void (*written_by)(void *ud, bool launch);
    /* NULL, or: op saves a tensor for its backward (vp__save) in phase
     * ph of step's micro-batch: a checkpointed segment's ops save only
     * when the backward recomputes them (VP_PHASE_BACKWARD) */
    void (*saved)(void *ud, uint32_t step, uint32_t op, vp_phase ph);
} vp__sim_hooks;

/* vp_simulate with hooks (NULL: every event is sent, as vp_simulate). */
vp_status vp__simulate_hooked(const vp_graph *g, const vp_setup *setup,
                              vp_estimate *out, vp_sim_event_fn on_event,
                              void *ud, const vp__sim_hooks *hooks,
                              vp_error *err);

/* The same on ft, the graph vp__finetune_prepare made of g (NULL: g as it
 * is), for a caller that reads the ops the simulator runs (timing.c: a
 * LoRA step's adapters and frozen base). */
vp_status vp__simulate_prepared(const vp_graph *g, const vp_graph *ft,
                                const vp_setup *setup, vp_estimate *out,
                                vp_sim_event_fn on_event, void *ud,
                                const vp__sim_hooks *hooks, vp_error *err);

#endif
