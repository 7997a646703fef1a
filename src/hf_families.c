/* Hugging Face config.json readers of the newer decoder families: Qwen3,
 * Qwen3-MoE, Qwen2-MoE, Gemma, Gemma 2, Gemma 3 (text), Phi-3 and
 * DeepSeek-V3. Each follows transformers 5.x's configuration_<family>.py
 * for the defaults of keys a config leaves out, and modeling_<family>.py
 * for what the keys build (cited per reader); docs/MODEL_FORMAT.md lists
 * the keys read. The parameter counts these give equal transformers'
 * sum(p.numel()) (tests/test_hf_families.c). */
#include <string.h>

#include "hf_config.h"

vp_status vp__hf_llama_like(vp__fields *f, vp_tf *t)
{
    t->type = VP_TF_DECODER;
    t->rotary = true;
    t->norm = VP_NORM_RMSNORM;
    t->norm_bias = false;
    t->act = VP_ACT_SWIGLU;
    t->bias = false;
    t->qkv_bias = false;
    t->final_norm = true;
    VP_TRY(vp__hf_u64(f, "hidden_size", &t->hidden, true));
    VP_TRY(vp__hf_u64(f, "num_hidden_layers", &t->layers, true));
    VP_TRY(vp__hf_u64(f, "num_attention_heads", &t->heads, true));
    VP_TRY(vp__hf_u64(f, "num_key_value_heads", &t->kv_heads, false));
    VP_TRY(vp__hf_u64(f, "head_dim", &t->head_dim, false));
    VP_TRY(vp__hf_u64(f, "intermediate_size", &t->ffn, true));
    VP_TRY(vp__hf_u64(f, "vocab_size", &t->vocab, true));
    VP_TRY(vp__hf_u64(f, "max_position_embeddings", &t->max_positions,
                      false));
    VP_TRY(vp__hf_prob(f, "attention_dropout", &t->p_attn));
    VP_TRY(vp__hf_bool(f, "attention_bias", &t->qkv_bias));
    return vp__hf_act(f, "hidden_act", VP_ACT_SWIGLU, &t->act);
}

/* A list key that must be empty (a feature vramplan does not build). */
static vp_status must_be_empty(vp__fields *f, const char *key,
                               const char *what)
{
    yaml_node_t *n = vp__hf_node(f, key);
    if (!n)
        return VP_OK;
    if (n->type == YAML_SEQUENCE_NODE &&
        n->data.sequence.items.top == n->data.sequence.items.start)
        return VP_OK;
    return vp__yerr(f->d, n, VP_EUNSUPPORTED, f->err,
                    "\"%s\" is not supported (%s)", key, what);
}

/* transformers 5.x writes `layer_types`, one "full_attention" or
 * "sliding_attention" per layer: read it into the window pattern of
 * vp_tf_ext (windowed from window_from on, every full_every-th of them
 * full). A list no such pattern gives is refused. */
static vp_status layer_types(vp__fields *f, vp_tf *t)
{
    yaml_node_t *n = vp__hf_node(f, "layer_types");
    if (!n)
        return VP_OK;
    vp_ydoc *d = f->d;
    if (n->type != YAML_SEQUENCE_NODE ||
        (uint64_t)(n->data.sequence.items.top -
                   n->data.sequence.items.start) != t->layers)
        return vp__yerr(d, n, VP_ESCHEMA, f->err,
                        "\"layer_types\" must list one type per layer "
                        "(%llu)", (unsigned long long)t->layers);
    bool *sl = calloc(t->layers, sizeof *sl);
    if (!sl)
        return vp_error_set(f->err, VP_ENOMEM, "out of memory");
    uint64_t i = 0, first = t->layers, period = 0;
    for (yaml_node_item_t *it = n->data.sequence.items.start;
         it < n->data.sequence.items.top; it++, i++) {
        yaml_node_t *e = vp__ynode(d, *it);
        const char *v = vp__yscalar(e);
        if (!v || (strcmp(v, "full_attention") &&
                   strcmp(v, "sliding_attention"))) {
            free(sl);
            return vp__yerr(d, e, VP_EUNSUPPORTED, f->err,
                            "unsupported layer type \"%.64s\" (supported: "
                            "full_attention, sliding_attention)",
                            v ? v : "?");
        }
        sl[i] = v[0] == 's';
        if (sl[i] && first == t->layers)
            first = i;
        if (!sl[i] && first < t->layers && !period)
            period = i - first + 1;
    }
    bool ok = true;
    for (i = 0; i < t->layers; i++) {
        bool full = i < first ||
                    (period && (i - first + 1) % period == 0);
        ok &= sl[i] == !full;
    }
    free(sl);
    if (!ok)
        return vp__yerr(d, n, VP_EUNSUPPORTED, f->err,
                        "\"layer_types\" follows no pattern vramplan builds "
                        "(sliding from a layer on, every n-th of them "
                        "full)");
    if (first == t->layers) {
        t->x.window = 0; /* no layer is windowed */
        return VP_OK;
    }
    if (!t->x.window)
        return vp__yerr(d, n, VP_ESCHEMA, f->err,
                        "sliding layers need \"sliding_window\"");
    t->x.window_from = (uint32_t)first; /* < layers <= VP_MAX_REPEAT */
    t->x.full_every = (uint32_t)period;
    return VP_OK;
}

/* The MoE keys of the Qwen families (configuration_qwen{2,3}_moe.py):
 * num_experts (num_local_experts in 5.x), num_experts_per_tok,
 * moe_intermediate_size,
 * decoder_sparse_step, norm_topk_prob; mlp_only_layers must be empty. */
static vp_status qwen_moe(vp__fields *f, vp_tf *t, uint64_t experts,
                          uint64_t top_k, uint64_t moe_ffn)
{
    uint64_t step = 1;
    t->experts = experts;
    t->top_k = top_k;
    t->expert_ffn = moe_ffn;
    /* transformers 5.x writes num_local_experts (num_experts before) */
    VP_TRY(vp__hf_u64(f, "num_experts", &t->experts, false));
    VP_TRY(vp__hf_u64(f, "num_local_experts", &t->experts, false));
    VP_TRY(vp__hf_u64(f, "num_experts_per_tok", &t->top_k, false));
    VP_TRY(vp__hf_u64(f, "moe_intermediate_size", &t->expert_ffn, false));
    VP_TRY(vp__hf_u64(f, "decoder_sparse_step", &step, false));
    VP_TRY(vp__hf_bool(f, "norm_topk_prob", &t->x.norm_topk));
    VP_TRY(must_be_empty(f, "mlp_only_layers",
                         "dense layers other than every "
                         "decoder_sparse_step-th"));
    t->x.moe_every = step > VP_MAX_REPEAT ? VP_MAX_REPEAT : (uint32_t)step;
    t->x.router = VP_ROUTER_SOFTMAX;
    return VP_OK;
}

/* Qwen's optional window (use_sliding_window, max_window_layers), unless
 * layer_types says otherwise. */
static vp_status qwen_window(vp__fields *f, vp_tf *t, uint64_t from)
{
    bool sw = false;
    VP_TRY(vp__hf_bool(f, "use_sliding_window", &sw));
    if (sw) {
        t->x.window = 4096;
        VP_TRY(vp__hf_u64z(f, "sliding_window", &t->x.window));
        VP_TRY(vp__hf_u64z(f, "max_window_layers", &from));
        t->x.window_from =
            from > VP_MAX_REPEAT ? VP_MAX_REPEAT : (uint32_t)from;
    }
    return layer_types(f, t);
}

/* Qwen3Config / modeling_qwen3.py (Qwen3Attention): Llama with RMSNorm
 * over each head of q and k (q_norm, k_norm) before the rotary
 * embedding; head_dim 128 by default. */
vp_status vp__hf_qwen3(vp__fields *f, vp_tf *t, vp_error *err)
{
    (void)err;
    t->head_dim = 128;
    t->max_positions = 32768;
    VP_TRY(vp__hf_llama_like(f, t));
    t->x.qk_norm = true;
    return qwen_window(f, t, 28);
}

/* Qwen3MoeConfig / modeling_qwen3_moe.py (Qwen3MoeSparseMoeBlock): Qwen3
 * attention; every decoder_sparse_step-th layer a softmax top-k router
 * over num_experts experts (transformers 5.x: fused experts, grouped GEMMs,
 * integrations/moe.py), no shared expert. */
vp_status vp__hf_qwen3_moe(vp__fields *f, vp_tf *t, vp_error *err)
{
    (void)err;
    t->head_dim = 128;
    t->max_positions = 32768;
    VP_TRY(vp__hf_llama_like(f, t));
    t->x.qk_norm = true;
    VP_TRY(qwen_moe(f, t, 128, 8, 768));
    return qwen_window(f, t, 28);
}

/* Qwen2MoeConfig / modeling_qwen2_moe.py (Qwen2MoeSparseMoeBlock): Qwen2
 * attention (q, k, v biases); routed experts plus one shared expert of
 * shared_expert_intermediate_size, scaled by sigmoid(shared_expert_gate). */
vp_status vp__hf_qwen2_moe(vp__fields *f, vp_tf *t, vp_error *err)
{
    (void)err;
    t->max_positions = 32768;
    VP_TRY(vp__hf_llama_like(f, t));
    t->qkv_bias = true;
    VP_TRY(vp__hf_bool(f, "qkv_bias", &t->qkv_bias));
    VP_TRY(qwen_moe(f, t, 60, 4, 1408));
    t->x.shared_ffn = 5632;
    VP_TRY(vp__hf_u64(f, "shared_expert_intermediate_size", &t->x.shared_ffn,
                      false));
    t->shared_experts = 1;
    t->x.shared_gate = true;
    return qwen_window(f, t, 28);
}

/* What the Gemma generations share (modeling_gemma*.py): embeddings times
 * sqrt(hidden) in their dtype, RMSNorm computed in fp32 with weight 1 + w
 * (GemmaRMSNorm), GeGLU with gelu_pytorch_tanh (`hidden_activation`, the
 * older `hidden_act`), head_dim 256, a tied head. */
static vp_status gemma_common(vp__fields *f, vp_tf *t)
{
    t->head_dim = 256;
    t->max_positions = 8192;
    t->tied = true;
    VP_TRY(vp__hf_llama_like(f, t));
    t->act = VP_ACT_GEGLU;
    VP_TRY(vp__hf_act(f, "hidden_act", VP_ACT_SWIGLU, &t->act));
    VP_TRY(vp__hf_act(f, "hidden_activation", VP_ACT_SWIGLU, &t->act));
    t->x.norm_offset = true;
    t->x.embed_scale = true;
    return VP_OK;
}

/* GemmaConfig / modeling_gemma.py. */
vp_status vp__hf_gemma(vp__fields *f, vp_tf *t, vp_error *err)
{
    (void)err;
    return gemma_common(f, t);
}

/* Gemma2Config / modeling_gemma2.py: four norms per layer (input,
 * post_attention, pre_feedforward, post_feedforward), soft-capped
 * attention scores (eager attention only) and logits, alternate layers
 * windowed (sliding_window, layer_types). */
vp_status vp__hf_gemma2(vp__fields *f, vp_tf *t, vp_error *err)
{
    (void)err;
    VP_TRY(gemma_common(f, t));
    t->x.post_norms = true;
    t->x.attn_softcap = 50.0;
    t->x.logit_softcap = 30.0;
    t->x.window = 4096;
    t->x.full_every = 2;
    VP_TRY(vp__hf_pos(f, "attn_logit_softcapping", 1e6, &t->x.attn_softcap));
    VP_TRY(vp__hf_pos(f, "final_logit_softcapping", 1e6,
                      &t->x.logit_softcap));
    if (!vp__hf_node(f, "attn_logit_softcapping") &&
        vp__ymap_get(f->d, f->map, "attn_logit_softcapping", NULL))
        t->x.attn_softcap = 0; /* null: none */
    if (!vp__hf_node(f, "final_logit_softcapping") &&
        vp__ymap_get(f->d, f->map, "final_logit_softcapping", NULL))
        t->x.logit_softcap = 0;
    VP_TRY(vp__hf_u64z(f, "sliding_window", &t->x.window));
    return layer_types(f, t);
}

/* Gemma3TextConfig / modeling_gemma3.py (Gemma3ForCausalLM): Gemma 2's
 * layer with q and k normed per head (Gemma3RMSNorm), no soft-capping by
 * default, five windowed layers to one full (sliding_window_pattern 6). */
vp_status vp__hf_gemma3_text(vp__fields *f, vp_tf *t, vp_error *err)
{
    (void)err;
    VP_TRY(gemma_common(f, t));
    t->max_positions = 131072;
    VP_TRY(vp__hf_u64(f, "max_position_embeddings", &t->max_positions,
                      false));
    t->x.post_norms = true;
    t->x.qk_norm = true;
    t->x.window = 4096;
    t->x.full_every = 6;
    uint64_t pat = 0;
    VP_TRY(vp__hf_u64(f, "sliding_window_pattern", &pat, false));
    if (pat)
        t->x.full_every = pat > VP_MAX_REPEAT ? VP_MAX_REPEAT : (uint32_t)pat;
    VP_TRY(vp__hf_pos(f, "attn_logit_softcapping", 1e6, &t->x.attn_softcap));
    VP_TRY(vp__hf_pos(f, "final_logit_softcapping", 1e6,
                      &t->x.logit_softcap));
    VP_TRY(vp__hf_u64z(f, "sliding_window", &t->x.window));
    return layer_types(f, t);
}

/* Phi3Config / modeling_phi3.py: one qkv_proj and one gate_up_proj (both
 * nn.Linear without bias), dropout after the embeddings and on each
 * residual branch (embd_pdrop, resid_pdrop). A partial rotary embedding
 * (partial_rotary_factor < 1, Phi-4-mini) is not built. */
vp_status vp__hf_phi3(vp__fields *f, vp_tf *t, vp_error *err)
{
    (void)err;
    t->max_positions = 4096;
    VP_TRY(vp__hf_llama_like(f, t));
    t->x.packed_qkv = true;
    t->x.fused_gate_up = true;
    VP_TRY(vp__hf_prob(f, "embd_pdrop", &t->p_embd));
    VP_TRY(vp__hf_prob(f, "resid_pdrop", &t->p_resid));
    double prf = 1.0;
    VP_TRY(vp__hf_pos(f, "partial_rotary_factor", 1.0, &prf));
    if (prf < 1.0)
        return vp__yerr(f->d, vp__hf_node(f, "partial_rotary_factor"),
                        VP_EUNSUPPORTED, f->err,
                        "a partial rotary embedding (partial_rotary_factor "
                        "%g) is not supported", prf);
    VP_TRY(vp__hf_u64z(f, "sliding_window", &t->x.window));
    return layer_types(f, t);
}

/* DeepseekV3Config / modeling_deepseek_v3.py: multi-head latent
 * attention (q through q_lora_rank unless null, k and v from a
 * kv_lora_rank latent plus a shared rotary key), the first
 * first_k_dense_replace layers dense, then n_routed_experts routed by
 * sigmoid scores over n_group groups (topk_group kept) plus
 * n_shared_experts shared ones of moe_intermediate_size. The
 * multi-token-prediction layers (num_nextn_predict_layers) are not part of
 * transformers' model and are not built. */
vp_status vp__hf_deepseek_v3(vp__fields *f, vp_tf *t, vp_error *err)
{
    (void)err;
    vp_tf_ext *x = &t->x;
    t->max_positions = 4096;
    VP_TRY(vp__hf_llama_like(f, t));
    t->kv_heads = 0;
    t->head_dim = 0;
    x->mla = (vp_tf_mla){1536, 512, 128, 64, 128};
    yaml_node_t *qn = vp__ymap_get(f->d, f->map, "q_lora_rank", NULL);
    if (qn && vp__yis_null(qn))
        x->mla.q_lora = 0;
    VP_TRY(vp__hf_u64(f, "q_lora_rank", &x->mla.q_lora, false));
    VP_TRY(vp__hf_u64(f, "kv_lora_rank", &x->mla.kv_lora, false));
    VP_TRY(vp__hf_u64(f, "qk_nope_head_dim", &x->mla.qk_nope, false));
    VP_TRY(vp__hf_u64(f, "qk_rope_head_dim", &x->mla.qk_rope, false));
    VP_TRY(vp__hf_u64(f, "v_head_dim", &x->mla.v_dim, false));
    t->experts = 256;
    t->top_k = 8;
    t->expert_ffn = 2048;
    t->shared_experts = 1;
    x->dense_layers = 3;
    x->n_group = 8;
    x->topk_group = 4;
    x->norm_topk = true;
    x->router = VP_ROUTER_SIGMOID_GROUP;
    VP_TRY(vp__hf_u64(f, "n_routed_experts", &t->experts, false));
    VP_TRY(vp__hf_u64(f, "num_experts_per_tok", &t->top_k, false));
    VP_TRY(vp__hf_u64(f, "moe_intermediate_size", &t->expert_ffn, false));
    VP_TRY(vp__hf_u64z(f, "n_shared_experts", &t->shared_experts));
    VP_TRY(vp__hf_u64z(f, "first_k_dense_replace", &x->dense_layers));
    VP_TRY(vp__hf_u64(f, "n_group", &x->n_group, false));
    VP_TRY(vp__hf_u64(f, "topk_group", &x->topk_group, false));
    VP_TRY(vp__hf_bool(f, "norm_topk_prob", &x->norm_topk));
    return VP_OK;
}
