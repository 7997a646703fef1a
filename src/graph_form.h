/* The graph form compiled: plain values made from the model file when it
 * is loaded (graph_compile.c, which checks everything that does not depend
 * on the batch and the sequence length) and instantiated for a batch and a
 * sequence length by vp__build_explicit (graph_explicit.c). The values
 * keep their positions in the file, for the errors that only an
 * instantiation finds (sizes, shapes). Not installed. */
#ifndef VRAMPLAN_GRAPH_FORM_H
#define VRAMPLAN_GRAPH_FORM_H

#include <stdbool.h>
#include <stdint.h>

#include "util.h"
#include "vramplan/graph.h"

/* An integer expression (expr.h), as written. */
typedef struct vp_gexpr {
    const char *text;
    vp_srcpos at;       /* the scalar                                       */
    uint32_t lead;      /* columns before the text: 1 when it is quoted     */
} vp_gexpr;

/* The keys of the graph form's ops (besides name, op, input, inputs),
 * with the kind of value each takes. */
#define VP_GKEY_MAP(XX)                                                    \
    XX(OUT, "out", EXPR)                                                   \
    XX(BIAS, "bias", BOOL)                                                 \
    XX(TIED_TO, "tied_to", REF)                                            \
    XX(KERNEL, "kernel", EXPR)                                             \
    XX(STRIDE, "stride", EXPR)                                             \
    XX(PADDING, "padding", EXPR)                                           \
    XX(GROUPS, "groups", EXPR)                                             \
    XX(VOCAB, "vocab", EXPR)                                               \
    XX(DIM, "dim", EXPR)                                                   \
    XX(HEADS, "heads", EXPR)                                               \
    XX(KV_HEADS, "kv_heads", EXPR)                                         \
    XX(HEAD_DIM, "head_dim", EXPR)                                         \
    XX(CAUSAL, "causal", BOOL)                                             \
    XX(IMPL, "impl", ENUM)                                                 \
    XX(DROPOUT, "dropout", PROB)                                           \
    XX(LAYOUT, "layout", ENUM)                                             \
    XX(HOLD_INPUT, "hold_input", BOOL)                                     \
    XX(INPLACE, "inplace", BOOL)                                           \
    XX(P, "p", PROB)                                                       \
    XX(LEARNED, "learned", BOOL)                                           \
    XX(LEARNED_TOKENS, "learned_tokens", EXPR)                             \
    XX(START, "start", EXPR)                                               \
    XX(SHAPE, "shape", LIST)                                               \
    XX(DIMS, "dims", LIST)                                                 \
    XX(INDEX, "index", EXPR)                                               \
    XX(SCALE, "scale", EXPR)                                               \
    XX(MODE, "mode", ENUM)

typedef enum {
#define VP__GK(name, str, type) VP_GK_##name,
    VP_GKEY_MAP(VP__GK)
#undef VP__GK
    VP_GK__COUNT
} vp_gkey;

typedef enum {
    VP_GV_EXPR,  /* a size expression                                     */
    VP_GV_BOOL,
    VP_GV_PROB,  /* a probability                                        */
    VP_GV_ENUM,  /* one of the key's choices (vp__gkey_choices)           */
    VP_GV_LIST,  /* a list of size expressions                           */
    VP_GV_REF    /* the name of an earlier op of the list                 */
} vp_gvalue;

/* Names in scope of a graph form's expressions: batch, seq and image, the
 * constants, the parameters of the enclosing blocks. */
#define VP_GFORM_MAX_VARS 64

/* A reference to an earlier entry of the same list: its index, or
 * VP_GREF_INPUT for `$input` (the list's input). */
#define VP_GREF_INPUT (-1)
/* `$context`: the model's second input (the graph's `context`), from any
 * list (cross-attention's keys and values) */
#define VP_GREF_CONTEXT (-2)

typedef struct vp_gattr {
    vp_gkey key;
    vp_srcpos at;          /* the value                                   */
    vp_gexpr expr;         /* VP_GV_EXPR                                   */
    bool b;                /* VP_GV_BOOL                                   */
    double p;              /* VP_GV_PROB                                   */
    int e;                 /* VP_GV_ENUM: the index of the choice          */
    vp_gexpr *items;       /* VP_GV_LIST                                   */
    uint32_t n_items;
    int32_t ref;           /* VP_GV_REF                                    */
} vp_gattr;

/* An entry of an `ops` list: an op, or the invocation of a block. */
typedef struct vp_gentry {
    bool call;
    vp_srcpos at;          /* the entry's mapping                          */
    const char *leaf;      /* its name: given, or the automatic one        */
    vp_srcpos name_at;     /* where the name is given (else: at)           */
    uint32_t n_in;         /* inputs given; 0: the previous entry          */
    int32_t in[VP_OP_MAX_INPUTS];
    /* an op */
    vp_op_kind kind;
    vp_gattr *attrs;
    uint32_t n_attrs;
    /* a block invocation */
    uint32_t block;        /* index into vp_gform.blocks                   */
    uint64_t repeat;
    bool repeated;         /* `repeat` given: instances are numbered       */
    bool hold;             /* hold_input                                   */
    vp_gexpr *with;        /* per parameter of the block; text NULL: not
                              given                                        */
} vp_gentry;

typedef struct vp_glist {
    vp_gentry *entries;
    uint32_t n;
} vp_glist;

typedef struct vp_gblock {
    const char *name;
    uint32_t n_params;
    const char **params;   /* names, in order                              */
    vp_srcpos *param_at;   /* the names' positions                         */
    vp_gexpr *defaults;    /* text NULL: none (the invocation gives it)    */
    vp_glist ops;
} vp_gblock;

typedef struct vp_gform {
    uint32_t n_consts;
    const char **const_names;
    vp_gexpr *consts;
    vp_gexpr *input;       /* the input's dims                             */
    uint32_t input_ndim;
    vp_srcpos input_at;
    vp_value_kind input_kind;
    vp_gexpr *context;     /* the second input's dims (cross-attention's
                              keys and values), NULL: none             */
    uint32_t context_ndim;
    vp_srcpos context_at;
    uint32_t n_blocks;
    vp_gblock *blocks;
    bool has_patterns;     /* `checkpoint` given                           */
    uint32_t n_patterns;
    const char **patterns;
    vp_glist ops;
} vp_gform;

/* The graph form's op kinds, one table (graph_explicit.c) indexed by
 * vp_op_kind: the accepted keys (in the order that error messages list
 * them), whether the op takes several inputs, and its builder. The kinds
 * with no keys table are not in the graph form. Adding a kind: its keys
 * and a builder here, its rules in the simulator's op table
 * (src/ops/table.c). */
struct vp_gop; /* an op being built (graph_explicit.c) */
typedef struct vp_gkind {
    const vp_gkey *keys;   /* NULL: not in the graph form                  */
    uint32_t n_keys;
    bool multi_input;      /* takes 'inputs' with more than one op (add
                              without `learned`, mul, concat)             */
    uint32_t required;     /* keys it must have: bits 1 << vp_gkey        */
    vp_status (*build)(struct vp_gop *c);
} vp_gkind;
extern const vp_gkind vp__gkinds[VP_OP__COUNT];

const char *vp__gkey_name(vp_gkey k);
vp_gvalue vp__gkey_value(vp_gkey k);
/* The choices of a VP_GV_ENUM key, NULL-terminated. */
const char *const *vp__gkey_choices(vp_gkey k);

/* The attribute `key` of an op entry, or NULL. */
const vp_gattr *vp__gattr(const vp_gentry *e, vp_gkey key);

#endif
