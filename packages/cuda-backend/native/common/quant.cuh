// ggml's block-quantized weights on the device: one element's value (any access pattern: the
// embedding gather, the generic GEMV) and the block layouts the quantized GEMV streams. A value is
// computed as @nerva/core's dequantize computes it (float32, products rounded one at a time), so
// every kernel reads the weights the CPU reference holds.
#pragma once
#include <cuda_fp16.h>
#include <stdint.h>

#include "nerva.h"

namespace nerva {

__device__ __forceinline__ float h2f(const uint8_t* p) {
  return __half2float(__ushort_as_half((uint16_t)(p[0] | (p[1] << 8))));
}

// Q4_K's 6-bit scale and min of sub-block j (0..7) from the block's 12 packed bytes.
__device__ __forceinline__ void q4kScaleMin(const uint8_t* s, int j, int& sc, int& m) {
  if (j < 4) {
    sc = s[j] & 63;
    m = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Element i of a row-major quantized tensor whose rows are whole blocks.
__device__ __forceinline__ float qElem(const void* base, int dt, size_t i) {
  const uint8_t* p = (const uint8_t*)base;
  switch (dt) {
    case NV_Q8_0: {
      const uint8_t* b = p + (i / 32) * 34;
      return __fmul_rn(h2f(b), (float)(int8_t)b[2 + i % 32]);
    }
    case NV_Q4_0: {
      const uint8_t* b = p + (i / 32) * 18;
      const int k = (int)(i % 32);
      const int q = k < 16 ? (b[2 + k] & 0xF) : (b[2 + k - 16] >> 4);
      return __fmul_rn((float)(q - 8), h2f(b));
    }
    case NV_Q4_K: {
      const uint8_t* b = p + (i / 256) * 144;
      const int k = (int)(i % 256), g = k / 64, w = k % 64;
      int sc, m;
      q4kScaleMin(b + 4, 2 * g + (w >= 32), sc, m);
      const uint8_t q = b[16 + 32 * g + w % 32];
      const int nib = w < 32 ? (q & 0xF) : (q >> 4);
      return __fsub_rn(__fmul_rn(__fmul_rn(h2f(b), (float)sc), (float)nib), __fmul_rn(h2f(b + 2), (float)m));
    }
    default: {  // NV_Q6_K
      const uint8_t* b = p + (i / 256) * 210;
      const int k = (int)(i % 256), n = k / 128, r = k % 128, quad = r / 32, l = r % 32;
      const uint8_t ql = b[n * 64 + l + (quad & 1) * 32];
      const int lo = quad < 2 ? (ql & 0xF) : (ql >> 4);
      const int hi = (b[128 + n * 32 + l] >> (2 * quad)) & 3;
      const int q = (lo | (hi << 4)) - 32;
      const float sc = (float)(int8_t)b[192 + n * 8 + l / 16 + 2 * quad];
      return __fmul_rn(__fmul_rn(h2f(b + 208), sc), (float)q);
    }
  }
}

// Elements [i0, i0 + 8) of a row-major quantized tensor (i0 a multiple of 8: the eight share one
// block and one scale), as qElem computes each.
__device__ __forceinline__ void qElem8(const void* base, int dt, size_t i0, float (&v)[8]) {
  const uint8_t* p = (const uint8_t*)base;
  switch (dt) {
    case NV_Q8_0: {
      const uint8_t* b = p + (i0 / 32) * 34;
      const float d = h2f(b);
      const int k = (int)(i0 % 32);
#pragma unroll
      for (int j = 0; j < 8; j++) v[j] = __fmul_rn(d, (float)(int8_t)b[2 + k + j]);
      return;
    }
    case NV_Q4_0: {
      const uint8_t* b = p + (i0 / 32) * 18;
      const float d = h2f(b);
      const int k = (int)(i0 % 32);
#pragma unroll
      for (int j = 0; j < 8; j++) {
        const int q = k < 16 ? (b[2 + k + j] & 0xF) : (b[2 + k + j - 16] >> 4);
        v[j] = __fmul_rn((float)(q - 8), d);
      }
      return;
    }
    case NV_Q4_K: {
      const uint8_t* b = p + (i0 / 256) * 144;
      const int k = (int)(i0 % 256), g = k / 64, w = k % 64;
      int sc, m;
      q4kScaleMin(b + 4, 2 * g + (w >= 32), sc, m);
      const float ds = __fmul_rn(h2f(b), (float)sc), dm = __fmul_rn(h2f(b + 2), (float)m);
      const uint8_t* q = b + 16 + 32 * g + w % 32;
#pragma unroll
      for (int j = 0; j < 8; j++) v[j] = __fsub_rn(__fmul_rn(ds, (float)(w < 32 ? (q[j] & 0xF) : (q[j] >> 4))), dm);
      return;
    }
    default: {  // NV_Q6_K
      const uint8_t* b = p + (i0 / 256) * 210;
      const int k = (int)(i0 % 256), n = k / 128, r = k % 128, quad = r / 32, l = r % 32;
      const float ds = __fmul_rn(h2f(b + 208), (float)(int8_t)b[192 + n * 8 + l / 16 + 2 * quad]);
#pragma unroll
      for (int j = 0; j < 8; j++) {
        const uint8_t ql = b[n * 64 + l + j + (quad & 1) * 32];
        const int lo = quad < 2 ? (ql & 0xF) : (ql >> 4);
        const int hi = (b[128 + n * 32 + l + j] >> (2 * quad)) & 3;
        v[j] = __fmul_rn(ds, (float)((lo | (hi << 4)) - 32));
      }
      return;
    }
  }
}

}  // namespace nerva
