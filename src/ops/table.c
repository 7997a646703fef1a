/* The op table: each op kind's forward and backward rules (src/ops/)
 * and traits, indexed by vp_op_kind. A new op kind takes an entry here,
 * its rules next to each other in its family's file, and a builder in
 * src/graph_explicit.c (see docs/SIMULATION_NOTES.md, "Code map"). */
#include "../sim_internal.h"

#define PASS VP__TRAIT_PASSTHROUGH

const vp__op_rules vp__op_table[VP_OP__COUNT] = {
    [VP_OP_INPUT] = {NULL, NULL, 0},
    [VP_OP_EMBEDDING] = {vp__embedding_fwd, vp__embedding_bwd, 0},
    [VP_OP_LINEAR] = {vp__linear_fwd, vp__linear_bwd, 0},
    [VP_OP_CONV2D] = {vp__linear_fwd, vp__linear_bwd, 0},
    [VP_OP_BATCHNORM2D] = {vp__batchnorm_fwd, vp__batchnorm_bwd, 0},
    [VP_OP_LAYERNORM] = {vp__layernorm_fwd, vp__norm_bwd, 0},
    [VP_OP_RMSNORM] = {vp__rmsnorm_fwd, vp__norm_bwd, 0,
                       vp__rmsnorm_launches},
    [VP_OP_GROUPNORM] = {vp__layernorm_fwd, vp__norm_bwd, 0},
    [VP_OP_ATTENTION] = {vp__attention_fwd, vp__attention_bwd, 0},
    [VP_OP_RELU] = {vp__activation_fwd, vp__elementwise_bwd, 0},
    [VP_OP_GELU] = {vp__activation_fwd, vp__elementwise_bwd, 0},
    [VP_OP_GELU_TANH] = {vp__gelu_tanh_fwd, vp__gelu_tanh_bwd, 0},
    [VP_OP_SILU] = {vp__activation_fwd, vp__elementwise_bwd, 0},
    [VP_OP_TANH] = {vp__activation_fwd, vp__elementwise_bwd, 0},
    [VP_OP_SIGMOID] = {vp__activation_fwd, vp__elementwise_bwd, 0},
    [VP_OP_MUL] = {vp__binary_fwd, vp__binary_bwd, 0},
    [VP_OP_ADD] = {vp__binary_fwd, vp__binary_bwd, PASS},
    [VP_OP_DROPOUT] = {vp__dropout_fwd, vp__elementwise_bwd, 0,
                       vp__dropout_launches},
    [VP_OP_MAXPOOL2D] = {vp__maxpool_fwd, vp__elementwise_bwd, 0},
    [VP_OP_AVGPOOL2D] = {vp__join_fwd, vp__elementwise_bwd, 0},
    [VP_OP_ADAPTIVE_AVGPOOL2D] = {vp__join_fwd, vp__elementwise_bwd, 0},
    [VP_OP_CONCAT] = {vp__join_fwd, vp__binary_bwd, PASS},
    [VP_OP_FLATTEN] = {vp__reshape_fwd, vp__view_bwd, PASS},
    [VP_OP_RESHAPE] = {vp__reshape_fwd, vp__view_bwd, PASS},
    [VP_OP_SOFTMAX] = {vp__softmax_fwd, vp__elementwise_bwd, 0},
    [VP_OP_CROSS_ENTROPY] = {vp__loss_fwd, vp__loss_bwd, VP__TRAIT_LOSS},
    [VP_OP_MSE_LOSS] = {vp__loss_fwd, vp__loss_bwd, VP__TRAIT_LOSS},
    [VP_OP_ROUTER] = {vp__router_fwd, vp__router_bwd, 0,
                      vp__router_launches},
    [VP_OP_ROPE] = {vp__rope_fwd, vp__rope_bwd, 0, vp__rope_launches},
    [VP_OP_MOE_EXPERTS] = {vp__moe_experts_fwd, vp__moe_experts_bwd, 0,
                           vp__moe_experts_launches},
    [VP_OP_SOFTCAP] = {vp__softcap_fwd, vp__softcap_bwd, 0},
    [VP_OP_SCALE] = {vp__scale_fwd, vp__scale_bwd, 0},
    [VP_OP_MLA_Q] = {vp__mla_q_fwd, vp__mla_cat_bwd, 0},
    [VP_OP_MLA_K] = {vp__mla_k_fwd, vp__mla_cat_bwd, 0},
    [VP_OP_PERMUTE] = {vp__view_fwd, vp__view_bwd, PASS},
    [VP_OP_SELECT] = {vp__view_fwd, vp__elementwise_bwd, PASS},
    [VP_OP_CROSS_ATTENTION] = {NULL, NULL, 0}, /* built of linears and a
                                                  core */
    [VP_OP_UPSAMPLE] = {vp__upsample_fwd, vp__elementwise_bwd, 0},
    [VP_OP_CONV_TRANSPOSE2D] = {vp__linear_fwd, vp__linear_bwd, 0},
    [VP_OP_POSITION_BIAS] = {vp__position_bias_fwd, vp__position_bias_bwd,
                             0},
    [VP_OP_CAST] = {vp__cast_fwd, vp__cast_bwd, PASS},
    [VP_OP_LORA] = {vp__lora_fwd, vp__lora_bwd, 0},
    [VP_OP_REDISTRIBUTE] = {vp__redistribute_fwd, vp__redistribute_bwd, 0},
};
