#include "gpu/cuda_runtime.h"

#include <mutex>
#include <stdexcept>

#include "common/logging.h"
#include "gpu/library_loader.h"

namespace hvdlite {
namespace cuda {
namespace {

std::once_flag g_once;
Runtime* g_runtime = nullptr;  // kept for the life of the process, like the library
std::string g_error;

// A recorded event of the pool: ordering another stream after it, asking whether it
// fired. Back to the pool when the last owner lets go.
class PooledEvent : public ReadyEvent {
 public:
  PooledEvent(std::shared_ptr<EventPool> pool, Event e) : pool_(std::move(pool)), event_(e) {}
  ~PooledEvent() override { pool_->Give(event_); }
  void OrderBefore(uintptr_t stream) override {
    const Runtime& rt = pool_->runtime();
    rt.Check(rt.api().StreamWaitEvent(reinterpret_cast<Stream>(stream), event_, 0), "cudaStreamWaitEvent");
  }
  bool Query() override {
    const Runtime& rt = pool_->runtime();
    const Error e = rt.api().EventQuery(event_);
    if (e == kErrorNotReady) return false;
    rt.Check(e, "cudaEventQuery");
    return true;
  }
  void Synchronize() override {
    const Runtime& rt = pool_->runtime();
    rt.Check(rt.api().EventSynchronize(event_), "cudaEventSynchronize");
  }
  int32_t device() const override { return pool_->device(); }

 private:
  std::shared_ptr<EventPool> pool_;
  Event event_;
};

}  // namespace

Runtime& Runtime::Get() {
  std::string error;
  Runtime* rt = TryGet(&error);
  if (!rt) throw std::runtime_error(error);
  return *rt;
}

Runtime* Runtime::TryGet(std::string* error) {
  std::call_once(g_once, [] {
    std::string why;
    auto lib = SharedLibrary::Open("cudart", "the CUDA runtime (libcudart)", "HVDLITE_CUDART_LIBRARY",
                                   {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"},
                                   "cudaGetErrorString", &why);
    if (!lib) {
      g_error = why;
      return;
    }
    std::unique_ptr<Runtime> rt(new Runtime());
    Api& a = rt->api_;
    std::string missing;
    BindSymbol(*lib, "cudaGetDeviceCount", &a.GetDeviceCount, &missing);
    BindSymbol(*lib, "cudaSetDevice", &a.SetDevice, &missing);
    BindSymbol(*lib, "cudaGetDevice", &a.GetDevice, &missing);
    BindSymbol(*lib, "cudaMalloc", &a.Malloc, &missing);
    BindSymbol(*lib, "cudaFree", &a.Free, &missing);
    BindSymbol(*lib, "cudaMallocHost", &a.MallocHost, &missing);
    BindSymbol(*lib, "cudaFreeHost", &a.FreeHost, &missing);
    BindSymbol(*lib, "cudaMemcpyAsync", &a.MemcpyAsync, &missing);
    BindSymbol(*lib, "cudaMemsetAsync", &a.MemsetAsync, &missing);
    BindSymbol(*lib, "cudaStreamCreateWithFlags", &a.StreamCreateWithFlags, &missing);
    BindSymbol(*lib, "cudaStreamDestroy", &a.StreamDestroy, &missing);
    BindSymbol(*lib, "cudaStreamSynchronize", &a.StreamSynchronize, &missing);
    BindSymbol(*lib, "cudaStreamWaitEvent", &a.StreamWaitEvent, &missing);
    BindSymbol(*lib, "cudaEventCreateWithFlags", &a.EventCreateWithFlags, &missing);
    BindSymbol(*lib, "cudaEventRecord", &a.EventRecord, &missing);
    BindSymbol(*lib, "cudaEventQuery", &a.EventQuery, &missing);
    BindSymbol(*lib, "cudaEventSynchronize", &a.EventSynchronize, &missing);
    BindSymbol(*lib, "cudaEventDestroy", &a.EventDestroy, &missing);
    BindSymbol(*lib, "cudaPointerGetAttributes", &a.PointerGetAttributes, &missing);
    BindSymbol(*lib, "cudaGetErrorString", &a.GetErrorString, &missing);
    BindSymbol(*lib, "cudaGetLastError", &a.GetLastError, &missing);
    BindSymbol(*lib, "cudaRuntimeGetVersion", &a.RuntimeGetVersion, &missing);
    BindSymbol(*lib, "cudaDriverGetVersion", &a.DriverGetVersion, &missing);
    BindSymbol(*lib, "cudaMallocAsync", &a.MallocAsync, nullptr);
    BindSymbol(*lib, "cudaFreeAsync", &a.FreeAsync, nullptr);
    if (!a.MallocAsync || !a.FreeAsync) a.MallocAsync = nullptr, a.FreeAsync = nullptr;
    if (!missing.empty()) {
      g_error = "hvdlite: " + lib->path() + " lacks " + missing + "; it is not a usable CUDA runtime";
      return;
    }
    a.RuntimeGetVersion(&rt->runtime_version_);
    a.DriverGetVersion(&rt->driver_version_);
    rt->lib_ = std::move(lib);
    HVD_INFO("CUDA runtime " << rt->runtime_version_ << " loaded from " << rt->lib_->path());
    g_runtime = rt.release();
  });
  if (!g_runtime && error) *error = g_error;
  return g_runtime;
}

const std::string& Runtime::path() const { return lib_->path(); }

std::string Runtime::ErrorString(Error e) const {
  const char* s = api_.GetErrorString ? api_.GetErrorString(e) : nullptr;
  return std::string(s ? s : "unknown CUDA error") + " (" + std::to_string(e) + ")";
}

void Runtime::Check(Error e, const char* what) const {
  if (e == kSuccess) return;
  api_.GetLastError();  // clear the sticky-free error state of this thread
  throw std::runtime_error(std::string("CUDA error in ") + what + ": " + ErrorString(e));
}

int Runtime::device_count() const {
  int n = 0;
  if (api_.GetDeviceCount(&n) != kSuccess) {
    api_.GetLastError();
    return 0;
  }
  return n;
}

int Runtime::DeviceOf(const void* ptr, std::string* why) const {
  PointerAttributes attr{};
  const Error e = api_.PointerGetAttributes(&attr, ptr);
  if (e != kSuccess) {
    api_.GetLastError();
    *why = "cudaPointerGetAttributes failed: " + ErrorString(e);
    return -1;
  }
  if (attr.type == kDeviceMemory || attr.type == kManagedMemory) return attr.device;
  *why = attr.type == kHostMemory ? "the pointer is pinned host memory, not device memory"
                                  : "the pointer is not CUDA device memory";
  return -1;
}

DeviceGuard::DeviceGuard(const Runtime& rt, int device) : rt_(rt) {
  rt_.Check(rt_.api().GetDevice(&previous_), "cudaGetDevice");
  if (previous_ != device) {
    rt_.Check(rt_.api().SetDevice(device), "cudaSetDevice");
    changed_ = true;
  }
}

DeviceGuard::~DeviceGuard() {
  if (changed_) rt_.api().SetDevice(previous_);
}

OwnStream::OwnStream(const Runtime& rt, int device) : rt_(rt), device_(device) {
  DeviceGuard guard(rt_, device_);
  rt_.Check(rt_.api().StreamCreateWithFlags(&stream_, kStreamNonBlocking), "cudaStreamCreateWithFlags");
}

OwnStream::~OwnStream() {
  if (!stream_) return;
  DeviceGuard guard(rt_, device_);
  rt_.api().StreamSynchronize(stream_);
  rt_.api().StreamDestroy(stream_);
}

EventPool::~EventPool() {
  for (Event e : free_) rt_.api().EventDestroy(e);
}

std::shared_ptr<ReadyEvent> EventPool::Record(Stream stream) {
  Event e = nullptr;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!free_.empty()) {
      e = free_.back();
      free_.pop_back();
    }
  }
  if (!e) rt_.Check(rt_.api().EventCreateWithFlags(&e, kEventDisableTiming), "cudaEventCreateWithFlags");
  auto ready = std::make_shared<PooledEvent>(shared_from_this(), e);
  rt_.Check(rt_.api().EventRecord(e, stream), "cudaEventRecord");
  return ready;
}

void EventPool::Give(Event e) {
  std::lock_guard<std::mutex> lk(mu_);
  free_.push_back(e);
}

StreamMemory::StreamMemory(std::shared_ptr<EventPool> events, std::shared_ptr<OwnStream> stream, int64_t bytes)
    : events_(std::move(events)), stream_(std::move(stream)), bytes_(bytes) {
  const Runtime& rt = events_->runtime();
  DeviceGuard guard(rt, events_->device());
  const size_t n = static_cast<size_t>(bytes > 0 ? bytes : 1);
  if (rt.api().MallocAsync) rt.Check(rt.api().MallocAsync(&ptr_, n, stream_->get()), "cudaMallocAsync");
  else rt.Check(rt.api().Malloc(&ptr_, n), "cudaMalloc");
}

void StreamMemory::UsedOn(uintptr_t stream) {
  if (stream == reinterpret_cast<uintptr_t>(stream_->get())) return;
  std::lock_guard<std::mutex> lk(mu_);
  for (uintptr_t s : users_)
    if (s == stream) return;
  users_.push_back(stream);
}

StreamMemory::~StreamMemory() {
  const Runtime& rt = events_->runtime();
  try {
    DeviceGuard guard(rt, events_->device());
    // Whatever the consumers queued so far that reads this memory comes first. A
    // consumer's stream that no longer exists has nothing queued any more: skipped.
    for (uintptr_t s : users_) {
      try {
        events_->Record(reinterpret_cast<Stream>(s))->OrderBefore(stream());
      } catch (const std::exception& ex) {
        HVD_DEBUG("freeing a GPU result buffer: not ordered after stream " << s << ": " << ex.what());
      }
    }
    if (rt.api().FreeAsync) rt.api().FreeAsync(ptr_, stream_->get());
    else rt.api().Free(ptr_);
  } catch (const std::exception& ex) {
    HVD_WARN("freeing a GPU result buffer: " << ex.what());
  }
}

DeviceBuffer::~DeviceBuffer() {
  if (!ptr_) return;
  DeviceGuard guard(rt_, device_);
  if (rt_.api().FreeAsync) rt_.api().FreeAsync(ptr_, stream_);
  else rt_.api().Free(ptr_);
}

uint8_t* DeviceBuffer::Get(int64_t bytes, Stream stream) {
  if (bytes <= capacity_ && ptr_) return static_cast<uint8_t*>(ptr_);
  if (ptr_) {
    if (rt_.api().FreeAsync) rt_.Check(rt_.api().FreeAsync(ptr_, stream_), "cudaFreeAsync");
    else rt_.Check(rt_.api().Free(ptr_), "cudaFree");
    ptr_ = nullptr;
  }
  const size_t n = static_cast<size_t>(bytes > 0 ? bytes : 1);
  if (rt_.api().MallocAsync) rt_.Check(rt_.api().MallocAsync(&ptr_, n, stream), "cudaMallocAsync");
  else rt_.Check(rt_.api().Malloc(&ptr_, n), "cudaMalloc");
  capacity_ = bytes;
  stream_ = stream;
  return static_cast<uint8_t*>(ptr_);
}

}  // namespace cuda
}  // namespace hvdlite
