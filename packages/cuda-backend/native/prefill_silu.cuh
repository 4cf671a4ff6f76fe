// Op silu_mul over many rows (prefill chunks; included by kernels.cu inside its anonymous
// namespace, after k_silu_mul and the LAUNCH machinery). k_silu_mul indexes the flat output
// with 64-bit division and modulo per element; here a block row takes four elements a thread of
// one row (blockIdx.y), with vector loads and stores. The formula is k_silu_mul's (the same bits).
// A bf16 `out` (capabilities.bf16Activations) gets the same values rounded to bf16 (nearest even).
__device__ __forceinline__ void siluStore4(float* p, float4 o) { *reinterpret_cast<float4*>(p) = o; }
__device__ __forceinline__ void siluStore4(uint16_t* p, float4 o) {
  *reinterpret_cast<uint2*>(p) = make_uint2((uint32_t)f2bf(o.x) | ((uint32_t)f2bf(o.y) << 16), (uint32_t)f2bf(o.z) | ((uint32_t)f2bf(o.w) << 16));
}

template <typename OT>
__global__ void __launch_bounds__(256) k_silu_mul_rows(const float* x, OT* out, int rowBase, int dim, int bfa) {
  PDL_ENTER();
  const int r = rowBase + blockIdx.y;
  const int i = (blockIdx.x * 256 + threadIdx.x) * 4;
  if (i >= dim) return;
  const float* xr = x + (size_t)r * 2 * dim;
  const float4 g4 = *reinterpret_cast<const float4*>(xr + i), u4 = *reinterpret_cast<const float4*>(xr + dim + i);
  float4 o;
  o.x = bfr(bfr(g4.x / (1.f + expf(-g4.x)), bfa) * u4.x, bfa);
  o.y = bfr(bfr(g4.y / (1.f + expf(-g4.y)), bfa) * u4.y, bfa);
  o.z = bfr(bfr(g4.z / (1.f + expf(-g4.z)), bfa) * u4.z, bfa);
  o.w = bfr(bfr(g4.w / (1.f + expf(-g4.w)), bfa) * u4.w, bfa);
  siluStore4(out + (size_t)r * dim + i, o);
}

// Any shape, bf16 out: k_silu_mul's loop with the store rounded.
__global__ void k_silu_mul_bf16(const float* x, uint16_t* out, int rows, int dim, int bfa) {
  PDL_ENTER();
  size_t n = (size_t)rows * dim;
  for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < n; t += (size_t)gridDim.x * blockDim.x) {
    size_t r = t / dim, i = t % dim;
    float g = x[r * 2 * dim + i], u = x[r * 2 * dim + dim + i];
    out[t] = f2bf(bfr(bfr(g / (1.f + expf(-g)), bfa) * u, bfa));
  }
}

// More than a decode batch, rows of whole float4s (the buffers are 16-byte aligned: arena slices).
bool siluMulRowsFits(int rows, int dim) { return rows > 8 && dim % 4 == 0; }

template <typename OT>
int siluMulRowsRun(NervaExec* ex, const float* x, OT* out, int rows, int dim) {
  const unsigned gx = (unsigned)((dim / 4 + 255) / 256);
  for (int r0 = 0; r0 < rows; r0 += 65535) {
    const int nr = std::min(65535, rows - r0);
    LAUNCH(k_silu_mul_rows<OT>, dim3(gx, (unsigned)nr), 256, 0, x, out, r0, dim, ex->bf16act ? 1 : 0);
  }
  return NERVA_OK;
}

// Op matmul with a bf16 x over more than 8 rows: the GEMM on x as it is (no rounding pass: its
// values are bf16 already, so under 'split-bf16' the lo half would be zero), then op matmul's
// epilogue (bias, bf16 numerics).
int gemmCublasBf16x(NervaExec* ex, const uint16_t* x, Buf w, float* out, int rows, int inDim, int outDim, Buf bias) {
  const CublasApi* api = ex->api;
  if (api->setStream(ex->cublas, ex->stream) != 0) {
    snprintf(ex->errCall, sizeof ex->errCall, "cublasSetStream");
    return NERVA_CUBLAS_FAILED;
  }
  float one = 1.f, zero = 0.f;
  int st = api->gemmEx(ex->cublas, CUBLAS_OP_T, CUBLAS_OP_N, outDim, rows, inDim, &one, w.p, CUDA_R_16BF_, inDim, x, CUDA_R_16BF_,
                       inDim, &zero, out, CUDA_R_32F_, outDim, CUBLAS_COMPUTE_32F_, CUBLAS_GEMM_DEFAULT_);
  if (!ex->capturing) ex->launches++;
  if (st != 0) {
    snprintf(ex->errCall, sizeof ex->errCall, "cublasGemmEx (status %d)", st);
    return NERVA_CUBLAS_FAILED;
  }
  if (bias.p || ex->bf16act)
    LAUNCH(k_bias_add, gridFor((size_t)rows * outDim, 256, ex->smCount), 256, 0, out, bias.p, bias.dt, rows, outDim, ex->bf16act ? 1 : 0);
  return NERVA_OK;
}
