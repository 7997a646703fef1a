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
    vp_op *ops;
    size_t n_ops, cap_ops;
    vp_param *params;
    size_t n_params, cap_params;
    vp_segment *segs;
    size_t n_segs, cap_segs;
    bool *seg_default; /* cap_segs entries */
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

#endif
