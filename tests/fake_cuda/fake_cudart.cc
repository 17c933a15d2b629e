// A fake CUDA runtime (libcudart.so) for exercising GPU code paths on a CPU-only machine.
//
// "Device" memory is host memory. Every stream is an in-order queue run by its own worker
// thread, which sleeps HVDLITE_FAKE_CUDA_DELAY_US before each operation, so a caller that
// reads a result without waiting for its stream sees stale data instead of getting lucky.
// Exported names, argument types, enum values and struct layouts are those of the real
// runtime (CUDA 12/13) for the subset implemented here. See README.md.
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fake_common.h"

namespace {

// ---- ABI constants (driver_types.h) ----------------------------------------------------
constexpr cudaError_t cudaSuccess = 0;
constexpr cudaError_t cudaErrorInvalidValue = 1;
constexpr cudaError_t cudaErrorMemoryAllocation = 2;
constexpr cudaError_t cudaErrorInitializationError = 3;
constexpr cudaError_t cudaErrorInsufficientDriver = 35;
constexpr cudaError_t cudaErrorNoDevice = 100;
constexpr cudaError_t cudaErrorInvalidDevice = 101;
constexpr cudaError_t cudaErrorInvalidResourceHandle = 400;
constexpr cudaError_t cudaErrorNotReady = 600;

constexpr int cudaMemcpyDefault = 4;  // kinds 0..4 are valid
constexpr unsigned cudaStreamNonBlocking = 0x1;
constexpr unsigned cudaEventDisableTiming = 0x2;
constexpr unsigned kValidEventFlags = 0x1 | 0x2 | 0x4;  // BlockingSync, DisableTiming, Interprocess

enum MemoryType : int { kUnregistered = 0, kHost = 1, kDevice = 2, kManaged = 3 };

constexpr int kRuntimeVersion = 12080;
constexpr size_t kAlignment = 256;  // cudaMalloc's guaranteed alignment

using Clock = std::chrono::steady_clock;

// One queued operation. `delayed` operations (real work: copies, memsets, host functions,
// NCCL collectives, frees) sleep the configured delay first; bookkeeping operations (event
// markers, waits on events) do not.
struct Op {
  std::function<void()> fn;
  bool delayed = true;
};

// An in-order queue of operations executed by one worker thread.
struct Stream {
  int device = 0;
  unsigned flags = 0;
  std::mutex mu;
  std::condition_variable work_cv;  // new work or stop request
  std::condition_variable done_cv;  // `completed` advanced, or the worker exited
  std::deque<Op> queue;
  uint64_t enqueued = 0;   // operations ever enqueued; position of the last one
  uint64_t completed = 0;  // operations ever finished
  bool stopping = false;
  bool exited = false;
  std::thread worker;
};

// Where an event was last recorded: its stream and the position in that stream.
struct EventRecord {
  std::shared_ptr<Stream> stream;
  uint64_t seq = 0;
  int64_t done_ns = 0;  // completion time; written by the marker before `completed` advances
};

struct Event {
  unsigned flags = 0;
  std::mutex mu;
  std::shared_ptr<EventRecord> record;  // null: never recorded (counts as complete)
};

struct Allocation {
  size_t size = 0;
  int device = 0;
  MemoryType type = kDevice;
};

// All process-wide state. Created on first use and deliberately never destroyed: worker
// threads that could not be joined at exit may still touch it.
struct Runtime {
  int device_count = static_cast<int>(fake_common::env_long("HVDLITE_FAKE_CUDA_DEVICES", 8));
  long delay_us = fake_common::env_long("HVDLITE_FAKE_CUDA_DELAY_US", 200);
  fake_common::AppendLog log{"HVDLITE_FAKE_CUDA_LOG"};
  std::atomic<bool> shutdown{false};

  std::mutex mu;  // guards everything below
  std::unordered_map<const void*, std::shared_ptr<Stream>> streams;  // created streams
  std::vector<std::shared_ptr<Stream>> default_streams;              // per device, lazily
  std::unordered_map<const void*, std::shared_ptr<Event>> events;
  std::map<uintptr_t, Allocation> allocations;  // by base address
};

Runtime& rt() {
  static Runtime* runtime = new Runtime();
  return *runtime;
}

thread_local int t_device = 0;
thread_local cudaError_t t_last_error = cudaSuccess;

// Records `err` as the thread's last error (unless success / not-ready) and returns it.
cudaError_t ret(cudaError_t err) {
  if (err != cudaSuccess && err != cudaErrorNotReady) t_last_error = err;
  return err;
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

void log_call(const char* name) { rt().log.line("%s pid=%d", name, static_cast<int>(::getpid())); }

// ---- Streams -----------------------------------------------------------------------------

void worker_main(Stream* s) {
  Runtime& r = rt();
  for (;;) {
    Op op;
    {
      std::unique_lock<std::mutex> lock(s->mu);
      s->work_cv.wait(lock, [&] { return !s->queue.empty() || s->stopping; });
      // At process exit queued work is dropped: its buffers may already be gone.
      if (r.shutdown.load() || s->queue.empty()) break;
      op = std::move(s->queue.front());
      s->queue.pop_front();
    }
    if (op.delayed && r.delay_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(r.delay_us));
    op.fn();
    {
      std::lock_guard<std::mutex> lock(s->mu);
      ++s->completed;
    }
    s->done_cv.notify_all();
  }
  {
    std::lock_guard<std::mutex> lock(s->mu);
    s->exited = true;
  }
  s->done_cv.notify_all();
}

// Creates a stream and starts its worker; null if the thread could not be started.
std::shared_ptr<Stream> start_stream(int device, unsigned flags) {
  auto s = std::make_shared<Stream>();
  s->device = device;
  s->flags = flags;
  try {
    s->worker = std::thread(worker_main, s.get());
  } catch (const std::system_error&) {
    return nullptr;
  }
  return s;
}

// Stops a stream's worker after it drained its queue, and joins it.
void stop_and_join(Stream& s) {
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.stopping = true;
  }
  s.work_cv.notify_all();
  if (!s.worker.joinable()) return;
  if (s.worker.get_id() == std::this_thread::get_id()) {
    s.worker.detach();  // destroyed from one of its own host functions
  } else {
    s.worker.join();
  }
}

bool is_special_stream(cudaStream_t h) {
  auto v = reinterpret_cast<uintptr_t>(h);
  return v == 0 || v == 1 || v == 2;  // legacy default, cudaStreamLegacy, cudaStreamPerThread
}

// The device's default stream (the one behind handles 0, 0x1 and 0x2), created lazily;
// null with *err set when there is no such device or no thread could be started.
std::shared_ptr<Stream> default_stream(int device, cudaError_t* err) {
  Runtime& r = rt();
  std::lock_guard<std::mutex> lock(r.mu);
  if (device < 0 || device >= r.device_count) {
    *err = cudaErrorInvalidDevice;
    return nullptr;
  }
  if (r.default_streams.size() < static_cast<size_t>(r.device_count)) r.default_streams.resize(r.device_count);
  auto& s = r.default_streams[device];
  if (!s) s = start_stream(device, 0);
  if (!s) *err = cudaErrorMemoryAllocation;
  return s;
}

// Maps a handle to its stream; null with *err set when the handle is not a live stream.
std::shared_ptr<Stream> resolve_stream(cudaStream_t h, cudaError_t* err) {
  if (is_special_stream(h)) return default_stream(t_device, err);
  Runtime& r = rt();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.streams.find(h);
  if (it == r.streams.end()) {
    *err = cudaErrorInvalidResourceHandle;
    return nullptr;
  }
  return it->second;
}

// Appends an operation; returns its position in the stream.
uint64_t enqueue(Stream& s, std::function<void()> fn, bool delayed) {
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.queue.push_back(Op{std::move(fn), delayed});
    seq = ++s.enqueued;
  }
  s.work_cv.notify_one();
  return seq;
}

// Blocks until `s` finished its first `target` operations; false if the process is exiting.
bool wait_position(Stream& s, uint64_t target) {
  std::unique_lock<std::mutex> lock(s.mu);
  s.done_cv.wait(lock, [&] { return s.completed >= target || rt().shutdown.load(); });
  return s.completed >= target;
}

bool position_reached(Stream& s, uint64_t target) {
  std::lock_guard<std::mutex> lock(s.mu);
  return s.completed >= target;
}

// Waits for everything enqueued so far on `s`.
void drain(Stream& s) {
  uint64_t target;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    target = s.enqueued;
  }
  wait_position(s, target);
}

// Waits for all work enqueued so far on the streams of `device`.
void synchronize_device(int device) {
  std::vector<std::shared_ptr<Stream>> todo;
  {
    Runtime& r = rt();
    std::lock_guard<std::mutex> lock(r.mu);
    for (auto& kv : r.streams)
      if (kv.second->device == device) todo.push_back(kv.second);
    if (static_cast<size_t>(device) < r.default_streams.size() && r.default_streams[device])
      todo.push_back(r.default_streams[device]);
  }
  for (auto& s : todo) drain(*s);
}

std::shared_ptr<Event> resolve_event(cudaEvent_t h) {
  Runtime& r = rt();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.events.find(h);
  return it == r.events.end() ? nullptr : it->second;
}

std::shared_ptr<EventRecord> current_record(Event& e) {
  std::lock_guard<std::mutex> lock(e.mu);
  return e.record;
}

bool record_done(const std::shared_ptr<EventRecord>& rec) {
  return !rec || position_reached(*rec->stream, rec->seq);
}

// ---- Memory ------------------------------------------------------------------------------

cudaError_t allocate(void** ptr, size_t size, MemoryType type) {
  if (ptr == nullptr) return cudaErrorInvalidValue;
  *ptr = nullptr;
  if (size == 0) return cudaSuccess;  // as the real runtime: success and a null pointer
  void* p = nullptr;
  if (::posix_memalign(&p, kAlignment, size) != 0) return cudaErrorMemoryAllocation;
  Runtime& r = rt();
  std::lock_guard<std::mutex> lock(r.mu);
  r.allocations[reinterpret_cast<uintptr_t>(p)] = Allocation{size, t_device, type};
  *ptr = p;
  return cudaSuccess;
}

// Removes the allocation starting exactly at `p` if it has type `type`.
bool unregister(void* p, MemoryType type) {
  Runtime& r = rt();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.allocations.find(reinterpret_cast<uintptr_t>(p));
  if (it == r.allocations.end() || it->second.type != type) return false;
  r.allocations.erase(it);
  return true;
}

// At process exit (or library unload) stop the workers without hanging: queued work is
// dropped, waits inside the runtime give up, and workers still blocked elsewhere (say in a
// fake NCCL wait that its own library failed to end) are detached after a bounded wait.
struct Finalizer {
  ~Finalizer() {
    Runtime& r = rt();
    std::vector<std::shared_ptr<Stream>> all;
    {
      std::lock_guard<std::mutex> lock(r.mu);
      for (auto& kv : r.streams) all.push_back(kv.second);
      for (auto& s : r.default_streams)
        if (s) all.push_back(s);
    }
    r.shutdown.store(true);
    for (auto& s : all) {
      {
        std::lock_guard<std::mutex> lock(s->mu);
        s->stopping = true;
      }
      s->work_cv.notify_all();
      s->done_cv.notify_all();
    }
    // Waits on other streams' done_cv (cudaStreamWaitEvent) also wake up above.
    auto deadline = Clock::now() + std::chrono::seconds(2);
    for (auto& s : all) {
      std::unique_lock<std::mutex> lock(s->mu);
      bool exited = s->done_cv.wait_until(lock, deadline, [&] { return s->exited; });
      lock.unlock();
      if (!s->worker.joinable()) continue;
      if (exited)
        s->worker.join();
      else
        s->worker.detach();
    }
  }
};
Finalizer g_finalizer;

const char* error_name(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError: return "cudaErrorInitializationError";
    case cudaErrorInsufficientDriver: return "cudaErrorInsufficientDriver";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    default: return "cudaErrorUnknown";
  }
}

const char* error_string(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess: no error";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue: invalid argument";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation: out of memory";
    case cudaErrorInitializationError: return "cudaErrorInitializationError: initialization error";
    case cudaErrorInsufficientDriver:
      return "cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA runtime version";
    case cudaErrorNoDevice: return "cudaErrorNoDevice: no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice: invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle: invalid resource handle";
    case cudaErrorNotReady: return "cudaErrorNotReady: device not ready";
    default: return "cudaErrorUnknown: unrecognized error code";
  }
}

}  // namespace

// The leading fields of struct cudaPointerAttributes (CUDA 11+). CUDA 13 appends
// `long reserved[8]`; only these four are ever written, so callers may pass either.
struct cudaPointerAttributes {
  int type;
  int device;
  void* devicePointer;
  void* hostPointer;
};

// ---- Devices, versions, errors -------------------------------------------------------------

FAKE_EXPORT cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return ret(cudaErrorInvalidValue);
  int n = rt().device_count;
  *count = n > 0 ? n : 0;
  return n > 0 ? cudaSuccess : ret(cudaErrorNoDevice);
}

FAKE_EXPORT cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= rt().device_count) return ret(cudaErrorInvalidDevice);
  t_device = device;
  return cudaSuccess;
}

FAKE_EXPORT cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return ret(cudaErrorInvalidValue);
  *device = t_device;
  return cudaSuccess;
}

FAKE_EXPORT cudaError_t cudaRuntimeGetVersion(int* version) {
  if (version == nullptr) return ret(cudaErrorInvalidValue);
  *version = kRuntimeVersion;
  return cudaSuccess;
}

FAKE_EXPORT cudaError_t cudaDriverGetVersion(int* version) {
  if (version == nullptr) return ret(cudaErrorInvalidValue);
  *version = kRuntimeVersion;
  return cudaSuccess;
}

FAKE_EXPORT const char* cudaGetErrorName(cudaError_t error) { return error_name(error); }
FAKE_EXPORT const char* cudaGetErrorString(cudaError_t error) { return error_string(error); }

FAKE_EXPORT cudaError_t cudaGetLastError() {
  cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  return e;
}

FAKE_EXPORT cudaError_t cudaPeekAtLastError() { return t_last_error; }

FAKE_EXPORT cudaError_t cudaDeviceSynchronize() {
  log_call("cudaDeviceSynchronize");
  synchronize_device(t_device);
  return cudaSuccess;
}

// ---- Memory ----------------------------------------------------------------------------------

FAKE_EXPORT cudaError_t cudaMalloc(void** ptr, size_t size) { return ret(allocate(ptr, size, kDevice)); }

FAKE_EXPORT cudaError_t cudaMallocHost(void** ptr, size_t size) { return ret(allocate(ptr, size, kHost)); }

FAKE_EXPORT cudaError_t cudaMallocAsync(void** ptr, size_t size, cudaStream_t stream) {
  cudaError_t err = cudaSuccess;
  if (!resolve_stream(stream, &err)) return ret(err);
  return ret(allocate(ptr, size, kDevice));  // allocated at once; fine for stream order
}

FAKE_EXPORT cudaError_t cudaFree(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  if (!unregister(ptr, kDevice)) return ret(cudaErrorInvalidValue);
  synchronize_device(t_device);  // the real cudaFree synchronizes too (not logged)
  std::free(ptr);
  return cudaSuccess;
}

FAKE_EXPORT cudaError_t cudaFreeHost(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  if (!unregister(ptr, kHost)) return ret(cudaErrorInvalidValue);
  std::free(ptr);
  return cudaSuccess;
}

FAKE_EXPORT cudaError_t cudaFreeAsync(void* ptr, cudaStream_t stream) {
  cudaError_t err = cudaSuccess;
  auto s = resolve_stream(stream, &err);
  if (!s) return ret(err);
  if (ptr == nullptr) return cudaSuccess;
  if (!unregister(ptr, kDevice)) return ret(cudaErrorInvalidValue);
  enqueue(*s, [ptr] { std::free(ptr); }, true);
  return cudaSuccess;
}

FAKE_EXPORT cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* ptr) {
  if (attributes == nullptr || ptr == nullptr) return ret(cudaErrorInvalidValue);
  cudaPointerAttributes a{kDevice, t_device, const_cast<void*>(ptr), const_cast<void*>(ptr)};
  {
    Runtime& r = rt();
    std::lock_guard<std::mutex> lock(r.mu);
    auto p = reinterpret_cast<uintptr_t>(ptr);
    auto it = r.allocations.upper_bound(p);
    if (it != r.allocations.begin()) {
      --it;
      if (p < it->first + it->second.size) {
        a.type = it->second.type;
        a.device = it->second.device;
      }
    }
  }
  // Any other pointer counts as memory of the current device (see README).
  std::memcpy(attributes, &a, sizeof(a));
  return cudaSuccess;
}

FAKE_EXPORT cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, int kind) {
  log_call("cudaMemcpy");
  if (kind < 0 || kind > cudaMemcpyDefault) return ret(cudaErrorInvalidValue);
  if (count == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return ret(cudaErrorInvalidValue);
  synchronize_device(t_device);  // ordered after all work of the device, like the real one
  std::memmove(dst, src, count);
  return cudaSuccess;
}

FAKE_EXPORT cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, int kind, cudaStream_t stream) {
  if (kind < 0 || kind > cudaMemcpyDefault) return ret(cudaErrorInvalidValue);
  cudaError_t err = cudaSuccess;
  auto s = resolve_stream(stream, &err);
  if (!s) return ret(err);
  if (count == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return ret(cudaErrorInvalidValue);
  enqueue(*s, [dst, src, count] { std::memmove(dst, src, count); }, true);
  return cudaSuccess;
}

FAKE_EXPORT cudaError_t cudaMemsetAsync(void* dst, int value, size_t count, cudaStream_t stream) {
  cudaError_t err = cudaSuccess;
  auto s = resolve_stream(stream, &err);
  if (!s) return ret(err);
  if (count == 0) return cudaSuccess;
  if (dst == nullptr) return ret(cudaErrorInvalidValue);
  enqueue(*s, [dst, value, count] { std::memset(dst, value, count); }, true);
  return cudaSuccess;
}

// ---- Streams ---------------------------------------------------------------------------------

FAKE_EXPORT cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags) {
  if (stream == nullptr || (flags & ~cudaStreamNonBlocking) != 0) return ret(cudaErrorInvalidValue);
  auto s = start_stream(t_device, flags);
  if (!s) return ret(cudaErrorMemoryAllocation);
  Runtime& r = rt();
  std::lock_guard<std::mutex> lock(r.mu);
  r.streams[s.get()] = s;
  *stream = reinterpret_cast<cudaStream_t>(s.get());
  return cudaSuccess;
}

FAKE_EXPORT cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, 0); }

// Unlike the real call (which returns at once and releases the stream later), this one
// waits for the stream's queued work, then joins its worker.
FAKE_EXPORT cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (is_special_stream(stream)) return ret(cudaErrorInvalidResourceHandle);
  std::shared_ptr<Stream> s;
  {
    Runtime& r = rt();
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.streams.find(stream);
    if (it == r.streams.end()) return ret(cudaErrorInvalidResourceHandle);
    s = std::move(it->second);
    r.streams.erase(it);
  }
  stop_and_join(*s);
  return cudaSuccess;
}

FAKE_EXPORT cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  log_call("cudaStreamSynchronize");
  cudaError_t err = cudaSuccess;
  auto s = resolve_stream(stream, &err);
  if (!s) return ret(err);
  drain(*s);
  return cudaSuccess;
}

FAKE_EXPORT cudaError_t cudaStreamQuery(cudaStream_t stream) {
  cudaError_t err = cudaSuccess;
  auto s = resolve_stream(stream, &err);
  if (!s) return ret(err);
  std::lock_guard<std::mutex> lock(s->mu);
  return s->completed == s->enqueued ? cudaSuccess : cudaErrorNotReady;
}

FAKE_EXPORT cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags) {
  (void)flags;  // cudaEventWaitDefault / cudaEventWaitExternal: same thing here
  cudaError_t err = cudaSuccess;
  auto s = resolve_stream(stream, &err);
  if (!s) return ret(err);
  auto e = resolve_event(event);
  if (!e) return ret(cudaErrorInvalidResourceHandle);
  auto rec = current_record(*e);  // the position now; later re-records don't matter
  if (record_done(rec)) return cudaSuccess;
  enqueue(*s, [rec] { wait_position(*rec->stream, rec->seq); }, false);
  return cudaSuccess;
}

FAKE_EXPORT cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* user_data) {
  if (fn == nullptr) return ret(cudaErrorInvalidValue);
  cudaError_t err = cudaSuccess;
  auto s = resolve_stream(stream, &err);
  if (!s) return ret(err);
  enqueue(*s, [fn, user_data] { fn(user_data); }, true);
  return cudaSuccess;
}

// ---- Events ----------------------------------------------------------------------------------

FAKE_EXPORT cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags) {
  if (event == nullptr || (flags & ~kValidEventFlags) != 0) return ret(cudaErrorInvalidValue);
  auto e = std::make_shared<Event>();
  e->flags = flags;
  Runtime& r = rt();
  std::lock_guard<std::mutex> lock(r.mu);
  r.events[e.get()] = e;
  *event = reinterpret_cast<cudaEvent_t>(e.get());
  return cudaSuccess;
}

FAKE_EXPORT cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, 0); }

FAKE_EXPORT cudaError_t cudaEventDestroy(cudaEvent_t event) {
  Runtime& r = rt();
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.events.erase(event) == 0) return ret(cudaErrorInvalidResourceHandle);
  return cudaSuccess;  // pending waits hold their own reference to the record
}

FAKE_EXPORT cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  auto e = resolve_event(event);
  if (!e) return ret(cudaErrorInvalidResourceHandle);
  cudaError_t err = cudaSuccess;
  auto s = resolve_stream(stream, &err);
  if (!s) return ret(err);
  auto rec = std::make_shared<EventRecord>();
  rec->stream = s;
  std::lock_guard<std::mutex> lock(e->mu);  // keeps concurrent records of `e` in order
  // The marker owns a reference: `e` may be re-recorded or destroyed before it runs.
  rec->seq = enqueue(*s, [rec] { rec->done_ns = now_ns(); }, false);
  e->record = std::move(rec);
  return cudaSuccess;
}

FAKE_EXPORT cudaError_t cudaEventQuery(cudaEvent_t event) {
  auto e = resolve_event(event);
  if (!e) return ret(cudaErrorInvalidResourceHandle);
  return record_done(current_record(*e)) ? cudaSuccess : cudaErrorNotReady;
}

FAKE_EXPORT cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  log_call("cudaEventSynchronize");
  auto e = resolve_event(event);
  if (!e) return ret(cudaErrorInvalidResourceHandle);
  auto rec = current_record(*e);
  if (rec) wait_position(*rec->stream, rec->seq);
  return cudaSuccess;
}

FAKE_EXPORT cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (ms == nullptr) return ret(cudaErrorInvalidValue);
  auto a = resolve_event(start);
  auto b = resolve_event(end);
  if (!a || !b) return ret(cudaErrorInvalidResourceHandle);
  if ((a->flags | b->flags) & cudaEventDisableTiming) return ret(cudaErrorInvalidResourceHandle);
  auto ra = current_record(*a);
  auto rb = current_record(*b);
  if (!ra || !rb) return ret(cudaErrorInvalidResourceHandle);  // never recorded
  if (!record_done(ra) || !record_done(rb)) return cudaErrorNotReady;
  *ms = static_cast<float>(static_cast<double>(rb->done_ns - ra->done_ns) / 1e6);
  return cudaSuccess;
}
