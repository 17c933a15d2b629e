#include "api/dlpack_export.h"

namespace hvdlite {
namespace dlpack {

DataTypeDesc TypeOf(DataType dt) {
  switch (dt) {
    case DataType::kUInt8: return {kUInt, 8, 1};
    case DataType::kInt8: return {kInt, 8, 1};
    case DataType::kInt32: return {kInt, 32, 1};
    case DataType::kInt64: return {kInt, 64, 1};
    case DataType::kFloat16: return {kFloat, 16, 1};
    case DataType::kBFloat16: return {kBfloat, 16, 1};
    case DataType::kFloat32: return {kFloat, 32, 1};
    case DataType::kFloat64: return {kFloat, 64, 1};
  }
  return {kUInt, 8, 1};
}

}  // namespace dlpack

namespace {

// What a capsule's ManagedTensor owns: the memory and the shape array.
struct Holder {
  dlpack::ManagedTensor managed{};
  std::shared_ptr<DeviceAllocation> memory;
  std::vector<int64_t> shape;
};

void DeleteManaged(dlpack::ManagedTensor* t) { delete static_cast<Holder*>(t->manager_ctx); }

// A capsule nobody consumed (still named "dltensor") frees its tensor itself.
void DeleteCapsule(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, "dltensor")) return;  // consumed: renamed "used_dltensor"
  auto* t = static_cast<dlpack::ManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
  if (t && t->deleter) t->deleter(t);
}

}  // namespace

PyObject* ToDlpack(std::shared_ptr<DeviceAllocation> memory, const std::vector<int64_t>& shape, DataType dtype) {
  auto* h = new Holder();
  h->memory = std::move(memory);
  h->shape = shape;
  dlpack::Tensor& t = h->managed.dl_tensor;
  t.data = h->memory->data();
  t.device = {dlpack::kCUDA, h->memory->device()};
  t.ndim = static_cast<int32_t>(h->shape.size());
  t.dtype = dlpack::TypeOf(dtype);
  t.shape = h->shape.empty() ? nullptr : h->shape.data();
  t.strides = nullptr;
  t.byte_offset = 0;
  h->managed.manager_ctx = h;
  h->managed.deleter = &DeleteManaged;
  PyObject* capsule = PyCapsule_New(&h->managed, "dltensor", &DeleteCapsule);
  if (!capsule) delete h;
  return capsule;
}

}  // namespace hvdlite
