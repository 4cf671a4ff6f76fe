{
  "variables": {
    "cuda_home%": "/usr/local/cuda",
    "kernels_obj%": "build/nerva_kernels.a"
  },
  "targets": [
    {
      "target_name": "nerva_cuda",
      "sources": [
        "native/addon/module.cc", "native/addon/context.cc", "native/addon/memory.cc", "native/addon/streams.cc",
        "native/addon/host_compute.cc", "native/addon/cublas_dl.cc", "native/addon/nccl_dl.cc",
        "native/host/isa.cc", "native/host/host_pool.cc", "native/host/host_mlp.cc", "native/host/host_attention.cc",
        "native/host/host_channel.cc", "native/common/knobs.cc"
      ],
      "include_dirs": [
        "<!(node -p \"require('node-addon-api').include_dir\")",
        "<(cuda_home)/include",
        "native", "native/common", "native/host", "native/addon"
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
