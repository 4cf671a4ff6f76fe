// NCCL, loaded at run time (nccl_dl.cc) like cuBLAS: the addon builds with no NCCL headers or
// libraries and runs unchanged where NCCL is absent. This header is the one place holding the
// slice of nccl.h's ABI we rely on (NCCL 2.x; unchanged since 2.0 except where noted); src/nccl.ts
// reads the data type codes from the addon (ncclDataTypes) instead of repeating them. Checked
// against NVIDIA/nccl src/nccl.h.in.
#pragma once
#include <cuda_runtime.h>
#include <napi.h>
#include <stddef.h>

namespace nerva_nccl {

// NCCL_UNIQUE_ID_BYTES; ncclUniqueId is passed by value to ncclCommInitRank, so the struct must
// be exactly this: typedef struct { char internal[128]; } ncclUniqueId;
constexpr int kUniqueIdBytes = 128;
struct UniqueId {
  char internal[kUniqueIdBytes];
};
static_assert(sizeof(UniqueId) == 128, "ncclUniqueId is 128 bytes");

// ncclComm_t: a pointer to an opaque struct ncclComm.
typedef struct ncclComm* Comm;

// ncclResult_t.
enum Result : int {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,  // 2.13+
  ncclInProgress = 7,   // 2.14+ (non-blocking communicators)
  ncclTimeout = 8,      // recent releases
};

// ncclDataType_t (ncclBfloat16 is 9 in every CUDA 11+ build of the library; the fp8 types that
// follow it are not used here).
enum DataType : int {
  ncclInt8 = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclFloat32 = 7,
  ncclFloat64 = 8,
  ncclBfloat16 = 9,
  kDataTypeCount = 10,
};

// Entry points of the library; names as exported by libnccl.so.2.
typedef Result (*GetVersion_t)(int* version);
typedef Result (*GetUniqueId_t)(UniqueId* id);
typedef Result (*CommInitRank_t)(Comm* comm, int nranks, UniqueId id, int rank);
typedef Result (*CommInitAll_t)(Comm* comms, int ndev, const int* devlist);
typedef Result (*CommDestroy_t)(Comm comm);
typedef Result (*CommAbort_t)(Comm comm);
typedef Result (*CommCount_t)(const Comm comm, int* count);
typedef Result (*CommUserRank_t)(const Comm comm, int* rank);
typedef Result (*CommCuDevice_t)(const Comm comm, int* device);
typedef Result (*CommGetAsyncError_t)(Comm comm, Result* asyncError);
typedef Result (*Send_t)(const void* buf, size_t count, DataType type, int peer, Comm comm, cudaStream_t stream);
typedef Result (*Recv_t)(void* buf, size_t count, DataType type, int peer, Comm comm, cudaStream_t stream);
typedef Result (*GroupStart_t)();
typedef Result (*GroupEnd_t)();
typedef const char* (*GetErrorString_t)(Result result);
typedef const char* (*GetLastError_t)(Comm comm);  // 2.13+

struct Api {
  void* lib = nullptr;
  GetVersion_t getVersion = nullptr;
  GetUniqueId_t getUniqueId = nullptr;
  CommInitRank_t commInitRank = nullptr;
  CommDestroy_t commDestroy = nullptr;
  CommAbort_t commAbort = nullptr;
  CommCount_t commCount = nullptr;
  CommUserRank_t commUserRank = nullptr;
  Send_t send = nullptr;
  Recv_t recv = nullptr;
  GroupStart_t groupStart = nullptr;
  GroupEnd_t groupEnd = nullptr;
  GetErrorString_t getErrorString = nullptr;
  // Optional: absent from some builds or older releases.
  CommInitAll_t commInitAll = nullptr;
  CommCuDevice_t commCuDevice = nullptr;
  CommGetAsyncError_t commGetAsyncError = nullptr;
  GetLastError_t getLastError = nullptr;
  int version = 0;  // ncclGetVersion's code: 2.28.3 -> 22803
};

// Module-level functions (no device or stream needed): ncclLoad, ncclUniqueId, ncclGroupStart,
// ncclGroupEnd, ncclCommInitAll, ncclCommInfo, ncclCommDestroy, ncclCommAbort, and the
// ncclDataTypes table. Called once from the addon's module init.
void Register(Napi::Env env, Napi::Object exports);

// Bodies of the Context methods, which pass what only the Context knows: its device and the
// stream its own stream table resolved.
//   ncclCommInit(nranks, rank, uniqueId: Uint8Array(128)) -> comm id (rank on `device`)
Napi::Value CommInit(const Napi::CallbackInfo& info, int device);
//   ncclSend / ncclRecv(comm, addr, count, dtypeCode, peer, stream)
Napi::Value SendRecv(const Napi::CallbackInfo& info, bool send, int device, cudaStream_t stream);

}  // namespace nerva_nccl
