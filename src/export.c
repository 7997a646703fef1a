/* A cluster plan written as what the engines take: a DeepSpeed JSON
 * config, Megatron-LM pretrain_gpt.py arguments (launched by torchrun), a
 * torchrun command for a Hugging Face Trainer script with its FSDP or DDP
 * flags. docs/CLUSTER.md lists every field. */
#include <ctype.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "vramplan/cluster.h"
#include "vramplan/units.h"

/* An appender into a caller's buffer that keeps counting past its end. */
typedef struct {
    char *buf;
    size_t cap, len;
} sbuf;

static void put(sbuf *s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static void put(sbuf *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    size_t room = s->len < s->cap ? s->cap - s->len : 0;
    int n = vsnprintf(room ? s->buf + s->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n > 0)
        s->len += (size_t)n;
}

static bool contains_ci(const char *hay, const char *needle)
{
    size_t n = strlen(needle);
    for (; *hay; hay++) {
        size_t i = 0;
        while (i < n && hay[i] &&
               tolower((unsigned char)hay[i]) == needle[i])
            i++;
        if (i == n)
            return true;
    }
    return false;
}

/* The Hugging Face decoder-layer class FSDP's auto-wrap policy needs. */
static const char *layer_class(const char *model)
{
    static const struct {
        const char *key, *cls;
    } known[] = {
        {"mixtral", "MixtralDecoderLayer"}, {"mistral", "MistralDecoderLayer"},
        {"llama", "LlamaDecoderLayer"},     {"qwen2", "Qwen2DecoderLayer"},
        {"gpt2", "GPT2Block"},              {"bert", "BertLayer"},
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (contains_ci(model, known[i].key))
            return known[i].cls;
    return "DecoderLayer";
}

static vp_status unsupported(vp_error *err, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static vp_status unsupported(vp_error *err, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return vp_error_set(err, VP_EUNSUPPORTED, "%s", msg);
}

static uint64_t global_batch(const vp_par *p)
{
    return (uint64_t)p->dp * p->micro_batch * p->accum;
}

static void header(sbuf *s, const char *cmt, const vp_cluster_model_info *in,
                   const vp_cluster *c, const vp_par *p)
{
    put(s, "%s vramplan plan: %s on %u x %s (%u per node), global batch %"
           PRIu64 " x %" PRIu64 " tokens\n",
        cmt, in->name, c->gpus, c->hw.name, c->gpus_per_node,
        global_batch(p), in->seq);
    char sched[48] = "";
    if (p->pp > 1)
        snprintf(sched, sizeof sched, " (%s, %u chunks per stage)",
                 vp_schedule_name(p->schedule), p->vpp);
    put(s, "%s dp %u, tp %u%s, pp %u%s, cp %u, ep %u; micro-batch %" PRIu64
           " x %" PRIu64 " per step; %s, recompute %s, %s, offload %s\n",
        cmt, p->dp, p->tp, p->sp ? " + sp" : "", p->pp, sched, p->cp, p->ep,
        p->micro_batch, p->accum, vp_dtype_name(p->dtype),
        vp_recompute_name(p->recompute), vp_sharding_name(p->sharding),
        vp_offload_name(p->offload));
}

/* ---- DeepSpeed ------------------------------------------------------- */

/* The ZeRO section: stage, buckets, stage-3 prefetch sizes, offloads. */
static json_t *zero_section(const vp_cluster_model_info *in, const vp_par *p,
                            int stage)
{
    uint64_t unit = in->layer_params / (p->tp ? p->tp : 1);
    int overlap = stage >= 2 && p->overlap_dp != VP_OFF;
    json_t *z = json_pack("{s:i, s:b, s:b, s:b, s:I}", "stage", stage,
                          "overlap_comm", overlap, "contiguous_gradients", 1,
                          "reduce_scatter", 1, "reduce_bucket_size",
                          (json_int_t)50000000);
    int bad = z == NULL;

    if (unit == 0)
        unit = 1;
    if (!bad && stage <= 2)
        bad |= json_object_set_new(z, "allgather_bucket_size",
                                   json_integer(50000000));
    if (!bad && stage == 3)
        bad |= json_object_update_new(
            z, json_pack("{s:I, s:I, s:I, s:I}",
                         "stage3_prefetch_bucket_size", (json_int_t)unit,
                         "stage3_max_live_parameters", (json_int_t)(2 * unit),
                         "stage3_max_reuse_distance", (json_int_t)(2 * unit),
                         "stage3_param_persistence_threshold",
                         (json_int_t)100000));
    if (!bad && p->offload != VP_OFFLOAD_NONE)
        bad |= json_object_set_new(z, "offload_optimizer",
                                   json_pack("{s:s, s:b}", "device", "cpu",
                                             "pin_memory", 1));
    if (!bad && p->offload == VP_OFFLOAD_ALL)
        bad |= json_object_set_new(z, "offload_param",
                                   json_pack("{s:s, s:b}", "device", "cpu",
                                             "pin_memory", 1));
    if (bad) {
        json_decref(z);
        return NULL;
    }
    return z;
}

/* A DeepSpeed JSON config (written through jansson). */
static vp_status deepspeed(sbuf *s, const vp_cluster_model_info *in,
                           const vp_par *p, vp_error *err)
{
    int stage = p->sharding == VP_SHARD_ZERO1   ? 1
                : p->sharding == VP_SHARD_ZERO2 ? 2
                                                : 3;
    json_t *o = json_pack("{s:I, s:I, s:I}", "train_batch_size",
                          (json_int_t)global_batch(p),
                          "train_micro_batch_size_per_gpu",
                          (json_int_t)p->micro_batch,
                          "gradient_accumulation_steps",
                          (json_int_t)p->accum);
    int bad = o == NULL;

    if (!bad && p->dtype == VP_DT_BF16)
        bad |= json_object_set_new(o, "bf16",
                                   json_pack("{s:b}", "enabled", 1));
    else if (!bad && p->dtype == VP_DT_FP16)
        bad |= json_object_set_new(o, "fp16",
                                   json_pack("{s:b, s:i, s:i}", "enabled", 1,
                                             "loss_scale", 0,
                                             "initial_scale_power", 16));
    if (!bad)
        bad |= json_object_set_new(o, "gradient_clipping", json_real(1.0));
    /* AutoTP training (deepspeed.ai/tutorials/autotp-training) */
    if (!bad && p->tp > 1)
        bad |= json_object_set_new(o, "tensor_parallel",
                                   json_pack("{s:i}", "autotp_size",
                                             (int)p->tp));
    if (!bad)
        bad |= json_object_set_new(o, "zero_optimization",
                                   zero_section(in, p, stage));
    if (!bad && p->pp > 1)
        bad |= json_object_set_new(
            o, "pipeline",
            json_pack("{s:i, s:s, s:i}", "stages", (int)p->pp, "partition",
                      "parameters", "activation_checkpoint_interval",
                      p->recompute == VP_RC_FULL ? 1 : 0));
    if (!bad)
        bad |= json_object_update_new(
            o, json_pack("{s:{s:b, s:b, s:b, s:o}, s:i, s:b}",
                         "activation_checkpointing", "partition_activations",
                         0, "cpu_checkpointing", 0,
                         "contiguous_memory_optimization", 0,
                         "number_checkpoints",
                         p->recompute == VP_RC_FULL ? json_null()
                                                    : json_integer(0),
                         "steps_per_print", 10, "wall_clock_breakdown", 0));
    char *text = bad ? NULL : json_dumps(o, JSON_INDENT(2));
    json_decref(o);
    if (text == NULL)
        return vp_error_set(err, VP_ENOMEM, "out of memory");
    put(s, "%s\n", text);
    free(text);
    return VP_OK;
}

/* ---- Megatron-LM ----------------------------------------------------- */

/* One flag of an argument line: the line's indent first. */
static bool flag(sbuf *s, bool line, const char *f)
{
    put(s, "%s%s", line ? " " : "    ", f);
    return true;
}

static vp_status megatron(sbuf *s, const vp_cluster_model_info *in,
                          const vp_cluster *c, const vp_par *p,
                          vp_error *err)
{
    (void)err;
    uint32_t per_node = c->gpus < c->gpus_per_node ? c->gpus
                                                   : c->gpus_per_node;
    uint32_t nodes = (c->gpus + per_node - 1) / per_node;
    header(s, "#", in, c, p);
    put(s, "torchrun --nproc-per-node %u --nnodes %u --node-rank "
           "\"${NODE_RANK:-0}\" \\\n    --master-addr "
           "\"${MASTER_ADDR:-localhost}\" --master-port 6000 \\\n"
           "  pretrain_gpt.py \\\n",
        per_node, nodes);
    put(s, "    --num-layers %" PRIu64 " --hidden-size %" PRIu64
           " --num-attention-heads %" PRIu64 " \\\n    --ffn-hidden-size %"
           PRIu64 " --seq-length %" PRIu64 " --max-position-embeddings %"
           PRIu64 " \\\n",
        in->layers, in->hidden, in->heads, in->ffn, in->seq,
        in->max_positions > in->seq ? in->max_positions : in->seq);
    put(s, "    --position-embedding-type %s --normalization %s%s%s%s \\\n",
        in->rotary ? "rope" : "learned_absolute",
        in->rmsnorm ? "RMSNorm" : "LayerNorm",
        in->gated_mlp ? " --swiglu" : "",
        in->bias ? "" : " --disable-bias-linear",
        in->tied ? "" : " --untie-embeddings-and-output-weights");
    put(s, "    --attention-dropout %g --hidden-dropout %g \\\n",
        in->attn_dropout, in->hidden_dropout);
    if (in->kv_heads != in->heads)
        put(s, "    --group-query-attention --num-query-groups %" PRIu64
               " \\\n",
            in->kv_heads);
    if (in->experts)
        put(s, "    --num-experts %" PRIu64 " --moe-router-topk %" PRIu64
               " --expert-model-parallel-size %u \\\n",
            in->experts, in->top_k, p->ep);
    put(s, "    --micro-batch-size %" PRIu64 " --global-batch-size %" PRIu64
           " \\\n",
        p->micro_batch, global_batch(p));
    put(s, "    --tensor-model-parallel-size %u%s \\\n", p->tp,
        p->sp ? " --sequence-parallel" : "");
    put(s, "    --pipeline-model-parallel-size %u", p->pp);
    bool uneven = p->first_layers || p->last_layers;
    if (p->schedule == VP_SCHED_INTERLEAVED) {
        if (uneven || in->layers % ((uint64_t)p->pp * p->vpp))
            put(s, " --num-virtual-stages-per-pipeline-rank %u", p->vpp);
        else
            put(s, " --num-layers-per-virtual-pipeline-stage %" PRIu64,
                in->layers / ((uint64_t)p->pp * p->vpp));
    }
    put(s, " \\\n");
    if (p->first_layers)
        put(s, "    --decoder-first-pipeline-num-layers %u \\\n",
            p->first_layers);
    if (p->last_layers)
        put(s, "    --decoder-last-pipeline-num-layers %u \\\n",
            p->last_layers);
    if (p->cp > 1)
        put(s, "    --context-parallel-size %u \\\n", p->cp);
    if (p->mtp)
        put(s, "    --mtp-num-layers %u \\\n", p->mtp);
    if (p->dtype == VP_DT_BF16)
        put(s, "    --bf16 \\\n");
    else if (p->dtype == VP_DT_FP16)
        put(s, "    --fp16 \\\n");
    else if (p->dtype == VP_DT_FP8)
        put(s, "    --bf16 --fp8-format hybrid --transformer-impl "
               "transformer_engine \\\n");
    /* fp16 reduces its gradients in fp16 unless asked (Megatron's
     * arguments.py forces fp32 accumulation for bf16 only) */
    bool ov = p->overlap_dp != VP_OFF, line = false;
    if (p->dtype != VP_DT_FP16)
        line = flag(s, line, "--accumulate-allreduce-grads-in-fp32");
    if (ov)
        line = flag(s, line, "--overlap-grad-reduce");
    if (p->sharding == VP_SHARD_DISTOPT) {
        if (line)
            put(s, " \\\n");
        line = flag(s, false, "--use-distributed-optimizer");
        if (ov)
            line = flag(s, line, "--overlap-param-gather");
    }
    if (p->overlap_tp == VP_ON)
        line = flag(s, line, "--tp-comm-overlap");
    if (p->overlap_ep == VP_ON)
        line = flag(s, line, "--overlap-moe-expert-parallel-comm");
    if (line)
        put(s, " \\\n");
    if (p->recompute == VP_RC_SELECTIVE)
        put(s, "    --recompute-activations \\\n");
    else if (p->recompute == VP_RC_FULL)
        put(s, "    --recompute-granularity full --recompute-method uniform "
               "--recompute-num-layers 1 \\\n");
    if (p->offload == VP_OFFLOAD_OPTIMIZER)
        put(s, "    --optimizer-cpu-offload --optimizer-offload-fraction 1.0 "
               "\\\n");
    put(s, "    --use-flash-attn \\\n");
    put(s, "    \"$@\"\n");
    return VP_OK;
}

/* ---- torchrun + Hugging Face Trainer ---------------------------------- */

/* The Trainer's fsdp_config as a file the command writes; cfg (NULL when
 * json_pack ran out of memory) is released. */
static vp_status put_fsdp_config(sbuf *s, json_t *cfg, vp_error *err)
{
    char *text = cfg != NULL ? json_dumps(cfg, 0) : NULL;
    json_decref(cfg);
    if (text == NULL)
        return vp_error_set(err, VP_ENOMEM, "out of memory");
    put(s, "cat > fsdp_config.json <<'EOF'\n%s\nEOF\n", text);
    free(text);
    return VP_OK;
}

/* FSDP2 through the Trainer (transformers training_args.py: fsdp_config
 * "version" 2 hands accelerate's FSDP2 plugin the run; full_shard is
 * reshard_after_forward True, hybrid_shard a (replicate, shard) mesh). */
static vp_status fsdp2_header(sbuf *s, const vp_par *p, const char *cls,
                              const char *dt, vp_error *err)
{
    put(s, "# FSDP2: fully_shard(layer) for each %s, then the model,\n"
           "#   mesh=%s, reshard_after_forward=True,\n"
           "#   mp_policy=MixedPrecisionPolicy(param_dtype=%s, "
           "reduce_dtype=torch.float32),\n"
           "#   offload_policy=%s\n",
        cls,
        p->sharding == VP_SHARD_HSDP2
            ? "2-D (replicate across nodes, shard over a node's GPUs)"
            : "1-D (every GPU)",
        dt,
        p->offload == VP_OFFLOAD_ALL ? "CPUOffloadPolicy()"
                                     : "OffloadPolicy()");
    json_t *cfg = json_pack("{s:i, s:[s], s:b, s:b}", "version", 2,
                            "transformer_layer_cls_to_wrap", cls,
                            "reshard_after_forward", 1,
                            "activation_checkpointing",
                            p->recompute == VP_RC_FULL);
    return put_fsdp_config(s, cfg, err);
}

static vp_status torchrun(sbuf *s, const vp_cluster_model_info *in,
                          const vp_cluster *c, const vp_par *p,
                          vp_error *err)
{
    uint32_t per_node = c->gpus < c->gpus_per_node ? c->gpus
                                                   : c->gpus_per_node;
    uint32_t nodes = (c->gpus + per_node - 1) / per_node;
    const char *cls = layer_class(in->name);
    const char *dt = p->dtype == VP_DT_BF16   ? "torch.bfloat16"
                     : p->dtype == VP_DT_FP16 ? "torch.float16"
                                              : "torch.float32";
    put(s, "#!/bin/sh\n");
    header(s, "#", in, c, p);
    if (p->sharding == VP_SHARD_DDP) {
        put(s, "# PyTorch DDP: DistributedDataParallel(model, "
               "bucket_cap_mb=25, gradient_as_bucket_view=True),\n"
               "# forward under torch.autocast(\"cuda\", dtype=%s)\n",
            dt);
    } else if (p->sharding == VP_SHARD_FSDP2 ||
               p->sharding == VP_SHARD_HSDP2) {
        vp_status st = fsdp2_header(s, p, cls, dt, err);
        if (st != VP_OK)
            return st;
    } else {
        const char *st = p->sharding == VP_SHARD_FSDP_FULL ? "FULL_SHARD"
                         : p->sharding == VP_SHARD_FSDP_GRAD_OP
                             ? "SHARD_GRAD_OP"
                             : "HYBRID_SHARD";
        put(s, "# FSDP: FullyShardedDataParallel(model,\n"
               "#   sharding_strategy=ShardingStrategy.%s,\n"
               "#   auto_wrap_policy=transformer_auto_wrap_policy({%s}),\n"
               "#   mixed_precision=MixedPrecision(param_dtype=%s, "
               "reduce_dtype=%s, buffer_dtype=%s),\n"
               "#   cpu_offload=CPUOffload(offload_params=%s),\n"
               "#   backward_prefetch=BackwardPrefetch.BACKWARD_PRE, "
               "limit_all_gathers=True, use_orig_params=True)\n",
            st, cls, dt, dt, dt,
            p->offload == VP_OFFLOAD_ALL ? "True" : "False");
        json_t *cfg = json_pack(
            "{s:[s], s:s, s:b, s:b, s:b, s:b, s:b}",
            "transformer_layer_cls_to_wrap", cls, "backward_prefetch",
            "backward_pre", "forward_prefetch", 0, "limit_all_gathers", 1,
            "use_orig_params", 1, "sync_module_states", 1,
            "activation_checkpointing", p->recompute == VP_RC_FULL);
        vp_status cs = put_fsdp_config(s, cfg, err);
        if (cs != VP_OK)
            return cs;
    }
    put(s, "torchrun --nnodes %u --nproc-per-node %u --rdzv-backend c10d "
           "\\\n    --rdzv-endpoint \"${MASTER_ADDR:-localhost}:29500\" "
           "\\\n  train.py \\\n",
        nodes, per_node);
    put(s, "    --per_device_train_batch_size %" PRIu64
           " --gradient_accumulation_steps %" PRIu64 " \\\n",
        p->micro_batch, p->accum);
    if (p->dtype == VP_DT_BF16)
        put(s, "    --bf16 \\\n");
    else if (p->dtype == VP_DT_FP16)
        put(s, "    --fp16 \\\n");
    if (p->compile)
        put(s, "    --torch_compile \\\n");
    if (p->sharding == VP_SHARD_DDP) {
        put(s, "    --ddp_bucket_cap_mb 25 \\\n");
        if (p->recompute == VP_RC_FULL)
            put(s, "    --gradient_checkpointing \\\n");
    } else {
        const char *st = p->sharding == VP_SHARD_FSDP_FULL ||
                                 p->sharding == VP_SHARD_FSDP2
                             ? "full_shard"
                         : p->sharding == VP_SHARD_FSDP_GRAD_OP
                             ? "shard_grad_op"
                             : "hybrid_shard";
        put(s, "    --fsdp \"%s auto_wrap%s\" --fsdp_config fsdp_config.json "
               "\\\n",
            st, p->offload == VP_OFFLOAD_ALL ? " offload" : "");
    }
    put(s, "    \"$@\"\n");
    return VP_OK;
}

vp_status vp_export_plan(const vp_cluster_model *cm, const vp_cluster *c,
                         const vp_par *p, vp_export_format f, char *buf,
                         size_t n, size_t *len, vp_error *err)
{
    vp_error_clear(err);
    sbuf s = {buf, n, 0};
    if (n)
        buf[0] = '\0';
    *len = 0;
    vp_engine want = vp_export_engine(f);
    vp_engine have = vp_sharding_engine(p->sharding);
    if (want != have)
        return unsupported(err,
                           "the plan uses %s (%s); %s runs %s plans only: "
                           "plan with --engine %s",
                           vp_sharding_name(p->sharding),
                           vp_engine_name(have), vp_export_format_name(f),
                           vp_engine_name(want), vp_engine_name(want));
    if (f == VP_EXPORT_MEGATRON && p->schedule == VP_SCHED_GPIPE &&
        p->pp > 1)
        return unsupported(err, "Megatron-LM has no GPipe schedule (it "
                                "runs 1F1B, which needs less memory)");
    if (f == VP_EXPORT_MEGATRON && p->schedule == VP_SCHED_DUALPIPE &&
        p->pp > 1)
        return unsupported(err, "Megatron-LM has no DualPipe schedule "
                                "(deepseek-ai/DualPipe runs it)");
    if (f == VP_EXPORT_DEEPSPEED && p->tp > 1 &&
        p->sharding == VP_SHARD_ZERO3)
        return unsupported(err, "DeepSpeed's AutoTP trains with ZeRO stages "
                                "0-2; ZeRO-3 with tensor parallelism runs "
                                "through Megatron-DeepSpeed "
                                "(--tensor-model-parallel-size %u)",
                           p->tp);
    if (f == VP_EXPORT_TORCHRUN && p->sharding == VP_SHARD_DDP_ZERO1)
        return unsupported(err, "the Trainer has no ZeroRedundancyOptimizer "
                                "(torch.distributed.optim); wrap the "
                                "script's AdamW in it, or plan ZeRO-1 with "
                                "--engine deepspeed");
    if (f == VP_EXPORT_TORCHRUN &&
        (p->tp > 1 || p->pp > 1 || p->cp > 1 || p->ep > 1))
        return unsupported(err, "the Trainer export runs data parallelism "
                                "only; FSDP with tp %u, pp %u, cp %u runs in "
                                "torchtitan (--parallelism.tensor_parallel_"
                                "degree, --parallelism.pipeline_parallel_"
                                "degree, --parallelism.context_parallel_"
                                "degree)",
                           p->tp, p->pp, p->cp);
    vp_cluster_model_info in;
    vp_cluster_model_info_get(cm, &in);
    if (f == VP_EXPORT_TORCHRUN && in.whole)
        return unsupported(err, "the torchrun export writes a Hugging Face "
                                "Trainer command for decoder-only "
                                "transformers; '%s' is planned whole (a "
                                "graph-form or encoder-decoder model; the "
                                "DeepSpeed export does not depend on the "
                                "model)",
                           in.name);
    vp_status st;
    switch (f) {
    case VP_EXPORT_DEEPSPEED:
        st = deepspeed(&s, &in, p, err);
        break;
    case VP_EXPORT_MEGATRON:
        st = megatron(&s, &in, c, p, err);
        break;
    case VP_EXPORT_TORCHRUN:
        st = torchrun(&s, &in, c, p, err);
        break;
    default:
        return vp_error_set(err, VP_EARG, "unknown export format");
    }
    *len = s.len;
    if (n && s.len >= n)
        buf[n - 1] = '\0';
    return st;
}
