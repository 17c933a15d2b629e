// NCCL, opened with dlopen the first time a GPU collective needs it.
//
// As for the CUDA runtime (gpu/cuda_runtime.h), no NCCL header is used: the handful of
// types and functions hvdlite calls are declared here and looked up by name.
// `HVDLITE_NCCL_LIBRARY` names the file; otherwise the `nvidia-nccl-cu12`/`-cu13`
// wheels' folders, the copy PyTorch bundles, then the system's (gpu/library_loader.h).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace hvdlite {

class SharedLibrary;

namespace nccl {

using Result = int;  // ncclResult_t
using Comm = void*;  // ncclComm_t
using Stream = void*;
using RedOp = int;   // ncclRedOp_t
using DataType = int;  // ncclDataType_t
struct UniqueId {
  char internal[128];
};

constexpr Result kSuccess = 0;
constexpr Result kInProgress = 7;
enum : RedOp { kSum = 0, kProd = 1, kMax = 2, kMin = 3, kAvg = 4 };
enum : DataType {
  kInt8 = 0, kUint8 = 1, kInt32 = 2, kUint32 = 3, kInt64 = 4, kUint64 = 5,
  kFloat16 = 6, kFloat32 = 7, kFloat64 = 8, kBfloat16 = 9,
};
constexpr int kScalarHostImmediate = 1;

// Version 1 of the table. Everything hvdlite needs exists since NCCL 2.11
// (ncclAvg, ncclRedOpCreatePreMulSum); ncclGetLastError (2.13) is optional.
struct Api {
  Result (*GetVersion)(int*);
  Result (*GetUniqueId)(UniqueId*);
  Result (*CommInitRank)(Comm*, int, UniqueId, int);
  Result (*CommDestroy)(Comm);
  Result (*CommAbort)(Comm);
  Result (*CommGetAsyncError)(Comm, Result*);
  const char* (*GetErrorString)(Result);
  const char* (*GetLastError)(Comm);  // optional
  Result (*AllReduce)(const void*, void*, size_t, DataType, RedOp, Comm, Stream);
  Result (*Broadcast)(const void*, void*, size_t, DataType, int, Comm, Stream);
  Result (*ReduceScatter)(const void*, void*, size_t, DataType, RedOp, Comm, Stream);
  Result (*AllGather)(const void*, void*, size_t, DataType, Comm, Stream);
  Result (*Send)(const void*, size_t, DataType, int, Comm, Stream);
  Result (*Recv)(void*, size_t, DataType, int, Comm, Stream);
  Result (*GroupStart)();
  Result (*GroupEnd)();
  Result (*RedOpCreatePreMulSum)(RedOp*, void*, DataType, int, Comm);
  Result (*RedOpDestroy)(RedOp, Comm);
};

class Library {
 public:
  // The process's NCCL, opened on first use; null with the reason (everything
  // searched) if it cannot be. Thread-safe; never throws.
  static Library* TryGet(std::string* error);

  const Api& api() const { return api_; }
  const std::string& path() const;
  int version() const { return version_; }  // e.g. 22303 for 2.23.3
  std::string VersionString() const;
  // "ncclInvalidUsage: invalid usage (5)" plus NCCL's last error text when there is one.
  std::string ErrorString(Result r, Comm comm = nullptr) const;

 private:
  Library() = default;
  std::shared_ptr<SharedLibrary> lib_;
  Api api_{};
  int version_ = 0;
};

}  // namespace nccl
}  // namespace hvdlite
