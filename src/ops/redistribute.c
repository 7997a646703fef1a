/* Op rules: a DTensor redistribution of the sequence dim (torch tensor
 * parallelism as torchtitan applies it, the transformer form's
 * vp_tf.dtensor; docs/DISTRIBUTED.md "FSDP2 + TP"). PyTorch 2.11,
 * torch/distributed/tensor/placement_types.py and
 * torch/distributed/_functional_collectives.py:
 *  - Shard(1) -> Replicate (Shard._to_replicate_tensor ->
 *    all_gather_tensor with gather_dim 1): the collective's output is the
 *    ranks' shards stacked on dim 0, then torch.cat(torch.chunk(res,
 *    group_size, dim=0), dim=1) makes the gathered tensor and the stacked
 *    one is freed;
 *  - Partial -> Shard(1) (Shard._reduce_shard_tensor ->
 *    reduce_scatter_tensor with scatter_dim 1): torch.cat(torch.chunk(x,
 *    group_size, dim=1)) lays the input out along dim 0 (a copy of the
 *    whole), the reduce-scatter writes a new shard, the copy is freed.
 * Either way the whole sequence's bytes live once more beside the op,
 * and the backward (Redistribute.backward: the opposite collective) does
 * the same in the other direction;
 *  - Shard(-1) -> Replicate of the head's logits (VP_OPF_GATHER_LAST,
 *    ColwiseParallel output_layouts Replicate()): the same all-gather
 *    with gather_dim -1 forward; backward Replicate -> Shard(-1) is
 *    Shard._replicate_to_shard, shards[rank].clone(): the chunk only. */
#include "../sim_internal.h"

/* The larger of the input's and the output's bytes: the collective's
 * contiguous staging tensor. */
static uint64_t staging(sim *S, uint32_t in0, uint64_t n, uint8_t eb)
{
    uint64_t m = S->g->ops[in0].numel;
    return vp__mulc(S, m > n ? m : n, eb);
}

void vp__redistribute_fwd(sim *S, vp__fwd_op *f)
{
    uint32_t t = vp__talloc(S, staging(S, f->in0, f->n, f->eb0), VP_CAT_TEMP);
    f->out = vp__talloc(S, vp__mulc(S, f->n, f->eb0), VP_CAT_ACT);
    vp__tunref(S, t);
}

void vp__redistribute_bwd(sim *S, vp__bwd_op *b)
{
    if (!b->ig0)
        return;
    /* Replicate -> Shard(-1) (VP_OPF_GATHER_LAST's backward):
     * Shard._replicate_to_shard clones the rank's chunk, no collective */
    if (b->o->flags & VP_OPF_GATHER_LAST) {
        b->gx = vp__grad_like(S, b->in0, b->eb0);
        return;
    }
    uint32_t t = vp__talloc(S, staging(S, b->in0, b->n, b->eb0), VP_CAT_TEMP);
    b->gx = vp__grad_like(S, b->in0, b->eb0);
    vp__tunref(S, t);
}
