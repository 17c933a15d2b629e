#include "gpu/gpu_context.h"

#include <stdexcept>
#include <string>

namespace hvdlite {

GpuContext::Device::Device(cuda::Runtime& runtime, int i)
    : rt(runtime), index(i), stream(std::make_shared<cuda::OwnStream>(runtime, i)), events(std::make_shared<cuda::EventPool>(runtime, i)),
      fusion(runtime, i), scratch(runtime, i) {}

GpuContext::Device& GpuContext::Get(int device) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = devices_.find(device);
  if (it != devices_.end()) return *it->second;
  cuda::Runtime& rt = cuda::Runtime::Get();
  const int count = rt.device_count();
  if (device < 0 || device >= count)
    throw std::runtime_error("GPU " + std::to_string(device) + " does not exist (this process sees " +
                             std::to_string(count) + " CUDA device(s))");
  auto d = std::make_unique<Device>(rt, device);
  Device& ref = *d;
  devices_.emplace(device, std::move(d));
  return ref;
}

}  // namespace hvdlite
