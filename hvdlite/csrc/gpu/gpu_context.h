// hvdlite's own resources on each GPU it uses: a stream that all of its device work is
// ordered on, a pool of events, and the device fusion buffer. Shared by the GPU
// backends (NCCL, and MPI through host memory) and by the engine, which records the
// producer's event when a GPU tensor is enqueued. Made on first use of a device.
#pragma once

#include <map>
#include <memory>
#include <mutex>

#include "gpu/cuda_runtime.h"

namespace hvdlite {

class GpuContext {
 public:
  struct Device {
    Device(cuda::Runtime& rt, int index);
    cuda::Runtime& rt;
    int index;
    // Shared with the results allocated on it (cuda::StreamMemory), which may outlive
    // the engine.
    std::shared_ptr<cuda::OwnStream> stream;
    std::shared_ptr<cuda::EventPool> events;
    cuda::DeviceBuffer fusion;   // packed tensors of a fused response
    cuda::DeviceBuffer scratch;  // zeros of a joined rank, padding
  };

  // The device's resources, made on first use (thread-safe). Throws
  // std::runtime_error if the CUDA runtime cannot be loaded or the device is invalid.
  Device& Get(int device);

 private:
  std::mutex mu_;
  std::map<int, std::unique_ptr<Device>> devices_;
};

}  // namespace hvdlite
