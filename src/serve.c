/* Sizing a vLLM server (serve.h): vLLM's defaults, its memory budget and
 * its KV-cache blocks. The rules and their sources (vLLM's V1 engine, the
 * files read at the commits named in docs/SERVING.md) are:
 *
 *   requested   = total x gpu_memory_utilization
 *                 (vllm/v1/worker/gpu_worker.py Worker.init_device)
 *   non_kv      = weights + torch peak increase of the profile run
 *                 + non-torch increase     (vllm/utils/mem_utils.py
 *                 memory_profiling, MemoryProfilingResult)
 *   available   = requested - non_kv       (Worker.determine_available_memory)
 *   page        = block_size x kv_heads x (key + value width) x dtype bytes
 *                 (MLA: block_size x latent width x dtype bytes)
 *                 (vllm/v1/kv_cache_interface.py *Spec.real_page_size_bytes)
 *   num_blocks  = available // page // layers-per-pool
 *                 (vllm/v1/core/kv_cache_utils.py get_num_blocks,
 *                 _get_kv_cache_config_uniform_type / _uniform_page_size) */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "serve_impl.h"
#include "util.h"
#include "vramplan/serve.h"
#include "vramplan/units.h"

/* vllm/engine/arg_utils.py EngineArgs._set_default_args, for `vllm serve`
 * (UsageContext.OPENAI_API_SERVER): larger batches on GPUs of at least 70
 * GiB that are not A100s. */
#define BIG_GPU_BYTES (70 * VP_GiB)
#define BIG_BATCHED_TOKENS 8192u
#define BIG_NUM_SEQS 1024u
#define SMALL_BATCHED_TOKENS 2048u
#define SMALL_NUM_SEQS 256u

/* vllm/config/vllm.py: capture sizes 1, 2, 4, then every 8 below 256 and
 * every 16 from 256, up to min(2 x max_num_seqs, 512). */
#define CG_MAX_SIZE 512u

void vp_serve_config_init(vp_serve_config *c)
{
    memset(c, 0, sizeof *c);
    c->gpu_memory_utilization = VP_SERVE_DEFAULT_UTILIZATION;
    c->block_size = VP_SERVE_DEFAULT_BLOCK;
    c->dtype_bytes = 2;
    c->tensor_parallel = 1;
}

static uint64_t cdiv(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

static bool is_a100(const vp_gpu_profile *gpu)
{
    const char *s = vp_gpu_product(gpu);
    for (; *s; s++)
        if (strncasecmp(s, "a100", 4) == 0)
            return true;
    return false;
}

static vp_status resolve(const vp_model *m, const vp_kv_layout *kv,
                         const vp_gpu_profile *gpu, const vp_serve_config *c,
                         vp_serve_result *r, vp_error *err)
{
    bool big = vp_gpu_usable_bytes(gpu) >= BIG_GPU_BYTES && !is_a100(gpu);
    uint64_t model_len = kv && kv->max_positions ? kv->max_positions
                                                 : vp_model_default_seq(m);

    if (!(c->gpu_memory_utilization > 0.0 &&
          c->gpu_memory_utilization <= 1.0))
        return vp_error_set(err, VP_EARG,
                            "gpu_memory_utilization %g is not in (0, 1]",
                            c->gpu_memory_utilization);
    if (c->block_size == 0 || c->tensor_parallel == 0 ||
        (c->dtype_bytes != 2 && c->dtype_bytes != 4) ||
        (c->kv_dtype_bytes != 0 && c->kv_dtype_bytes != 1 &&
         c->kv_dtype_bytes != c->dtype_bytes))
        return vp_error_set(err, VP_EARG, "invalid block size, ranks or "
                                          "data type");
    r->max_model_len = c->max_model_len ? c->max_model_len : model_len;
    if (r->max_model_len == 0)
        return vp_error_set(err, VP_EARG, "the model gives no maximum "
                                          "length: set max_model_len");
    if (model_len && r->max_model_len > model_len)
        return vp_error_set(err, VP_EARG,
                            "max_model_len %llu exceeds the model's %llu",
                            (unsigned long long)r->max_model_len,
                            (unsigned long long)model_len);
    r->max_num_batched_tokens =
        c->max_num_batched_tokens ? c->max_num_batched_tokens
        : big                     ? BIG_BATCHED_TOKENS
                                  : SMALL_BATCHED_TOKENS;
    r->max_num_seqs = c->max_num_seqs ? c->max_num_seqs
                      : big           ? BIG_NUM_SEQS
                                      : SMALL_NUM_SEQS;
    if (!c->max_num_seqs && r->max_num_seqs > r->max_num_batched_tokens)
        r->max_num_seqs = r->max_num_batched_tokens;
    if (r->max_num_seqs > r->max_num_batched_tokens)
        return vp_error_set(err, VP_EARG,
                            "max_num_seqs %llu exceeds max_num_batched_tokens"
                            " %llu",
                            (unsigned long long)r->max_num_seqs,
                            (unsigned long long)r->max_num_batched_tokens);
    r->request_tokens = c->request_tokens ? c->request_tokens
                                          : r->max_model_len;
    if (r->request_tokens > r->max_model_len)
        return vp_error_set(err, VP_EARG,
                            "a request of %llu tokens exceeds max_model_len "
                            "%llu",
                            (unsigned long long)r->request_tokens,
                            (unsigned long long)r->max_model_len);
    r->block_size = c->block_size;
    r->tensor_parallel = c->tensor_parallel;
    r->kv_dtype_bytes = c->kv_dtype_bytes ? c->kv_dtype_bytes
                                          : c->dtype_bytes;
    return VP_OK;
}

/* ------------------------------------------------------------------ */
/* KV cache groups and blocks                                           */
/* ------------------------------------------------------------------ */

/* Blocks one layer needs for a request of `len` tokens
 * (FullAttentionSpec / SlidingWindowSpec.max_memory_usage_bytes: a sliding
 * layer keeps window - 1 computed tokens plus the scheduled ones, and one
 * more block because the window need not start at a block boundary). */
static uint64_t layer_blocks(const vp_kv_layer *l, uint64_t len,
                             const vp_serve_result *r)
{
    if (l->kind != VP_KV_SLIDING)
        return cdiv(len, r->block_size);
    uint64_t n = l->window - 1 + r->max_num_batched_tokens;
    return cdiv(n < len ? n : len, r->block_size) + 1;
}

/* Layer types, as vLLM groups them (a type is a kind and a window). */
typedef struct kv_type {
    const vp_kv_layer *first;
    uint32_t count;
} kv_type;

static uint32_t layer_types(const vp_kv_layout *kv, kv_type *types,
                            uint32_t max)
{
    uint32_t n = 0;

    for (uint32_t i = 0; i < kv->n_layers; i++) {
        const vp_kv_layer *l = &kv->layer[i];
        uint32_t k = 0;
        while (k < n && !(types[k].first->kind == l->kind &&
                          types[k].first->window == l->window))
            k++;
        if (k == n) {
            if (n == max)
                return max + 1; /* too many layer types */
            types[n++] = (kv_type){l, 0};
        }
        types[k].count++;
    }
    return n;
}

/* Blocks of a request of `len` tokens over the groups: the sum over the
 * groups of one layer's blocks (get_max_concurrency_for_kv_cache_config). */
static uint64_t request_blocks(const kv_type *types, uint32_t n_types,
                               uint32_t group_size, uint64_t len,
                               const vp_serve_result *r)
{
    uint64_t blocks = 0;

    for (uint32_t k = 0; k < n_types; k++)
        blocks += cdiv(types[k].count, group_size) *
                  layer_blocks(types[k].first, len, r);
    return blocks;
}

#define MAX_TYPES 8u

static vp_status kv_blocks(const vp_kv_layout *kv, vp_serve_result *r,
                           vp_error *err)
{
    kv_type types[MAX_TYPES];
    uint32_t n_types = layer_types(kv, types, MAX_TYPES);
    uint64_t page = 0, p, need, bytes;

    if (n_types > MAX_TYPES)
        return vp_error_set(err, VP_EUNSUPPORTED,
                            "more than %u kinds of attention layers",
                            MAX_TYPES);

    for (uint32_t i = 0; i < kv->n_layers; i++) {
        VP_TRY(vp_kv_layer_token_bytes(&kv->layer[i], r->kv_dtype_bytes,
                                       r->tensor_parallel, &p, err));
        if (!vp_mul_u64(p, r->block_size, &p))
            return vp_error_set(err, VP_EOVERFLOW, "page size overflows");
        if (page && p != page)
            return vp_error_set(err, VP_EUNSUPPORTED,
                                "layers of different page sizes (vLLM's "
                                "uniform-page-size grouping does not "
                                "apply)");
        page = p;
    }
    VP_TRY(vp_kv_token_bytes(kv, r->kv_dtype_bytes, r->tensor_parallel,
                             &r->kv_bytes_per_token, err));
    r->page_bytes = page;
    r->n_layers = kv->n_layers;
    /* one type: every layer its own tensor; several: groups of the
     * smallest type's count share num_blocks pools */
    r->group_size = kv->n_layers;
    for (uint32_t k = 0; n_types > 1 && k < n_types; k++)
        if (types[k].count < r->group_size)
            r->group_size = types[k].count;
    r->n_groups = 0;
    for (uint32_t k = 0; k < n_types; k++)
        r->n_groups += (uint32_t)cdiv(types[k].count, r->group_size);
    r->num_blocks = r->kv_available / page / r->group_size;
    r->kv_tokens = r->num_blocks / (n_types > 1 ? r->n_groups : 1) *
                   r->block_size;
    if (!vp_mul_u64(r->num_blocks, page, &bytes) ||
        !vp_mul_u64(bytes, r->group_size, &r->kv_bytes))
        return vp_error_set(err, VP_EOVERFLOW, "cache bytes overflow");
    r->blocks_per_max_request = request_blocks(types, n_types, r->group_size,
                                               r->max_model_len, r);
    r->blocks_per_request = request_blocks(types, n_types, r->group_size,
                                           r->request_tokens, r);
    r->max_concurrency =
        (double)r->num_blocks / (double)r->blocks_per_max_request;
    r->concurrency = r->num_blocks / r->blocks_per_request;
    if (r->concurrency > r->max_num_seqs)
        r->concurrency = r->max_num_seqs;
    /* check_enough_kv_cache_memory: one request of max_model_len */
    if (!vp_mul_u64(r->blocks_per_max_request, page, &need) ||
        !vp_mul_u64(need, r->group_size, &need))
        return vp_error_set(err, VP_EOVERFLOW, "cache bytes overflow");
    if (r->kv_available == 0 || need > r->kv_available)
        return vp_error_set(err, VP_EOOM,
                            "one request of max_model_len %llu tokens needs "
                            "%llu bytes of KV cache, %llu are available",
                            (unsigned long long)r->max_model_len,
                            (unsigned long long)need,
                            (unsigned long long)r->kv_available);
    return VP_OK;
}

/* ------------------------------------------------------------------ */
/* The plan                                                             */
/* ------------------------------------------------------------------ */

static uint32_t capture_sizes(uint64_t max_num_seqs, uint64_t max_tokens,
                              uint32_t *largest)
{
    uint64_t top = 2 * max_num_seqs < CG_MAX_SIZE ? 2 * max_num_seqs
                                                  : CG_MAX_SIZE;
    uint32_t n = 0;

    if (top > max_tokens)
        top = max_tokens;
    *largest = 0;
    for (uint64_t s = 1; s <= top; s = s < 8 ? (s == 4 ? 8 : s * 2)
                                     : s < 256 ? s + 8
                                               : s + 16) {
        n++;
        *largest = (uint32_t)s;
    }
    return n;
}

/* vLLM's memory budget and the part that is left for the cache. */
static vp_status budget(const vp_gpu_profile *gpu, const vp_serve_config *c,
                        vp_serve_result *r, vp_error *err)
{
    const vp_gpu_measured *ms = vp_gpu_measured_get(gpu);
    uint64_t non_kv;

    r->total_bytes = vp_gpu_usable_bytes(gpu);
    r->requested_bytes = (uint64_t)floor((double)r->total_bytes *
                                         c->gpu_memory_utilization);
    r->context_bytes = vp_gpu_context_bytes(gpu, NULL);
    r->non_torch_bytes = c->non_torch_bytes;
    r->non_torch_estimated = false;
    if (!c->non_torch_given) {
        /* kernels and library state loaded after the start snapshot: what
         * PyTorch's first operations add to the bare CUDA context */
        r->non_torch_bytes = ms && ms->context_lazy_bytes &&
                                     r->context_bytes > ms->context_lazy_bytes
                                 ? r->context_bytes - ms->context_lazy_bytes
                                 : 0;
        r->non_torch_estimated = !(ms && ms->context_lazy_bytes);
    }
    if (!vp_add_u64(r->weight_bytes, r->activation_peak, &non_kv) ||
        !vp_add_u64(non_kv, r->non_torch_bytes, &non_kv))
        return vp_error_set(err, VP_EOVERFLOW, "memory overflows 64 bits");
    r->kv_available = r->requested_bytes > non_kv
                          ? r->requested_bytes - non_kv
                          : 0;
    r->headroom_bytes = r->total_bytes - r->requested_bytes;
    r->headroom_ok = r->context_bytes <= r->headroom_bytes &&
                     r->cudagraph_bytes <=
                         r->headroom_bytes - r->context_bytes;
    return VP_OK;
}

static vp_status profile(const vp_model *m, const vp_kv_layout *kv,
                         const vp_serve_config *c, vp_serve_result *r,
                         vp_error *err)
{
    uint64_t max_pos = kv && kv->max_positions ? kv->max_positions
                                               : vp_model_default_seq(m);
    vp_graph *g = vp_graph_build(m, 1, 1, err);
    sv_dims d;
    sv_profile p = {r->max_num_batched_tokens, r->max_num_seqs,
                    c->dtype_bytes, c->tensor_parallel, c->enforce_eager,
                    false};
    uint64_t s, pk;
    vp_status st;

    if (!g)
        return err->code;
    st = vp__serve_dims(g, &d, err);
    if (st == VP_OK)
        st = vp__serve_weights(g, &d, c->dtype_bytes, c->tensor_parallel,
                               max_pos, &r->weight_bytes, err);
    vp_graph_free(g);
    VP_TRY(st);
    VP_TRY(vp__serve_profile(&d, &p, &r->forward_peak, &r->sampler_peak,
                             &r->activation_peak, err));
    if (!c->enforce_eager) {
        r->cudagraph_sizes = capture_sizes(
            r->max_num_seqs, r->max_num_batched_tokens,
            &r->cudagraph_max_size);
        p = (sv_profile){r->cudagraph_max_size, 1, c->dtype_bytes,
                         c->tensor_parallel, false, true};
        VP_TRY(vp__serve_profile(&d, &p, &r->cudagraph_bytes, &s, &pk, err));
    }
    return VP_OK;
}

vp_status vp_serve_plan(const vp_model *m, const vp_kv_layout *kv,
                        const vp_gpu_profile *gpu, const vp_serve_config *c,
                        vp_serve_result *out, vp_error *err)
{
    vp_kv_layout own = {0};
    vp_status st;

    vp_error_clear(err);
    memset(out, 0, sizeof *out);
    VP_TRY(resolve(m, kv, gpu, c, out, err));
    VP_TRY(profile(m, kv, c, out, err));
    VP_TRY(budget(gpu, c, out, err));
    if (!kv) {
        vp_graph *g = vp_graph_build(m, 1, 1, err);
        if (!g)
            return err->code;
        st = vp_kv_layout_from_graph(g, &own, err);
        vp_graph_free(g);
        VP_TRY(st);
        kv = &own;
    }
    st = kv_blocks(kv, out, err);
    vp_kv_layout_destroy(&own);
    return st;
}
