// cuBLAS is loaded at run time: the addon then builds without cuBLAS headers or libraries and
// still runs (with the GEMV fallback for many-row matmuls) where cuBLAS is absent.
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "nerva.h"

bool nerva_load_cublas(CublasApi* api, char* why, size_t whyLen) {
  const char* names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so"};
  void* lib = nullptr;
  const char* picked = nullptr;
  for (const char* n : names) {
    lib = dlopen(n, RTLD_NOW | RTLD_LOCAL);
    if (lib) {
      picked = n;
      break;
    }
  }
  if (!lib) {
    snprintf(why, whyLen, "libcublas not found (%s)", dlerror());
    return false;
  }
  api->create = (cublasCreate_t)dlsym(lib, "cublasCreate_v2");
  api->destroy = (cublasDestroy_t)dlsym(lib, "cublasDestroy_v2");
  api->setStream = (cublasSetStream_t)dlsym(lib, "cublasSetStream_v2");
  api->setWorkspace = (cublasSetWorkspace_t)dlsym(lib, "cublasSetWorkspace_v2");
  api->gemmEx = (cublasGemmEx_t)dlsym(lib, "cublasGemmEx");
  if (!api->create || !api->destroy || !api->setStream || !api->setWorkspace || !api->gemmEx) {
    snprintf(why, whyLen, "%s lacks a needed symbol", picked);
    dlclose(lib);
    *api = CublasApi();
    return false;
  }
  api->lib = lib;
  snprintf(api->libName, sizeof api->libName, "%s", picked);
  return true;
}
