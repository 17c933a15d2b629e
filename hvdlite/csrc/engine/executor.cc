#include "engine/executor.h"

#include <chrono>
#include <cstring>
#include <thread>

#include "common/logging.h"
#include "kernels/reduce.h"
#include "mpi/errors.h"

namespace hvdlite {
namespace {

// "allreduce 'a' (fused with 3 more)": a response of `n` tensors, for messages.
std::string FusedLabel(RequestType type, const std::string& first, size_t n) {
  return RequestLabel(type, first) + (n > 1 ? " (fused with " + std::to_string(n - 1) + " more)" : std::string());
}

}  // namespace

Executor::Executor(std::unique_ptr<BackendRegistry> registry, Config* config, TensorQueue* queue,
                   HandleTable* handles, Timeline* timeline, GpuContext* gpus, int rank, int size)
    : registry_(std::move(registry)), config_(config), queue_(queue), handles_(handles), timeline_(timeline),
      gpus_(gpus), rank_(rank), size_(size) {
  TunablesChanged();
}

void Executor::TunablesChanged() {
  config_->SetFusion(registry_->Fusion(DeviceKind::kHost), registry_->Fusion(DeviceKind::kCuda));
}

std::string Executor::PrepareGpuRequest(TensorEntry& e, std::optional<uintptr_t> stream) {
  const int device = e.request.device;
  int expected = -1;
  if (!gpu_device_.compare_exchange_strong(expected, device) && expected != device)
    return "the tensor is on GPU " + std::to_string(device) + ", but this process already drives GPU " +
           std::to_string(expected) + "; hvdlite drives one GPU per process (pin it first, e.g. "
           "torch.cuda.set_device(hvd.local_rank()))";
  try {
    GpuContext::Device& d = gpus_->Get(device);
    if (stream) {
      cuda::DeviceGuard guard(d.rt, device);
      e.produced = d.events->Record(reinterpret_cast<cuda::Stream>(*stream));
    }
  } catch (const std::exception& ex) {
    return ex.what();
  }
  return "";
}

std::shared_ptr<DeviceAllocation> Executor::AllocateDevice(int device, int64_t bytes) {
  GpuContext::Device& d = gpus_->Get(device);
  return std::make_shared<cuda::StreamMemory>(d.events, d.stream, bytes);
}

void Executor::CopyOnDevice(int device, void* dst, const void* src, int64_t bytes, std::optional<uintptr_t> after) {
  GpuContext::Device& d = gpus_->Get(device);
  cuda::DeviceGuard guard(d.rt, device);
  const uintptr_t ours = reinterpret_cast<uintptr_t>(d.stream->get());
  if (after) d.events->Record(reinterpret_cast<cuda::Stream>(*after))->OrderBefore(ours);
  if (bytes > 0)
    d.rt.Check(d.rt.api().MemcpyAsync(dst, src, static_cast<size_t>(bytes), cuda::kDeviceToDevice, d.stream->get()),
               "cudaMemcpyAsync");
}

// A tensor the cycle carried and reduced (CacheCycle::CanCarry): a lone Sum or Average
// allreduce in host memory, summed over every rank already. What is left, the scaling
// and the copy out, is the same whichever backend would have run it, so it is done
// here, without building a response for it.
void Executor::RunCarried(const Request& sig, const void* sum) {
  TensorEntry e;
  if (!queue_->Pop(sig.name, &e)) return;
  const int64_t count = NumElements(sig.shape);
  const int64_t bytes = count * DataTypeSize(sig.dtype);
  if (hooks_.ran) hooks_.ran({sig.name}, bytes);
  const bool traced = timeline_->Active();
  const int64_t start = traced ? NowMicros() : 0;
  if (traced) timeline_->Phase(sig.name, "QUEUE", e.enqueue_us, start);
  const double post = PostFactor(sig.postscale, sig.reduce_op, size_);
  if (post != 1.0) ScaleCopy(e.output, sum, count, sig.dtype, post);
  else std::memcpy(e.output, sum, static_cast<size_t>(bytes));
  if (traced) timeline_->Phase(sig.name, "CYCLE_ALLREDUCE", start, NowMicros());
  ++carried_;  // before the handle completes: a caller who sees the result sees it counted
  handles_->Complete(e.handle, true, "");
}

void Executor::Run(const Response& r) {
  const size_t n = r.type == RequestType::kJoin ? 1 : r.names.size();
  HVD_LOG(0, RequestTypeName(r.type) << " of " << n << " tensor(s), first '" << (r.names.empty() ? "" : r.names[0])
                                     << "'" << (r.error.empty() ? "" : ", failing: " + r.error));
  std::vector<TensorEntry> entries(n);
  std::vector<char> have(n, 0);
  for (size_t i = 0; i < n; ++i)
    have[i] = queue_->Pop(r.type == RequestType::kJoin ? std::string("\x01join") : r.names[i], &entries[i]);

  auto fail_all = [&](const std::string& message) {
    std::vector<HandleTable::Result> results;
    for (size_t i = 0; i < n; ++i)
      if (have[i]) results.push_back({entries[i].handle, false, message, nullptr, nullptr});
    handles_->CompleteAll(std::move(results));
  };
  if (!r.error.empty()) {
    fail_all(r.error);
    return;
  }
  if (hooks_.ran) {
    int64_t bytes = 0;
    for (size_t i = 0; i < n; ++i)
      if (have[i]) bytes += NumElements(entries[i].request.shape) * DataTypeSize(entries[i].request.dtype);
    hooks_.ran(r.names, bytes);
  }
  if (timeline_->Active()) {
    const int64_t now = NowMicros();
    for (size_t i = 0; i < n; ++i)
      if (have[i]) timeline_->Phase(entries[i].request.name, "QUEUE", entries[i].enqueue_us, now);
  }
  switch (r.type) {
    case RequestType::kBarrier:
      // Negotiation already proved that every rank reached the barrier.
      if (have[0]) handles_->Complete(entries[0].handle, true, "");
      return;
    case RequestType::kJoin: {
      if (!have[0]) return;
      auto out = std::make_unique<OutputBuffer>();
      out->aux = {r.last_joined};
      handles_->Complete(entries[0].handle, true, "", std::move(out));
      return;
    }
    default:
      break;
  }

  // For messages only: built when one is needed.
  auto label = [&] { return FusedLabel(r.type, r.names[0], n); };
  std::string why;
  Backend* backend = registry_->Select(r, &why);
  if (!backend) {
    fail_all(why);
    return;
  }
  int32_t device = kCpuDevice;
  if (KindOfDevice(r.device) == DeviceKind::kCuda) {
    device = gpu_device_ >= 0 ? gpu_device_.load() : 0;  // a joined rank: the GPU it drives
    for (size_t i = 0; i < n; ++i)
      if (have[i]) device = entries[i].request.device;
  }
  Tracer tracer(timeline_);
  CollectiveJob job{r, entries, have, tracer, {}, device};
  std::unique_ptr<Completion> completion;
  try {
    completion = backend->Run(job);
  } catch (const PeerFailure& ex) {
    fail_all(label() + " failed on rank " + std::to_string(rank_) + ": a peer process failed (" + ex.what() + ")");
    throw;  // the engine stops (Engine::OnPeerFailure)
  } catch (const FailedOnEveryRank& ex) {
    fail_all(label() + " failed (" + backend->Name() + " backend, " + DeviceLabel(device) + "): " + ex.what());
    return;
  } catch (const std::exception& ex) {
    const std::string message = label() + " failed on rank " + std::to_string(rank_) + " (" + backend->Name() +
                                " backend, " + DeviceLabel(device) + "): " + ex.what();
    fail_all(message);
    // The peers have queued their part on their GPUs and would wait for this rank's
    // forever: the job stops everywhere, with this reason.
    if (backend->Device() != DeviceKind::kHost && hooks_.fail) hooks_.fail(message);
    return;
  }
  std::shared_ptr<ReadyEvent> ready = completion ? completion->Ready() : nullptr;
  std::vector<HandleTable::Result> results;
  results.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (!have[i]) continue;
    std::unique_ptr<OutputBuffer> out = i < job.outputs.size() ? std::move(job.outputs[i]) : nullptr;
    results.push_back({entries[i].handle, true, "", std::move(out), ready});
  }
  handles_->CompleteAll(std::move(results));
  if (completion) {
    // Its label is made only for a message (InFlight_::Label): the first tensor's name
    // is moved out of the entry, which is done with.
    size_t first = 0;
    while (first + 1 < n && !have[first]) ++first;
    in_flight_.push_back(InFlight_{std::move(completion), r.type, std::move(entries[first].request.name), n,
                                   NowMicros()});
    ++in_flight_count_;
    ++device_collectives_;
  }
}

std::string Executor::InFlight_::Label() const { return FusedLabel(type, name, tensors); }

bool Executor::PollInFlight() {
  bool progress = false;
  const int64_t now = NowMicros();
  const double limit_s = config_->job().stall_shutdown_seconds;
  const int64_t limit_us = static_cast<int64_t>(limit_s * 1e6);
  // The work runs in the order it was queued (one stream per GPU, and one GPU per
  // process): the first one not finished is the oldest, and those after it are not
  // finished either, so polling stops there.
  while (!in_flight_.empty()) {
    InFlight_& first = in_flight_.front();
    if (!first.completion->Done()) {
      if (limit_us > 0 && now - first.start_us > limit_us && hooks_.fail && !hooks_.shutting_down())
        hooks_.fail(first.Label() + " did not finish on the GPU within " +
                    std::to_string(static_cast<int64_t>(limit_s)) + " s on rank " + std::to_string(rank_) +
                    " (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS): a peer died or stopped taking part; NCCL was aborted");
      break;
    }
    const std::string error = first.completion->Error();
    if (!error.empty() && hooks_.fail)
      hooks_.fail(first.Label() + " failed on rank " + std::to_string(rank_) + ": " + error);
    in_flight_.pop_front();
    --in_flight_count_;
    progress = true;
  }
  return progress;
}

void Executor::DrainInFlight() {
  const double limit_s = config_->job().stall_shutdown_seconds > 0 ? config_->job().stall_shutdown_seconds : 30.0;
  const int64_t abort_at = NowMicros() + static_cast<int64_t>(limit_s * 1e6);
  bool aborted = false;
  while (!in_flight_.empty()) {
    if (PollInFlight()) continue;
    const int64_t now = NowMicros();
    if (!aborted && now > abort_at) {
      registry_->AbortAll("device work still queued " + std::to_string(static_cast<int64_t>(limit_s)) +
                          " s after shutdown");
      aborted = true;
    } else if (aborted && now > abort_at + 2000000) {
      HVD_WARN("giving up on " << in_flight_.size() << " GPU collective(s) that never finished, first: "
                               << in_flight_.front().Label());
      in_flight_.clear();
      in_flight_count_ = 0;
      break;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

}  // namespace hvdlite
