// The CUDA runtime, opened with dlopen when the first GPU tensor appears.
//
// No CUDA header or library is needed to build hvdlite: the few types and functions
// it calls are declared here, in a table of function pointers looked up by name (the
// C ABI of libcudart is stable across CUDA 11-13 for all of them). A machine without
// CUDA never opens it. `HVDLITE_CUDART_LIBRARY` names the file to use; otherwise the
// search order of gpu/library_loader.h applies.
//
// Also here: RAII for what hvdlite makes with it (streams, events, device memory), a
// guard that switches the calling thread's current device and back, and an event pool.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/handle_table.h"

namespace hvdlite {

class SharedLibrary;

namespace cuda {

using Error = int;
using Stream = void*;  // cudaStream_t
using Event = void*;   // cudaEvent_t
constexpr Error kSuccess = 0;
constexpr Error kErrorNotReady = 600;
constexpr unsigned kStreamNonBlocking = 0x1;
constexpr unsigned kEventDisableTiming = 0x2;
enum MemcpyKind : int { kHostToHost = 0, kHostToDevice = 1, kDeviceToHost = 2, kDeviceToDevice = 3, kDefault = 4 };
enum MemoryType : int { kUnregistered = 0, kHostMemory = 1, kDeviceMemory = 2, kManagedMemory = 3 };

// cudaPointerAttributes as of CUDA 11; CUDA 13 appends reserved words, hence the room.
struct PointerAttributes {
  int type;
  int device;
  void* device_pointer;
  void* host_pointer;
  long reserved[16];
};

// The functions hvdlite calls. Version 1 of the table; a function added later must be
// optional (null when the library lacks it) and checked before use.
struct Api {
  Error (*GetDeviceCount)(int*);
  Error (*SetDevice)(int);
  Error (*GetDevice)(int*);
  Error (*Malloc)(void**, size_t);
  Error (*Free)(void*);
  Error (*MallocHost)(void**, size_t);
  Error (*FreeHost)(void*);
  Error (*MemcpyAsync)(void*, const void*, size_t, int, Stream);
  Error (*MemsetAsync)(void*, int, size_t, Stream);
  Error (*StreamCreateWithFlags)(Stream*, unsigned);
  Error (*StreamDestroy)(Stream);
  Error (*StreamSynchronize)(Stream);
  Error (*StreamWaitEvent)(Stream, Event, unsigned);
  Error (*EventCreateWithFlags)(Event*, unsigned);
  Error (*EventRecord)(Event, Stream);
  Error (*EventQuery)(Event);
  Error (*EventSynchronize)(Event);
  Error (*EventDestroy)(Event);
  Error (*PointerGetAttributes)(PointerAttributes*, const void*);
  const char* (*GetErrorString)(Error);
  Error (*GetLastError)();
  Error (*RuntimeGetVersion)(int*);
  Error (*DriverGetVersion)(int*);
  // Optional (CUDA 11.2+): stream-ordered allocation. Without it, Malloc/Free.
  Error (*MallocAsync)(void**, size_t, Stream);
  Error (*FreeAsync)(void*, Stream);
};

class Runtime {
 public:
  // The process's runtime, opened on first use (thread-safe). Throws
  // std::runtime_error saying where it looked if it cannot be opened.
  static Runtime& Get();
  // Null, with the reason, if it cannot be opened; never throws.
  static Runtime* TryGet(std::string* error);

  const Api& api() const { return api_; }
  const std::string& path() const;
  int runtime_version() const { return runtime_version_; }
  int driver_version() const { return driver_version_; }

  // Throws std::runtime_error "CUDA error in <what>: <cudaGetErrorString>" unless ok.
  void Check(Error e, const char* what) const;
  std::string ErrorString(Error e) const;

  int device_count() const;
  // The device a pointer's memory belongs to, or -1 with `why` if it is not device
  // (or managed) memory.
  int DeviceOf(const void* ptr, std::string* why) const;

 private:
  Runtime() = default;
  std::shared_ptr<SharedLibrary> lib_;
  Api api_{};
  int runtime_version_ = 0;
  int driver_version_ = 0;
};

// Makes `device` the calling thread's current device for the guard's lifetime.
class DeviceGuard {
 public:
  DeviceGuard(const Runtime& rt, int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  const Runtime& rt_;
  int previous_ = -1;
  bool changed_ = false;
};

// A stream of hvdlite's own on one device (non-blocking with respect to the legacy
// default stream).
class OwnStream {
 public:
  OwnStream(const Runtime& rt, int device);
  ~OwnStream();
  OwnStream(const OwnStream&) = delete;
  OwnStream& operator=(const OwnStream&) = delete;
  Stream get() const { return stream_; }

 private:
  const Runtime& rt_;
  int device_;
  Stream stream_ = nullptr;
};

// Events of one device, reused: an event is created once and recorded many times.
class EventPool : public std::enable_shared_from_this<EventPool> {
 public:
  EventPool(const Runtime& rt, int device) : rt_(rt), device_(device) {}
  ~EventPool();
  // An event recorded on `stream` now; back to the pool when the last owner lets go.
  // The caller's current device must be this pool's device.
  std::shared_ptr<ReadyEvent> Record(Stream stream);
  int device() const { return device_; }
  const Runtime& runtime() const { return rt_; }
  // An event no longer recorded by anyone, for reuse.
  void Give(Event e);

 private:
  const Runtime& rt_;
  int device_;
  std::mutex mu_;
  std::vector<Event> free_;
};

// Device memory from the stream-ordered allocator, owned by a result. Freed on the
// stream it was made on, after the work of every stream it was used on so far.
class StreamMemory : public DeviceAllocation {
 public:
  StreamMemory(std::shared_ptr<EventPool> events, std::shared_ptr<OwnStream> stream, int64_t bytes);
  ~StreamMemory() override;
  void* data() const override { return ptr_; }
  int64_t bytes() const override { return bytes_; }
  int32_t device() const override { return events_->device(); }
  uintptr_t stream() const override { return reinterpret_cast<uintptr_t>(stream_->get()); }
  void UsedOn(uintptr_t stream) override;

 private:
  std::shared_ptr<EventPool> events_;
  std::shared_ptr<OwnStream> stream_;
  int64_t bytes_;
  void* ptr_ = nullptr;
  std::mutex mu_;
  std::vector<uintptr_t> users_;
};

// A device buffer reused from collective to collective (the fusion buffer): grows to
// the largest size asked for. Work using it is ordered on one stream.
class DeviceBuffer {
 public:
  DeviceBuffer(const Runtime& rt, int device) : rt_(rt), device_(device) {}
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  // At least `bytes`, on `stream` (a larger one replaces the old, freed in order).
  uint8_t* Get(int64_t bytes, Stream stream);

 private:
  const Runtime& rt_;
  int device_;
  void* ptr_ = nullptr;
  int64_t capacity_ = 0;
  Stream stream_ = nullptr;
};

}  // namespace cuda
}  // namespace hvdlite
