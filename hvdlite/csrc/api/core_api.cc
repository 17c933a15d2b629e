#include "api/core_api.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "common/common.h"
#include "common/handle_table.h"
#include "engine/engine.h"

namespace hvdlite {

static_assert(HVDLITE_ALLREDUCE == static_cast<int>(RequestType::kAllreduce) &&
                  HVDLITE_ALLGATHER == static_cast<int>(RequestType::kAllgather) &&
                  HVDLITE_BROADCAST == static_cast<int>(RequestType::kBroadcast) &&
                  HVDLITE_ALLTOALL == static_cast<int>(RequestType::kAlltoall) &&
                  HVDLITE_REDUCESCATTER == static_cast<int>(RequestType::kReducescatter) &&
                  HVDLITE_BARRIER == static_cast<int>(RequestType::kBarrier) &&
                  HVDLITE_JOIN == static_cast<int>(RequestType::kJoin) && kNumRequestTypes == 7,
              "c_api.h's request kinds must be the engine's");
static_assert(HVDLITE_UINT8 == static_cast<int>(DataType::kUInt8) &&
                  HVDLITE_INT8 == static_cast<int>(DataType::kInt8) &&
                  HVDLITE_INT32 == static_cast<int>(DataType::kInt32) &&
                  HVDLITE_INT64 == static_cast<int>(DataType::kInt64) &&
                  HVDLITE_FLOAT16 == static_cast<int>(DataType::kFloat16) &&
                  HVDLITE_BFLOAT16 == static_cast<int>(DataType::kBFloat16) &&
                  HVDLITE_FLOAT32 == static_cast<int>(DataType::kFloat32) &&
                  HVDLITE_FLOAT64 == static_cast<int>(DataType::kFloat64) && kNumDataTypes == 8,
              "c_api.h's element types must be the engine's");

namespace {

CoreAccess g_access;
HvdliteCoreApi g_api;

// What take_result hands out, kept until free_result.
struct HeldResult {
  std::string error;
  std::unique_ptr<OutputBuffer> out;
};

void CopyError(const std::string& message, char* error, int64_t error_size) {
  if (!error || error_size <= 0) return;
  const size_t n = std::min(message.size(), static_cast<size_t>(error_size - 1));
  std::memcpy(error, message.data(), n);
  error[n] = '\0';
}

// The engine of `process_set`, or null with the reason in `why`.
std::shared_ptr<Engine> EngineOrWhy(int32_t process_set, std::string* why) {
  const std::string unusable = g_access.unusable ? g_access.unusable() : std::string();
  if (!unusable.empty()) {
    *why = unusable;
    return nullptr;
  }
  std::shared_ptr<Engine> e = g_access.engine(process_set, why);
  // A stopped engine still takes requests and fails them with its reason.
  if (!e && why->empty()) *why = "hvdlite has not been initialized; call hvd.init() first";
  return e;
}

int64_t Enqueue(const HvdliteRequest* q, char* error, int64_t error_size) {
  try {
    std::string why;
    std::shared_ptr<Engine> e = EngineOrWhy(q->process_set, &why);
    if (!e) {
      CopyError(why, error, error_size);
      return 0;
    }
    if (q->type < 0 || q->type >= kNumRequestTypes || !ValidDataType(q->dtype) || q->ndim < 0 || !q->name) {
      CopyError("hvdlite: malformed request (kind " + std::to_string(q->type) + ", dtype " +
                    std::to_string(q->dtype) + ")",
                error, error_size);
      return 0;
    }
    Request r;
    r.type = static_cast<RequestType>(q->type);
    r.name = q->name;
    r.dtype = static_cast<DataType>(q->dtype);
    r.shape.assign(q->shape, q->shape + q->ndim);
    for (int64_t d : r.shape)
      if (d < 0) {
        CopyError("hvdlite: negative dimension in shape of '" + r.name + "'", error, error_size);
        return 0;
      }
    r.device = kCpuDevice;
    r.reduce_op = static_cast<ReduceOp>(q->reduce_op);
    r.prescale = q->prescale;
    r.postscale = q->postscale;
    r.root = q->root;
    if (q->splits && q->nsplits > 0) r.splits.assign(q->splits, q->splits + q->nsplits);
    r.group_id = q->group_id;
    r.group_size = q->group_size;
    // Nobody waits on the handle here: the engine's thread must be woken.
    return e->Enqueue(std::move(r), q->input, q->output, /*caller_waits=*/false);
  } catch (const std::exception& ex) {
    CopyError(std::string("hvdlite: ") + ex.what(), error, error_size);
    return 0;
  }
}

int64_t Refuse(int32_t type, const char* name, const char* problem, int32_t group_id, int32_t group_size,
               int32_t process_set, char* error, int64_t error_size) {
  try {
    std::string why;
    std::shared_ptr<Engine> e = EngineOrWhy(process_set, &why);
    if (!e) {
      CopyError(why, error, error_size);
      return 0;
    }
    if (type < 0 || type >= kNumRequestTypes) {
      CopyError("hvdlite: unknown request kind " + std::to_string(type), error, error_size);
      return 0;
    }
    Request r;
    r.type = static_cast<RequestType>(type);
    r.name = name ? name : "";
    r.error = RequestLabel(r.type, r.name) + ": " + (problem && *problem ? problem : "invalid input");
    r.group_id = group_id;
    r.group_size = group_size;
    return e->Enqueue(std::move(r), nullptr, nullptr, /*caller_waits=*/false);
  } catch (const std::exception& ex) {
    CopyError(std::string("hvdlite: ") + ex.what(), error, error_size);
    return 0;
  }
}

void WhenDone(int64_t h, HvdliteDoneCallback callback, void* arg) {
  g_access.handles->WhenDone(h, [callback, arg] { callback(arg); });
}

void TakeResult(int64_t h, HvdliteResult* result) {
  auto held = std::make_unique<HeldResult>();
  const int32_t owner = g_access.handles->OwnerOf(h);
  const bool ok = g_access.handles->Wait(h, &held->error);
  held->out = g_access.handles->TakeOutput(h);
  g_access.handles->Release(h);
  std::string why;
  std::shared_ptr<Engine> e = g_access.engine(owner < 0 ? 0 : owner, &why);
  *result = HvdliteResult{};
  result->ok = ok ? 1 : 0;
  // The engine marks itself stopped before it fails what it holds.
  result->engine_stopped = !ok && (!e || !e->Running()) ? 1 : 0;
  if (ok) held->error.clear();
  result->error = held->error.c_str();
  const OutputBuffer& out = *held->out;
  result->data = out.data.get();
  result->bytes = out.data ? out.bytes : 0;
  result->shape = out.shape.data();
  result->ndim = static_cast<int32_t>(out.shape.size());
  result->dtype = static_cast<int32_t>(out.dtype);
  result->aux = out.aux.data();
  result->naux = static_cast<int32_t>(out.aux.size());
  result->owner = held.release();
}

void FreeResult(HvdliteResult* result) {
  delete static_cast<HeldResult*>(result->owner);
  *result = HvdliteResult{};
}

int32_t Rank() {
  std::string why;
  std::shared_ptr<Engine> e = g_access.engine(0, &why);
  return e ? e->rank() : -1;
}

int32_t SetSize(int32_t process_set) {
  std::string why;
  std::shared_ptr<Engine> e = g_access.engine(process_set, &why);
  return e ? e->size() : -1;
}

int32_t Size() { return SetSize(0); }

}  // namespace

const HvdliteCoreApi* InstallCoreApi(const CoreAccess& access) {
  g_access = access;
  g_api.version = HVDLITE_C_API_VERSION;
  g_api.struct_size = static_cast<int32_t>(sizeof(HvdliteCoreApi));
  g_api.enqueue = &Enqueue;
  g_api.refuse = &Refuse;
  g_api.when_done = &WhenDone;
  g_api.take_result = &TakeResult;
  g_api.free_result = &FreeResult;
  g_api.rank = &Rank;
  g_api.size = &Size;
  g_api.set_size = &SetSize;
  return &g_api;
}

}  // namespace hvdlite
