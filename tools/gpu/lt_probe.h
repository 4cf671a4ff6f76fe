// What the cuBLASLt probes (lt_candidates.cc, lt_prefill.cu) share: a checked call that ends the
// probe naming the call, and an algorithm's configuration attribute (-1 where unreadable).
#pragma once
#include <cublasLt.h>

#include <cstdio>
#include <cstdlib>

#define CK(x)                                                                     \
  do {                                                                            \
    auto e_ = (x);                                                                \
    if ((int)e_ != 0) {                                                           \
      fprintf(stderr, "%s:%d %s failed (%d)\n", __FILE__, __LINE__, #x, (int)e_); \
      exit(1);                                                                    \
    }                                                                             \
  } while (0)

static inline int cfg(const cublasLtMatmulAlgo_t& a, cublasLtMatmulAlgoConfigAttributes_t at) {
  int v = -1;
  size_t wr = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&a, at, &v, sizeof v, &wr) != CUBLAS_STATUS_SUCCESS) return -1;
  return v;
}
