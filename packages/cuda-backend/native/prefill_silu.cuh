// Op silu_mul over many rows (prefill chunks; included by kernels.cu inside its anonymous
// namespace, after k_silu_mul and the LAUNCH machinery). k_silu_mul indexes the flat output
// with 64-bit division and modulo per element; here a block row takes four elements a thread of
// one row (blockIdx.y), with vector loads and stores. The formula is k_silu_mul's (the same bits).
__global__ void __launch_bounds__(256) k_silu_mul_rows(const float* x, float* out, int rowBase, int dim, int bfa) {
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
  *reinterpret_cast<float4*>(out + (size_t)r * dim + i) = o;
}

// More than a decode batch, rows of whole float4s (the buffers are 16-byte aligned: arena slices).
bool siluMulRowsFits(int rows, int dim) { return rows > 8 && dim % 4 == 0; }

int siluMulRowsRun(NervaExec* ex, const float* x, float* out, int rows, int dim) {
  const unsigned gx = (unsigned)((dim / 4 + 255) / 256);
  for (int r0 = 0; r0 < rows; r0 += 65535) {
    const int nr = std::min(65535, rows - r0);
    LAUNCH(k_silu_mul_rows, dim3(gx, (unsigned)nr), 256, 0, x, out, r0, dim, ex->bf16act ? 1 : 0);
  }
  return NERVA_OK;
}
