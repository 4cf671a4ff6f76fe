// Op rope_append over many rows (prefill chunks; included by kernels.cu inside its anonymous
// namespace, after k_rope_append and the LAUNCH machinery).
//
// k_rope_append takes one block per (row, head): at 4096 rows and 40 heads that is 164k blocks
// of 64 threads, each taking the row's cos/sin in float64 again, and the launch is latency-bound.
// Here one block of four warps takes a whole row: the cos/sin of the row's angles are taken once
// per warp, and each warp runs over every fourth head (q heads, then k heads, whose keys and
// values go to the cache). The arithmetic is k_rope_append's, step for step, so the results are
// the same bits: the QK-norm sum is the warp butterfly of blockSum for each 32 lanes of the half
// head, added in blockSum's order; the scale, the angle, cos/sin and the rotation are the same
// expressions.

// rotateHalf with the angle's cos and sin already taken.
__device__ __forceinline__ void rotateHalfSC(float a, float b, double s, double c, int bfa, float& ra, float& rb) {
  if (bfa) {
    float cf = rbf((float)c), sf = rbf((float)s);
    ra = rbf(rbf(__fmul_rn(a, cf)) - rbf(__fmul_rn(b, sf)));
    rb = rbf(rbf(__fmul_rn(b, cf)) + rbf(__fmul_rn(a, sf)));
  } else {
    ra = (float)((double)a * c - (double)b * s);
    rb = (float)((double)b * c + (double)a * s);
  }
}

// E elements per lane in each half of a head: headDim = 64 E.
template <int E>
__global__ void __launch_bounds__(128) k_rope_append_rows(float* x, const int* positions, const float* invFreq,
                                                          const void* qn, const void* kn, int ndt, int nq, int rowStride,
                                                          float eps, const int* slots, void* kc, void* vc, int cdt,
                                                          int nkv, int bfa) {
  PDL_ENTER();
  constexpr int HALF = 32 * E, HD = 2 * HALF;
  const int r = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const float posf = (float)positions[r];
  double sn[E], cs[E];
#pragma unroll
  for (int j = 0; j < E; j++) sincos((double)__fmul_rn(posf, invFreq[lane + 32 * j]), &sn[j], &cs[j]);
  const int slot = slots[r];
  float* row = x + (size_t)r * rowStride;
  const size_t width = (size_t)nkv * HD;
  for (int h = warp; h < nq + nkv; h += 4) {
    const bool isK = h >= nq;
    const void* nw = isK ? kn : qn;
    float* base = row + (size_t)h * HD;  // k heads follow the q heads
    float a[E], b[E];
#pragma unroll
    for (int j = 0; j < E; j++) {
      a[j] = base[lane + 32 * j];
      b[j] = base[lane + 32 * j + HALF];
    }
    if (nw) {
      // blockSum over HALF threads: each warp's butterfly (lane 0's sum), then 0 + w0 + w1 + ...
      float t = 0.f;
#pragma unroll
      for (int j = 0; j < E; j++) {
        float v = a[j] * a[j] + b[j] * b[j];
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        t += __shfl_sync(0xffffffffu, v, 0);
      }
      const float inv = rsqrtf(t / (float)HD + eps);
#pragma unroll
      for (int j = 0; j < E; j++) {
        const int i = lane + 32 * j;
        a[j] = bfr(bfr(a[j] * inv, bfa) * ldf(nw, ndt, i), bfa);
        b[j] = bfr(bfr(b[j] * inv, bfa) * ldf(nw, ndt, i + HALF), bfa);
      }
    }
#pragma unroll
    for (int j = 0; j < E; j++) {
      const int i = lane + 32 * j;
      float ra, rb;
      rotateHalfSC(a[j], b[j], sn[j], cs[j], bfa, ra, rb);
      base[i] = ra;
      base[i + HALF] = rb;
      if (isK && slot >= 0) {
        const size_t c0 = (size_t)slot * width + (size_t)(h - nq) * HD;
        stf(kc, cdt, c0 + i, ra);
        stf(kc, cdt, c0 + i + HALF, rb);
        const float* v = base + (size_t)nkv * HD;  // value head kh sits nkv heads after key head kh
        stf(vc, cdt, c0 + i, v[i]);
        stf(vc, cdt, c0 + i + HALF, v[i + HALF]);
      }
    }
  }
}

// Whether op rope_append's rows take k_rope_append_rows: more than a decode batch (8 rows), and
// head sizes of 64, 128 or 256. NERVA_PREFILL_ROPE=0 keeps k_rope_append (A/B runs).
bool ropeAppendRowsFits(int rows, int hd) {
  static const bool on = [] {
    const char* v = getenv("NERVA_PREFILL_ROPE");
    return !(v && v[0] == '0');
  }();
  return on && rows > 8 && (hd == 64 || hd == 128 || hd == 256);
}

int ropeAppendRowsRun(NervaExec* ex, float* qkv, Buf pos, Buf inv, Buf slots, Buf kc, Buf vc, Buf qn, Buf kn, int rows,
                      int nq, int nkv, int hd, int rowStride, float eps) {
  if (kc.dt != vc.dt) return bad(ex, "rope_append: kCache and vCache dtypes differ");
  if (qn.p && kn.p && qn.dt != kn.dt) return bad(ex, "rope_append: qNorm and kNorm dtypes differ");
  const int ndt = qn.p ? qn.dt : kn.dt;
#define RAR(E)                                                                                                          \
  LAUNCH(k_rope_append_rows<E>, rows, 128, 0, qkv, (const int*)pos.p, (const float*)inv.p, qn.p, kn.p, ndt, nq, rowStride, \
         eps, (const int*)slots.p, kc.p, vc.p, kc.dt, nkv, ex->bf16act ? 1 : 0)
  switch (hd) {
    case 64: RAR(1); break;
    case 128: RAR(2); break;
    default: RAR(4); break;
  }
#undef RAR
  return NERVA_OK;
}
