/* The layer graph's storage and the builders' interface. Not installed. */
#ifndef VRAMPLAN_GRAPH_INTERNAL_H
#define VRAMPLAN_GRAPH_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model_internal.h"
#include "util.h"
#include "vramplan/graph.h"

struct vp_graph {
    vp_arena arena;
    const char *model_name;
    uint64_t batch, seq;
    uint64_t target; /* encoder-decoder: the decoder length; else 0 */
    vp_op *ops;
    size_t n_ops, cap_ops;
    vp_param *params;
    size_t n_params, cap_params;
    vp_segment *segs;
    size_t n_segs, cap_segs;
    bool *seg_default; /* cap_segs entries */
    /* the transformer description it was built from (has_tf), and the
     * model file: generate() instantiates the same model at other
     * shapes (vp__graph_rebuild) */
    bool has_tf;
    vp_tf tf;
    const char *path;
};

/* Append an op (copied); its name is formatted into the arena. Returns the
 * op's index in *idx. VP_ELIMIT past VP_MAX_OPS. */
vp_status vp__graph_add_op(vp_graph *g, const vp_op *op, uint32_t *idx,
                           vp_error *err);
/* Add a parameter tensor; *idx its index. */
vp_status vp__graph_add_param(vp_graph *g, const char *name, uint64_t numel,
                              uint32_t op, bool trainable, uint32_t *idx,
                              vp_error *err);
vp_status vp__graph_add_segment(vp_graph *g, const char *name,
                                uint32_t first, uint32_t last, bool dflt,
                                vp_error *err);
/* Product of dims, checked. */
vp_status vp__shape_numel(const uint64_t *shape, uint32_t ndim,
                          uint64_t *out, vp_error *err);

/* The builders: the transformer form (graph_transformer.c; errors point at
 * the description in `path`) and the graph form (graph_explicit.c). */
vp_status vp__build_transformer(vp_graph *g, const vp_tf *t, const char *path,
                                vp_error *err);
struct vp_gform;
vp_status vp__build_explicit(vp_graph *g, const struct vp_gform *f,
                             const char *path, vp_error *err);

/* FLOPs of one op (forward, and backward as its need of a gradient
 * says). */
void vp__graph_op_flops(const vp_graph *g, vp_op *op);

/* Fine-tuning (finetune_graph.c): a copy of g with ft's frozen parameters,
 * its LoRA layers (a lora op after each target, the adapters appended to
 * the parameters in op order, base_eb or fp32 bytes per element), its
 * quantized weights marked, and needs_grad following from what is
 * trainable (input_grads: enable_input_require_grads() made the token
 * embedding's output require a gradient). The copy borrows g's names:
 * free it (vp_graph_free) before g. NULL with *err set: VP_EARG for a
 * target or pattern that names nothing, VP_EUNSUPPORTED for an adapter on
 * a layer other than linear. */
struct vp_finetune;
vp_graph *vp__graph_finetune(const vp_graph *g, const struct vp_finetune *ft,
                             uint8_t base_eb, bool input_grads,
                             vp_error *err);

/* A setup's fine-tuning, checked (VP_EARG naming what does not go
 * together) and applied: *out is the graph to simulate (owned, borrowing
 * g's names), or NULL when the parameters stay as they are. */
struct vp_setup;
vp_status vp__finetune_prepare(const vp_graph *g, const struct vp_setup *s,
                               vp_graph **out, vp_error *err);
/* A freeze pattern's numeric range part "A-B" (n bytes at part): true
 * with *a <= *b when it is one (each number at most 2^32 - 1); false for
 * any other part. *bad is set when it has the shape of a range but not
 * its rules (too large, A > B). */
bool vp__freeze_range(const char *part, size_t n, uint64_t *a, uint64_t *b,
                      bool *bad);

/* Whether a base dtype goes with a precision (vp_base_dtype and
 * vp_precision values): pure half precision keeps its weights in that
 * dtype, fp32 training in fp32, autocast in fp32 or autocast's dtype. */
bool vp__base_dtype_fits(int base_dtype, int precision);
/* Bytes per element of a setup's base weights (2 or 4). */
uint8_t vp__base_bytes(const struct vp_setup *s);

/* A transformer description instantiated as vp_graph_build does (seq 0:
 * the model's default); name and path are the model's. cluster.c builds
 * its one-rank models, plain vp_tf values derived from the model's, with
 * it. */
vp_graph *vp__graph_build_tf(const vp_tf *t, const vp_model *m,
                             uint64_t batch, uint64_t seq, vp_error *err);

/* VP_ELIMIT when g has more than VP_MAX_SEARCH_OPS ops: the searches
 * simulate a graph tens of times, so they take smaller ones than
 * estimate (docs/LIMITS.md). */
vp_status vp__graph_search_check(const vp_graph *g, vp_error *err);

/* The encoder-decoder builder (graph_encdec.c), called by
 * vp__build_transformer for VP_TF_ENCDEC. */
vp_status vp__build_encdec(vp_graph *g, const vp_tf *t, const char *path,
                           vp_error *err);
/* The model g was built from (a transformer description), instantiated
 * again for another batch and sequence length; NULL with *err set
 * (VP_EUNSUPPORTED for a graph-form model). */
vp_graph *vp__graph_rebuild(const vp_graph *g, uint64_t batch, uint64_t seq,
                            vp_error *err);

#endif
