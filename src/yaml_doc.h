/* YAML (and JSON) documents with positions: the loader's interface. Only
 * the loaders include it (model.c, graph_compile.c, gpu.c and the readers
 * of measured runs); what they load is kept as plain values, so <yaml.h>
 * reaches no other module. Not installed. */
#ifndef VRAMPLAN_YAML_DOC_H
#define VRAMPLAN_YAML_DOC_H

#include <yaml.h>

#include "util.h"

typedef struct vp_ydoc {
    yaml_document_t doc;
    bool loaded;
    const char *buf;  /* the input, while loading (reader error positions) */
    size_t len;
    const char *path; /* for error messages; owned by the model's arena */
} vp_ydoc;

/* Parse buf into d after a pre-pass that refuses aliases and anchors,
 * nesting deeper than VP_MAX_NEST and more than VP_MAX_YAML_NODES nodes,
 * and duplicate keys. */
vp_status vp__ydoc_load(vp_ydoc *d, const char *buf, size_t len,
                        vp_error *err);
void vp__ydoc_destroy(vp_ydoc *d);
yaml_node_t *vp__ydoc_root(vp_ydoc *d);
yaml_node_t *vp__ynode(vp_ydoc *d, int index);
/* A node's place: its start mark; width = the scalar's length (with its
 * quotes) if a scalar, at most 200, else 1. NULL: line 1, column 1. */
vp_srcpos vp__ypos(const yaml_node_t *n);
/* Error at a node's place (vp__ypos). */
vp_status vp__yerr(vp_ydoc *d, const yaml_node_t *n, vp_status code,
                   vp_error *err, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 5, 6)))
#endif
    ;
/* Value of key in a mapping (NULL if absent); *key_out the key node. */
yaml_node_t *vp__ymap_get(vp_ydoc *d, yaml_node_t *map, const char *key,
                          yaml_node_t **key_out);
/* Every key of map must be a scalar in allowed (NULL-terminated); an
 * unknown key is VP_ESCHEMA with a "did you mean" suggestion. */
vp_status vp__ymap_check(vp_ydoc *d, yaml_node_t *map,
                         const char *const *allowed, const char *what,
                         vp_error *err);
bool vp__yis_null(const yaml_node_t *n);
const char *vp__yscalar(const yaml_node_t *n); /* NULL if not a scalar */
vp_status vp__yget_u64(vp_ydoc *d, yaml_node_t *n, uint64_t min, uint64_t max,
                       uint64_t *out, vp_error *err);
vp_status vp__yget_bool(vp_ydoc *d, yaml_node_t *n, bool *out, vp_error *err);
vp_status vp__yget_prob(vp_ydoc *d, yaml_node_t *n, double *out,
                        vp_error *err);
/* A finite number in (0, max]. */
vp_status vp__yget_pos(vp_ydoc *d, yaml_node_t *n, double max, double *out,
                       vp_error *err);
vp_status vp__yget_str(vp_ydoc *d, yaml_node_t *n, const char **out,
                       vp_error *err);
/* One of choices (NULL-terminated); *out its index. */
vp_status vp__yget_enum(vp_ydoc *d, yaml_node_t *n, const char *const *choices,
                        int *out, vp_error *err);

/* A Hugging Face t5 or mt5 config.json (root) into t, defaulted by the
 * caller (hf_t5.c). */
struct vp_tf;
vp_status vp__hf_t5(vp_ydoc *d, yaml_node_t *root, const char *type,
                    struct vp_tf *t, vp_error *err);

/* Compile a model's `graph:` mapping gn (graph_compile.c): *out is made
 * in arena a and keeps nothing of the document. */
struct vp_gform;
vp_status vp__graph_compile(vp_arena *a, vp_ydoc *d, yaml_node_t *gn,
                            struct vp_gform **out, vp_error *err);

#endif
