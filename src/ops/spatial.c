/* Op rules of the graph form's spatial ops that a U-Net needs beyond
 * convolutions and pooling: upsampling (F.interpolate, nearest and
 * bilinear; upsample_nearest2d and upsample_bilinear2d, which autocast
 * leaves in their input's dtype). Transposed convolutions share the
 * convolution's rules (ops/linear.c). PyTorch aten/src/ATen/native/cuda/
 * UpSampleNearest2d.cu and UpSampleBilinear2d.cu: the forward makes the
 * output, the backward the input-sized gradient; neither saves a tensor
 * (tools/autograd/derivatives.yaml: only the sizes). */
#include "../sim_internal.h"

void vp__upsample_fwd(sim *S, vp__fwd_op *f)
{
    f->ol = 0;
    f->out = vp__talloc(S, vp__mulc(S, f->n, f->eb0), VP_CAT_ACT);
}
