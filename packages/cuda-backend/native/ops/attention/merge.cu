// Op attention_merge: partial attentions over disjoint keys combined in place.
#include "common/elem.cuh"
#include "common/exec.cuh"
#include "ops/ops.h"

namespace nerva::ops {

// Partial attentions over disjoint key sets combined in place (op attention_merge): the
// online-softmax rule on (out, lse) and (other, otherLse). One block per (head, row).
__global__ void k_attn_merge(float* out, float* lse, const float* other, const float* otherLse, int H, int hd) {
  PDL_ENTER();
  int h = blockIdx.x, r = blockIdx.y;
  size_t li = (size_t)r * H + h;
  float la = lse[li], lb = otherLse[li];
  float M = fmaxf(la, lb);
  float wa = M == -INFINITY ? 0.f : expf(la - M), wb = M == -INFINITY ? 0.f : expf(lb - M);
  float den = wa + wb;
  float* o = out + li * hd;
  const float* b = other + li * hd;
  for (int t = threadIdx.x; t < hd; t += blockDim.x) o[t] = den > 0.f ? (o[t] * wa + b[t] * wb) / den : 0.f;
  __syncthreads();  // every thread has read lse[li] before it changes
  if (threadIdx.x == 0) lse[li] = den > 0.f ? M + logf(den) : -INFINITY;
}


int opAttentionMerge(NervaExec* ex, Args& A) {
  Buf out = buf(A), lse = buf(A), other = buf(A), otherLse = buf(A);
  int rows = A.num(), H = A.num(), hd = A.num();
  if (!A.ok) return bad(ex, "attention_merge: argument count");
  if (rows <= 0 || H <= 0 || hd <= 0) return NERVA_OK;
  for (int r0 = 0; r0 < rows; r0 += 65535) {
    int nr = std::min(65535, rows - r0);
    size_t o = (size_t)r0 * H;
    LAUNCH(k_attn_merge, dim3(H, nr), ((std::min(hd, 256) + 31) / 32) * 32, 0, (float*)out.p + o * hd, (float*)lse.p + o,
           (const float*)other.p + o * hd, (const float*)otherLse.p + o, H, hd);
  }
  return NERVA_OK;
}

}  // namespace nerva::ops
