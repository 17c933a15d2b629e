// DLPack, the common language of NumPy, PyTorch, TensorFlow, CuPy and JAX for handing
// over memory without a copy: hvdlite's GPU results leave the engine as DLPack
// capsules. The structs below are DLPack's C ABI (the unversioned DLManagedTensor that
// every consumer accepts), declared here so that no header of theirs is needed.
#pragma once

#include <Python.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "common/common.h"
#include "common/handle_table.h"

namespace hvdlite {
namespace dlpack {

enum DeviceType : int32_t { kCPU = 1, kCUDA = 2 };
enum TypeCode : uint8_t { kInt = 0, kUInt = 1, kFloat = 2, kBfloat = 4 };

struct Device {
  int32_t device_type;
  int32_t device_id;
};
struct DataTypeDesc {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct Tensor {
  void* data;
  Device device;
  int32_t ndim;
  DataTypeDesc dtype;
  int64_t* shape;
  int64_t* strides;  // null: C-contiguous
  uint64_t byte_offset;
};
struct ManagedTensor {
  Tensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(ManagedTensor*);
};

DataTypeDesc TypeOf(DataType dt);

}  // namespace dlpack

// A new "dltensor" capsule viewing `memory` as a C-contiguous tensor of `shape` and
// `dtype`; the memory stays alive until the consumer (or the capsule, unconsumed) lets
// go of it.
PyObject* ToDlpack(std::shared_ptr<DeviceAllocation> memory, const std::vector<int64_t>& shape, DataType dtype);

}  // namespace hvdlite
