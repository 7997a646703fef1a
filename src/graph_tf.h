/* The transformer form's builder (graph_transformer.c) and the blocks of
 * the newer families built apart (graph_moe.c: mixture-of-experts layers;
 * graph_mla.c: multi-head latent attention; graph_encdec.c: the
 * encoder-decoders): the builder's state and its
 * primitives, each appending one op in execution order. Not installed. */
#ifndef VRAMPLAN_GRAPH_TF_H
#define VRAMPLAN_GRAPH_TF_H

#include "graph_internal.h"

typedef struct vp__tb {
    vp_graph *g;
    const vp_tf *t;
    vp_error *err;
    char scope[96];
    const char *path; /* the model file, for errors found while building */
    uint64_t layer;   /* the layer being built                           */
    bool local;       /* the next linears run on the rank's own tokens:
                         no sequence-parallel gather, no fp8 (Megatron's
                         MoE router, graph_moe.c)                        */
    uint32_t gsrc, gdst; /* vp_tf.dtensor: the last input all-gathered
                            and its gathered op (gdst 0: none)          */
    bool duplicated;  /* the next linears are Transformer Engine's
                         duplicated TELinear (Megatron's MLA down
                         projections, graph_mla.c): the rank's own tokens,
                         no sequence-parallel gather; fp8 as any TE
                         linear                                          */
} vp__tb;

/* An op of kind k with one float output, nothing else set. */
void vp__tb_op(vp_op *o, vp_op_kind k);
/* The output shape (up to 4 dims). */
void vp__tb_shape(vp_op *o, uint32_t nd, uint64_t a, uint64_t b, uint64_t c,
                  uint64_t d);
/* Append o, named scope.leaf; *idx its index. */
vp_status vp__tb_push(vp__tb *c, vp_op *o, const char *leaf, uint32_t *idx);
/* Name o (scope.leaf) before its parameters are added. */
vp_status vp__tb_named(vp__tb *c, vp_op *o, const char *leaf);
/* A trainable parameter of o (o named), numel elements. */
vp_status vp__tb_param(vp__tb *c, vp_op *o, const char *leaf, uint64_t numel);
/* nn.Linear on the last dim of in: out_f outputs, with a bias or not. */
vp_status vp__tb_linear(vp__tb *c, uint32_t in, const char *leaf,
                        uint64_t out_f, bool bias, uint32_t *idx);
/* The same with the weight of parameter tied_weight (>= 0) instead of
 * its own (an encoder-decoder's tied head, graph_encdec.c). */
vp_status vp__tb_linear_tied(vp__tb *c, uint32_t in, const char *leaf,
                             uint64_t out_f, bool bias, int64_t tied_weight,
                             uint32_t *idx);
/* o named scope.leaf with one parameter, its "weight" (numel elements),
 * trainable or not (graph_encdec.c: embeddings, position bias). */
vp_status vp__tb_weight(vp__tb *c, vp_op *o, const char *leaf, uint64_t numel,
                        bool trainable);
/* The model's norm (or an RMSNorm, rms) over the last dim of in. */
vp_status vp__tb_norm(vp__tb *c, uint32_t in, const char *leaf, bool rms,
                      uint32_t *idx);
/* An op shaped like its input. */
vp_status vp__tb_unary(vp__tb *c, vp_op_kind k, uint32_t in,
                       const char *leaf, uint32_t *idx);
vp_status vp__tb_binary(vp__tb *c, vp_op_kind k, uint32_t a, uint32_t b,
                        const char *leaf, uint32_t *idx);
/* Dropout of probability p on in. */
vp_status vp__tb_dropout(vp__tb *c, uint32_t in, const char *leaf, double p,
                         uint32_t *idx);
/* The model's MLP of inner size f on x (leaf names start with pre). */
vp_status vp__tb_mlp(vp__tb *c, uint32_t x, uint64_t f, const char *pre,
                     uint32_t *out);
/* An overflow of a size while building, at the description. */
vp_status vp__tb_overflow(vp__tb *c, const char *what);

/* A layer's mixture of experts on x (graph_moe.c): the router, the
 * experts as transformers 5.x runs them (one grouped GEMM over the
 * tokens sorted by expert, integrations/moe.py), the shared experts. */
vp_status vp__tb_moe(vp__tb *c, uint32_t x, uint32_t *out);
/* Whether layer l has experts (the first dense_layers do not, nor those
 * off the moe_every period). */
bool vp__tf_layer_moe(const vp_tf *t, uint64_t l);
/* The sliding window of layer l, 0 when it attends to every position. */
uint64_t vp__tf_layer_window(const vp_tf *t, uint64_t l);

/* Multi-head latent attention on x (graph_mla.c), through o_proj. */
vp_status vp__tb_mla(vp__tb *c, uint32_t x, uint64_t S, uint32_t *out);

#endif
