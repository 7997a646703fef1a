/* vramplan internal header: shared by the library's modules, not installed. */
#ifndef VRAMPLAN_INTERNAL_H
#define VRAMPLAN_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <yaml.h>

#include "vramplan/vramplan.h"

/* Broken invariants only; bad input always takes the vp_error path. */
#define VP_ASSERT(x)                                                       \
    do {                                                                   \
        if (!(x))                                                          \
            vp__abort(__FILE__, __LINE__, #x);                             \
    } while (0)
_Noreturn void vp__abort(const char *file, int line, const char *expr);

/* ---- arena: strings and small objects freed in one call ---------------- */
typedef struct vp_arena_chunk vp_arena_chunk;
typedef struct vp_arena {
    vp_arena_chunk *head;
} vp_arena;
void *vp__arena_alloc(vp_arena *a, size_t n);           /* zeroed, NULL on OOM */
char *vp__arena_strdup(vp_arena *a, const char *s);
char *vp__arena_printf(vp_arena *a, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void vp__arena_destroy(vp_arena *a);

/* Read a whole file of at most max bytes (one more is read, so that the
 * caller can refuse a larger file). *buf is malloc'ed (caller frees), NUL
 * terminated. VP_EIO or VP_ENOMEM with *err set. */
vp_status vp__read_file(const char *path, size_t max, char **buf,
                        size_t *len, vp_error *err);

/* Grow *p (an array of *cap elements of size elem) to hold at least need. */
bool vp__grow(void **p, size_t *cap, size_t need, size_t elem);

/* v x ppm / 1e6, rounded down, without overflow (ppm <= 1e6). */
static inline uint64_t vp__share_ppm(uint64_t v, uint32_t ppm)
{
    return v / 1000000 * ppm + v % 1000000 * ppm / 1000000;
}

/* ---- a map of 64-bit keys to 64-bit values (hashmap.c) -----------------
 * Zero-initialise; key 0 is reserved (never stored); vp__map_get returns 0
 * for an absent key, so store value + 1 when 0 is a value. */
typedef struct vp__map {
    uint64_t *key, *val;
    size_t cap, n; /* cap: 0 or a power of two */
} vp__map;
bool vp__map_put(vp__map *m, uint64_t key, uint64_t val); /* false: OOM */
uint64_t vp__map_get(const vp__map *m, uint64_t key);
void vp__map_del(vp__map *m, uint64_t key);
void vp__map_free(vp__map *m);

/* ---- Python pickles (pickle.c) ----------------------------------------
 * A stream writer: begin, then values; a container is opened with dict or
 * list, each value of a list and each key-value pair of a dict is followed
 * by vp__pk_item, and close ends it. Errors are sticky; end reports them. */
#define VP_PK_MAX_DEPTH 16
#define VP_PK_NO_MEMO UINT32_MAX
typedef struct vp__pk {
    FILE *f;
    bool bad;
    uint32_t memo;                      /* next memo slot            */
    uint32_t depth;
    uint8_t batch_op[VP_PK_MAX_DEPTH];  /* SETITEMS or APPENDS       */
    uint32_t items[VP_PK_MAX_DEPTH];    /* items in the open batch   */
} vp__pk;
void vp__pk_begin(vp__pk *w, FILE *f);
bool vp__pk_end(vp__pk *w); /* false if a write failed */
void vp__pk_int(vp__pk *w, int64_t v);
void vp__pk_uint(vp__pk *w, uint64_t v);
void vp__pk_bool(vp__pk *w, bool v);
void vp__pk_none(vp__pk *w);
void vp__pk_float(vp__pk *w, double v);
void vp__pk_str(vp__pk *w, const char *s); /* invalid UTF-8 becomes '?' */
void vp__pk_key(vp__pk *w, const char *key);
/* A string written once and then referenced: *slot starts VP_PK_NO_MEMO. */
void vp__pk_str_memo(vp__pk *w, const char *s, uint32_t *slot);
void vp__pk_dict(vp__pk *w);
void vp__pk_list(vp__pk *w);
void vp__pk_item(vp__pk *w);
void vp__pk_close(vp__pk *w);
void vp__pk_tuple2(vp__pk *w); /* the two values on top become a tuple */
/* Memoize the value on top (returns its slot); push a memoized value. */
uint32_t vp__pk_memo_put(vp__pk *w);
void vp__pk_memo_get(vp__pk *w, uint32_t id);

/* ---- YAML documents with positions ------------------------------------ */
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
/* Error at a node's start mark; width = the scalar's length if a scalar. */
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
vp_status vp__yget_str(vp_ydoc *d, yaml_node_t *n, const char **out,
                       vp_error *err);
/* One of choices (NULL-terminated); *out its index. */
vp_status vp__yget_enum(vp_ydoc *d, yaml_node_t *n, const char *const *choices,
                        int *out, vp_error *err);
/* Closest of candidates to word, or NULL if nothing is close. */
const char *vp__suggest(const char *word, const char *const *candidates);

/* Strict JSON syntax check (VP_ESYNTAX with line:column, VP_ELIMIT for
 * nesting deeper than VP_MAX_NEST). */
vp_status vp__json_check(const char *buf, size_t len, const char *path,
                         vp_error *err);

/* ---- expressions (graph form sizes) ----------------------------------- */
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

/* ---- models ------------------------------------------------------------ */
typedef enum { VP_TF_DECODER, VP_TF_ENCODER } vp_tf_type;
typedef enum { VP_NORM_LAYERNORM, VP_NORM_RMSNORM } vp_norm_kind;
typedef enum {
    VP_ACT_GELU, VP_ACT_GELU_TANH, VP_ACT_RELU, VP_ACT_SILU, VP_ACT_SWIGLU,
    VP_ACT_GEGLU
} vp_act_kind;
typedef enum {
    VP_HEAD_CAUSAL_LM, VP_HEAD_MASKED_LM, VP_HEAD_CLASSIFICATION,
    VP_HEAD_NONE
} vp_head_kind;

typedef struct vp_tf {
    vp_tf_type type;
    uint64_t hidden, layers, heads, kv_heads, head_dim, ffn, vocab;
    uint64_t max_positions, type_vocab, num_labels;
    bool rotary;
    vp_norm_kind norm;
    vp_act_kind act;
    bool bias, qkv_bias, fused_qkv, tied, embedding_norm, final_norm;
    bool norm_bias;
    double p_embd, p_attn, p_resid;
    vp_attn_impl attn;
    vp_head_kind head;
    uint64_t experts, top_k, expert_ffn, shared_experts;
    uint32_t line, col; /* where the description starts */
} vp_tf;

struct vp_model {
    vp_arena arena;
    const char *name;
    const char *path;
    int form; /* 0 transformer, 1 graph */
    uint64_t seq;
    vp_tf tf;
    vp_ydoc ydoc;              /* kept for the graph form               */
    yaml_node_t *graph_node;   /* the `graph:` mapping                  */
};

/* ---- graphs ------------------------------------------------------------ */
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

vp_status vp__build_transformer(vp_graph *g, const vp_model *m, vp_error *err);
vp_status vp__build_explicit(vp_graph *g, vp_model *m, vp_error *err);

/* Glob match: '*' matches any run of characters except '.'. */
bool vp__glob_match(const char *pattern, const char *name);

#endif
