/* Op rule: the cross entropy of a rank's vocab/tp logits (Shard(-1))
 * under torch.distributed.tensor.parallel.loss_parallel() (PyTorch 2.11,
 * torch/distributed/tensor/parallel/loss.py; VP_OPF_LOSS_PARALLEL, the
 * head of vp_tf.dtensor's graph; docs/DISTRIBUTED.md "FSDP2 + TP"). HF's
 * ForCausalLMLoss upcasts the logits and shifts the labels as on one GPU
 * (ops/embed_loss.c); the DTensor dispatcher then runs loss.py's custom
 * handlers on the local logits:
 *  - _log_softmax (aten._log_softmax): x.to(fp32) (no copy of fp32
 *    logits), the row max all-reduced, shifted = x - x_max,
 *    torch.exp(shifted) summed and freed, result = shifted - logsumexp,
 *    shifted freed on return: three logits-sized tensors at its peak
 *    where the fused kernel makes one; result is saved for the backward;
 *  - _nll_loss_forward: row-sized gathers and masks only;
 *  - _nll_loss_and_log_softmax_backward (the log_softmax backward's
 *    handler does no work): grad_input = torch.zeros_like(x), its
 *    targets set in place, then (grad_input + torch.exp(x)) * grad_output:
 *    exp, the sum and the product logits-sized, exp freed after the sum,
 *    the sum after the product, grad_input on return, the saved result
 *    when the autograd node is done with it.
 * The trace of llama-1b dp2tp2 b2 (groundtruth/traces/) shows this order
 * byte for byte (262,144,000 B = 2 x 2048 x 16000 x 4 each). */
#include "../sim_internal.h"

uint32_t vp__loss_parallel_logp(sim *S, uint64_t rc, uint8_t eb)
{
    uint64_t n = vp__mulc(S, rc, eb);
    uint32_t shifted = vp__talloc(S, n, VP_CAT_TEMP);
    uint32_t ex = vp__talloc(S, n, VP_CAT_TEMP);
    vp__tunref(S, ex);
    uint32_t lp = vp__talloc(S, n, VP_CAT_ACT);
    vp__tunref(S, shifted);
    return lp;
}

uint32_t vp__loss_parallel_grad(sim *S, uint32_t op, uint64_t rc, uint8_t eb)
{
    uint64_t n = vp__mulc(S, rc, eb);
    uint32_t gi = vp__talloc(S, n, VP_CAT_TEMP);
    uint32_t ex = vp__talloc(S, n, VP_CAT_TEMP);
    uint32_t sum = vp__talloc(S, n, VP_CAT_TEMP);
    vp__tunref(S, ex);
    uint32_t g = vp__talloc(S, n, VP_CAT_TEMP);
    vp__tunref(S, sum);
    vp__tunref(S, gi);
    vp__release_saved(S, op);
    return g;
}
