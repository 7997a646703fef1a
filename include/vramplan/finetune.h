/* vramplan: fine-tuning setups (docs/FINETUNING.md).
 *
 * What a training setup may say beyond full fine-tuning: which parameters
 * are frozen (no gradient, no optimizer state), LoRA or DoRA adapters as
 * peft adds them, a quantized base (bitsandbytes NF4/FP4 4-bit or
 * LLM.int8), the dtype the base weights are kept in and how they are
 * loaded. vp_setup (sim.h) holds one vp_finetune; vp_setup_init fills it
 * with full fine-tuning of a model loaded in its training dtype. */
#ifndef VRAMPLAN_FINETUNE_H
#define VRAMPLAN_FINETUNE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "vramplan/error.h"

/* How the weights come to the GPU. */
#define VP_LOAD_MAP(XX)                                                     \
    XX(DTYPE, "dtype")          /* built in the target dtype (HF          \
                                   from_pretrained(torch_dtype=...))     */ \
    XX(FP32_CAST, "fp32-then-cast") /* built in fp32, then .to(dtype)    */ \
    XX(META, "meta")            /* built on the meta device, to_empty()   */

typedef enum {
#define VP__LOAD(name, str) VP_LOAD_##name,
    VP_LOAD_MAP(VP__LOAD)
#undef VP__LOAD
    VP_LOAD__COUNT
} vp_load;

/* A quantized base: the weights of its linear layers (bitsandbytes
 * Linear4bit, Linear8bitLt), frozen. */
#define VP_QUANT_MAP(XX)                                                    \
    XX(NONE, "none")                                                        \
    XX(NF4, "nf4")              /* 4-bit NormalFloat, blocks of 64        */ \
    XX(FP4, "fp4")              /* 4-bit float, blocks of 64              */ \
    XX(INT8, "int8")            /* LLM.int8: int8 rows, fp32 row scales   */

typedef enum {
#define VP__QUANT(name, str) VP_QUANT_##name,
    VP_QUANT_MAP(VP__QUANT)
#undef VP__QUANT
    VP_QUANT__COUNT
} vp_quant;

/* The dtype the base weights are kept in; AUTO: the precision's (fp32
 * under autocast, bf16/fp16 for pure half precision). */
#define VP_BASE_DTYPE_MAP(XX)                                               \
    XX(AUTO, "auto")                                                        \
    XX(FP32, "fp32")                                                        \
    XX(BF16, "bf16")                                                        \
    XX(FP16, "fp16")

typedef enum {
#define VP__BDT(name, str) VP_BASE_##name,
    VP_BASE_DTYPE_MAP(VP__BDT)
#undef VP__BDT
    VP_BASE__COUNT
} vp_base_dtype;

#define VP_LORA_TARGETS_MAX 256 /* bytes of the target list, NUL included */
#define VP_FREEZE_MAX 256       /* bytes of the freeze patterns           */
#define VP_LORA_MAX_RANK 65536u

/* LoRA adapters (peft LoraConfig). */
typedef struct vp_lora {
    uint32_t r;               /* rank; 0: no adapters                      */
    double alpha;             /* lora_alpha: scales, takes no memory       */
    double dropout;           /* lora_dropout p, 0 <= p < 1                */
    char targets[VP_LORA_TARGETS_MAX]; /* target_modules: comma-separated
                                 module names, or "all-linear"             */
    bool dora;                /* use_dora: a magnitude vector per target   */
    bool rslora;              /* use_rslora: scaling alpha / sqrt(r)       */
    bool adapters_in_base_dtype; /* autocast_adapter_dtype=False: the
                                    adapters keep the base's half dtype
                                    (default: fp32)                        */
} vp_lora;

typedef struct vp_finetune {
    vp_load load;             /* default VP_LOAD_DTYPE                     */
    vp_base_dtype base_dtype; /* default VP_BASE_AUTO                      */
    char freeze[VP_FREEZE_MAX]; /* patterns of frozen parameters, comma-
                                   separated ("embed,layers.0-15"); ""   */
    vp_lora lora;
    vp_quant quant;
    bool double_quant;        /* 4-bit: the absmax quantized again
                                 (bnb_4bit_use_double_quant)             */
} vp_finetune;

/* Full fine-tuning, loaded in the target dtype. */
void vp_finetune_init(vp_finetune *f);

/* Whether anything but the defaults is asked (frozen parameters,
 * adapters, a quantized or half base under autocast, another load). */
bool vp_finetune_active(const vp_finetune *f);

/* Parse a LoRA spec: comma-separated key=value items, r (1 to 65536),
 * alpha, dropout (0 <= p < 1), targets (module names, the items without
 * '=' that follow continue the list: "targets=q_proj,v_proj"; or
 * all-linear), the flags dora and rslora, adapter_dtype (fp32 or base).
 * r and targets are required. An unknown key is VP_EARG naming it. */
vp_status vp_lora_parse(const char *spec, vp_lora *out, vp_error *err);
/* Copy freeze patterns ("embed,layers.0-15"), checked for their syntax
 * only (they are matched against the model's parameters when it is
 * simulated). */
vp_status vp_freeze_parse(const char *spec, vp_finetune *f, vp_error *err);

/* A one-line summary of a fine-tuning setup for reports (truncated to
 * cap - 1 bytes). */
void vp_finetune_describe(const vp_finetune *f, char *buf, size_t cap);

const char *vp_load_name(vp_load l);
const char *vp_quant_name(vp_quant q);
const char *vp_base_dtype_name(vp_base_dtype d);
vp_status vp_load_parse(const char *s, vp_load *out);
vp_status vp_quant_parse(const char *s, vp_quant *out);
vp_status vp_base_dtype_parse(const char *s, vp_base_dtype *out);

#endif
