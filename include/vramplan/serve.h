/* vramplan: sizing a vLLM server (V1 engine) on one GPU or one
 * tensor-parallel group.
 *
 * vLLM reserves gpu_memory_utilization x the device's total memory, loads
 * the weights, runs one dummy forward of max_num_batched_tokens tokens and a
 * dummy sampling step for max_num_seqs requests, and gives what is left of
 * the reservation to the paged KV cache, in blocks of block_size tokens
 * (vllm/v1/worker/gpu_worker.py Worker.determine_available_memory,
 * vllm/utils/mem_utils.py memory_profiling, vllm/v1/core/kv_cache_utils.py
 * get_kv_cache_config / get_num_blocks). This module follows the same steps:
 * the weights come from the model's graph, the profile run's peak from the
 * model's shapes under vLLM's kernels replayed through the caching-allocator
 * model, the blocks from vLLM's formula. docs/SERVING.md gives every rule and
 * its source, and says which parts are derived rather than measured. */
#ifndef VRAMPLAN_SERVE_H
#define VRAMPLAN_SERVE_H

#include <stdbool.h>
#include <stdint.h>

#include "vramplan/error.h"
#include "vramplan/gpu.h"
#include "vramplan/kvcache.h"
#include "vramplan/model.h"

/* vLLM's defaults (vllm/config/cache.py CacheConfig). */
#define VP_SERVE_DEFAULT_UTILIZATION 0.9
#define VP_SERVE_DEFAULT_BLOCK 16u

typedef struct vp_serve_config {
    double gpu_memory_utilization; /* share of the device total vLLM may
                                      use, (0, 1]                           */
    uint64_t max_model_len;        /* 0: the model's maximum length          */
    uint64_t max_num_seqs;         /* 0: vLLM's default for the GPU          */
    uint64_t max_num_batched_tokens; /* 0: vLLM's default for the GPU        */
    uint32_t block_size;           /* tokens per KV block                    */
    uint32_t dtype_bytes;          /* weights and activations: 2 (bf16/fp16)
                                      or 4 (fp32)                           */
    uint32_t kv_dtype_bytes;       /* 0: as dtype_bytes ("auto"); 1: fp8     */
    uint32_t tensor_parallel;      /* ranks the layers are split over        */
    bool enforce_eager;            /* no torch.compile, no CUDA graphs       */
    bool non_torch_given;          /* non_torch_bytes set by the caller      */
    uint64_t non_torch_bytes;      /* memory outside PyTorch that appears
                                      during loading and profiling           */
    uint64_t request_tokens;       /* prompt + output of one request for the
                                      concurrency figure; 0: max_model_len  */
} vp_serve_config;

/* Defaults: utilization 0.9, block 16, bf16, KV auto, TP 1, the rest 0
 * (vLLM's defaults chosen from the model and the GPU). */
void vp_serve_config_init(vp_serve_config *c);

typedef struct vp_serve_result {
    /* the settings in effect (defaults resolved) */
    uint64_t max_model_len, max_num_seqs, max_num_batched_tokens;
    uint32_t block_size, kv_dtype_bytes, tensor_parallel;
    /* memory, per rank, bytes */
    uint64_t total_bytes;       /* device total (cudaMemGetInfo)            */
    uint64_t requested_bytes;   /* total x gpu_memory_utilization           */
    uint64_t weight_bytes;      /* model weights as loaded                  */
    uint64_t forward_peak;      /* dummy forward of max_num_batched_tokens  */
    uint64_t sampler_peak;      /* dummy sampling of max_num_seqs requests  */
    uint64_t activation_peak;   /* the profile run's torch peak increase    */
    uint64_t non_torch_bytes;   /* outside PyTorch                          */
    bool non_torch_estimated;   /* not measured for this GPU                */
    uint64_t kv_available;      /* requested - weights - activation peak -
                                   non-torch: what the KV cache gets         */
    /* the paged cache */
    uint64_t page_bytes;        /* one block of one layer                   */
    uint32_t n_layers, n_groups, group_size; /* KV cache groups (hybrid)    */
    uint64_t num_blocks;        /* per layer (per pool)                     */
    uint64_t kv_tokens;         /* tokens the cache holds (vLLM's log line) */
    uint64_t kv_bytes;          /* memory the blocks take                   */
    uint64_t kv_bytes_per_token;/* all layers, one token                    */
    uint64_t blocks_per_max_request;  /* at max_model_len                   */
    double max_concurrency;     /* num_blocks / blocks_per_max_request, as
                                   vLLM logs it                             */
    uint64_t request_tokens;    /* the request length asked for             */
    uint64_t blocks_per_request;
    uint64_t concurrency;       /* whole requests of request_tokens that run
                                   at once: blocks / blocks per request,
                                   at most max_num_seqs                     */
    /* outside the reservation */
    uint32_t cudagraph_sizes;   /* batch sizes captured (0: eager)          */
    uint32_t cudagraph_max_size;
    uint64_t cudagraph_bytes;   /* graph pool: the forward's working set at
                                   the largest size (derived)              */
    uint64_t context_bytes;     /* CUDA context and libraries                */
    uint64_t headroom_bytes;    /* total - requested                        */
    bool headroom_ok;           /* context + CUDA graphs fit the headroom   */
} vp_serve_result;

/* Size a vLLM server for model m on gpu. kv gives the cache layout (MLA,
 * sliding windows, from vp_kv_layout_from_hf); NULL takes it from the
 * model's graph (every layer full attention). Returns VP_OK with *out
 * filled; VP_EOOM (with *out filled as far as known, kv_available possibly
 * 0) when the reservation leaves no room for one request of max_model_len,
 * as vLLM refuses to start; VP_EARG for inconsistent settings (utilization
 * outside (0, 1], heads that do not split over the ranks, a max_model_len
 * past the model's, a request longer than max_model_len); VP_EUNSUPPORTED
 * for models without a causal decoder or with mixture-of-experts layers;
 * VP_EOVERFLOW. */
vp_status vp_serve_plan(const vp_model *m, const vp_kv_layout *kv,
                        const vp_gpu_profile *gpu, const vp_serve_config *cfg,
                        vp_serve_result *out, vp_error *err);

#endif
