#include "backends/staged/host_staged_backend.h"

#include <stdexcept>

#include "backends/mpi/mpi_backend.h"

namespace hvdlite {
namespace {

// The copies back to the device read host memory after Run returns: keep it until the
// event after them fires.
class StagedCompletion : public Completion {
 public:
  StagedCompletion(std::shared_ptr<ReadyEvent> ready, std::vector<std::vector<uint8_t>> staged,
                   std::vector<std::unique_ptr<OutputBuffer>> host_outputs)
      : ready_(std::move(ready)), staged_(std::move(staged)), host_outputs_(std::move(host_outputs)) {}
  bool Done() override {
    if (done_) return true;
    try {
      done_ = ready_->Query();
    } catch (const std::exception& ex) {
      error_ = ex.what();
      done_ = true;
    }
    if (done_) {
      staged_.clear();
      host_outputs_.clear();
    }
    return done_;
  }
  std::string Error() override { return error_; }
  std::shared_ptr<ReadyEvent> Ready() override { return ready_; }

 private:
  std::shared_ptr<ReadyEvent> ready_;
  std::vector<std::vector<uint8_t>> staged_;
  std::vector<std::unique_ptr<OutputBuffer>> host_outputs_;
  bool done_ = false;
  std::string error_;
};

// Bytes of this rank's input for a response.
int64_t InputBytes(const Response& r, const TensorEntry& e, size_t i) {
  if (r.type == RequestType::kAllreduce || r.type == RequestType::kBroadcast)
    return r.sizes[i] * DataTypeSize(r.dtype);
  return NumElements(e.request.shape) * DataTypeSize(e.request.dtype);
}

}  // namespace

bool HostStagedBackend::Supports(const Response& r, std::string* why_not) const {
  if (KindOfDevice(r.device) != DeviceKind::kCuda) {
    *why_not = "the host-staged backend takes GPU memory";
    return false;
  }
  return true;
}

FusionLimits HostStagedBackend::Fusion() const { return mpi_->Fusion(); }

std::unique_ptr<Completion> HostStagedBackend::Run(CollectiveJob& job) {
  const Response& r = job.response;
  GpuContext::Device& d = gpus_->Get(job.device);
  cuda::DeviceGuard guard(d.rt, d.index);
  cuda::Stream s = d.stream->get();
  const auto& api = d.rt.api();
  const size_t n = job.entries.size();
  for (size_t i = 0; i < n; ++i)
    if (job.have[i] && job.entries[i].produced) job.entries[i].produced->OrderBefore(reinterpret_cast<uintptr_t>(s));

  const int64_t t0 = NowMicros();
  std::vector<std::vector<uint8_t>> staged(n);
  for (size_t i = 0; i < n; ++i) {
    if (!job.have[i]) continue;
    staged[i].resize(static_cast<size_t>(InputBytes(r, job.entries[i], i)));
    if (!staged[i].empty())
      d.rt.Check(api.MemcpyAsync(staged[i].data(), job.entries[i].input, staged[i].size(), cuda::kDeviceToHost, s),
                 "cudaMemcpyAsync");
  }
  d.rt.Check(api.StreamSynchronize(s), "cudaStreamSynchronize");
  if (job.trace.Active())
    for (size_t i = 0; i < n; ++i)
      if (job.have[i]) job.trace.Phase(r.names[i], "MEMCPY_DEVICE_TO_HOST", t0, NowMicros());

  // The same response on host copies, reduced in place there.
  std::vector<TensorEntry> host = job.entries;
  for (size_t i = 0; i < n; ++i) {
    if (!job.have[i]) continue;
    host[i].input = staged[i].data();
    host[i].output = r.type == RequestType::kBroadcast ? nullptr : staged[i].data();
    host[i].produced = nullptr;
  }
  Response host_r = r;
  host_r.device = kCpuDevice;
  CollectiveJob host_job{host_r, host, job.have, job.trace, {}, kCpuDevice};
  mpi_->Run(host_job);

  const int64_t t1 = NowMicros();
  if (r.type == RequestType::kAllreduce || r.type == RequestType::kBroadcast) {
    for (size_t i = 0; i < n; ++i) {
      if (!job.have[i] || staged[i].empty()) continue;
      void* dst = job.entries[i].output ? job.entries[i].output : const_cast<void*>(job.entries[i].input);
      d.rt.Check(api.MemcpyAsync(dst, staged[i].data(), staged[i].size(), cuda::kHostToDevice, s), "cudaMemcpyAsync");
    }
  }
  job.outputs.resize(host_job.outputs.size());
  for (size_t i = 0; i < host_job.outputs.size(); ++i) {
    const OutputBuffer* h = host_job.outputs[i].get();
    if (!h) continue;
    auto out = std::make_unique<OutputBuffer>();
    out->device_data = std::make_shared<cuda::StreamMemory>(d.events, d.stream, h->bytes);
    out->device = d.index;
    out->bytes = h->bytes;
    out->dtype = h->dtype;
    out->shape = h->shape;
    out->aux = h->aux;
    if (h->bytes > 0)
      d.rt.Check(api.MemcpyAsync(out->device_data->data(), h->data.get(), static_cast<size_t>(h->bytes),
                                 cuda::kHostToDevice, s),
                 "cudaMemcpyAsync");
    job.outputs[i] = std::move(out);
  }
  if (job.trace.Active())
    for (size_t i = 0; i < n; ++i)
      if (job.have[i]) job.trace.Phase(r.names[i], "MEMCPY_HOST_TO_DEVICE", t1, NowMicros());
  return std::make_unique<StagedCompletion>(d.events->Record(s), std::move(staged), std::move(host_job.outputs));
}

}  // namespace hvdlite
