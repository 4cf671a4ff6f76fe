{
  "variables": {
    "cuda_home%": "/usr/local/cuda",
    "kernels_obj%": "build/nerva_kernels.a"
  },
  "targets": [
    {
      "target_name": "nerva_cuda",
      "sources": ["native/addon.cc", "native/cublas_dl.cc", "native/nccl_dl.cc", "native/host_pool.cc", "native/host_mlp.cc", "native/host_attention.cc", "native/host_channel.cc"],
      "include_dirs": [
        "<!(node -p \"require('node-addon-api').include_dir\")",
        "<(cuda_home)/include"
      ],
      "defines": ["NAPI_VERSION=8", "NAPI_CPP_EXCEPTIONS"],
      "cflags_cc!": ["-fno-exceptions", "-fno-rtti"],
      "cflags_cc": ["-std=c++17", "-fexceptions", "-O2"],
      "libraries": [
        "<(module_root_dir)/<(kernels_obj)",
        "-L<(cuda_home)/lib64",
        "-lcudart_static",
        "-ldl",
        "-lrt",
        "-lpthread"
      ]
    }
  ]
}
