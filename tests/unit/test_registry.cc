// BackendRegistry (backends/registry.h): which backend runs a response, and the fusion
// limits the coordinator gets, with fake backends that only answer questions.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backends/registry.h"
#include "check.h"
#include "requests.h"

using namespace hvdlite;
using unit::Limits;

namespace {

class FakeBackend : public Backend {
 public:
  using Rule = std::function<bool(const Response&, std::string*)>;
  FakeBackend(const char* name, DeviceKind kind, FusionLimits limits = FusionLimits{}, Rule rule = nullptr)
      : name_(name), kind_(kind), limits_(limits), rule_(std::move(rule)) {}

  const char* Name() const override { return name_; }
  DeviceKind Device() const override { return kind_; }
  bool Supports(const Response& r, std::string* why_not) const override {
    return rule_ ? rule_(r, why_not) : true;
  }
  FusionLimits Fusion() const override { return limits_; }
  bool TwoLevelPossible() const override { return two_level; }
  void AddStats(BackendStats* stats) const override { stats->huge_page_extents += extents; }
  std::unique_ptr<Completion> Run(CollectiveJob&) override {
    throw std::logic_error("FakeBackend runs nothing");
  }
  void Abort(const std::string& why) override { aborted = why; }

  bool two_level = false;
  int64_t extents = 0;
  std::string aborted;

 private:
  const char* name_;
  DeviceKind kind_;
  FusionLimits limits_;
  Rule rule_;
};

Response ResponseOn(RequestType type, int32_t device, DataType dtype = DataType::kFloat32,
                    const std::string& name = "t") {
  Response r;
  r.type = type;
  r.device = device;
  r.dtype = dtype;
  r.names = {name};
  return r;
}

// Refuses integer tensors with a scale factor, as NCCL's allreduce does.
bool NoScaledIntegers(const Response& r, std::string* why) {
  if (r.dtype == DataType::kInt32 && r.postscale != 1.0) {
    *why = "cannot scale int32";
    return false;
  }
  return true;
}

}  // namespace

TEST(registry_host_response_goes_to_host_backend) {
  Config config{Parameters{}};
  BackendRegistry reg(&config);
  Backend* nccl = reg.Add(std::make_unique<FakeBackend>("NCCL", DeviceKind::kCuda));
  Backend* mpi = reg.Add(std::make_unique<FakeBackend>("MPI", DeviceKind::kHost));
  std::string error;
  CHECK_EQ(reg.Select(ResponseOn(RequestType::kAllreduce, kCpuDevice), &error), mpi);
  CHECK_EQ(reg.Select(ResponseOn(RequestType::kAllreduce, 0), &error), nccl);
  CHECK_EQ(error, "");
}

TEST(registry_prefers_gpu_backend_per_request_type) {
  Parameters p;
  p.gpu_backend[static_cast<int>(RequestType::kAllgather)] = "MPI";  // HOROVOD_GPU_ALLGATHER=MPI
  Config config(p);
  BackendRegistry reg(&config);
  Backend* nccl = reg.Add(std::make_unique<FakeBackend>("NCCL", DeviceKind::kCuda));
  Backend* staged = reg.Add(std::make_unique<FakeBackend>("MPI", DeviceKind::kCuda));
  reg.Add(std::make_unique<FakeBackend>("MPI-host", DeviceKind::kHost));
  std::string error;
  CHECK_EQ(reg.Select(ResponseOn(RequestType::kAllreduce, 1), &error), nccl);
  CHECK_EQ(reg.Select(ResponseOn(RequestType::kAllgather, 1), &error), staged);
  CHECK_EQ(reg.Select(ResponseOn(RequestType::kBroadcast, 1), &error), nccl);
}

TEST(registry_preference_does_not_depend_on_order_added) {
  Parameters p;
  for (auto& b : p.gpu_backend) b = "MPI";  // HOROVOD_GPU_OPERATIONS=MPI
  Config config(p);
  BackendRegistry reg(&config);
  Backend* nccl = reg.Add(std::make_unique<FakeBackend>("NCCL", DeviceKind::kCuda));
  Backend* staged = reg.Add(std::make_unique<FakeBackend>("MPI", DeviceKind::kCuda));
  std::string error;
  CHECK_EQ(reg.Select(ResponseOn(RequestType::kAllreduce, 0), &error), staged);
  CHECK(nccl != staged);
}

TEST(registry_falls_back_to_next_that_supports) {
  Config config{Parameters{}};
  BackendRegistry reg(&config);
  Backend* nccl = reg.Add(std::make_unique<FakeBackend>("NCCL", DeviceKind::kCuda, FusionLimits{}, NoScaledIntegers));
  Backend* staged = reg.Add(std::make_unique<FakeBackend>("MPI", DeviceKind::kCuda));
  Response scaled = ResponseOn(RequestType::kAllreduce, 0, DataType::kInt32);
  scaled.postscale = 0.5;
  std::string error;
  CHECK_EQ(reg.Select(scaled, &error), staged);
  CHECK_EQ(reg.Select(ResponseOn(RequestType::kAllreduce, 0, DataType::kInt32), &error), nccl);
}

TEST(registry_error_names_every_refusal) {
  Config config{Parameters{}};
  BackendRegistry reg(&config);
  reg.Add(std::make_unique<FakeBackend>("NCCL", DeviceKind::kCuda, FusionLimits{}, NoScaledIntegers));
  reg.Add(std::make_unique<FakeBackend>("MPI", DeviceKind::kCuda, FusionLimits{},
                                        [](const Response&, std::string* why) {
                                          *why = "no host staging here";
                                          return false;
                                        }));
  reg.Add(std::make_unique<FakeBackend>("MPI-host", DeviceKind::kHost));
  Response scaled = ResponseOn(RequestType::kAllreduce, 0, DataType::kInt32, "grad.w");
  scaled.postscale = 0.5;
  std::string error;
  CHECK(reg.Select(scaled, &error) == nullptr);
  CHECK_EQ(error,
           "allreduce 'grad.w': no backend for CUDA memory can run it "
           "(NCCL: cannot scale int32; MPI: no host staging here)");
}

TEST(registry_error_without_any_backend_of_the_kind) {
  Config config{Parameters{}};
  BackendRegistry reg(&config);
  reg.Add(std::make_unique<FakeBackend>("MPI", DeviceKind::kHost));
  std::string error;
  CHECK(reg.Select(ResponseOn(RequestType::kBroadcast, 2, DataType::kFloat32, "w"), &error) == nullptr);
  CHECK_EQ(error, "broadcast 'w': no backend for CUDA memory can run it");
}

TEST(registry_fusion_capped_by_threshold_and_follows_apply) {
  Parameters p;
  p.fusion_threshold_bytes = 1 << 20;
  Config config(p);
  BackendRegistry reg(&config);
  reg.Add(std::make_unique<FakeBackend>("MPI", DeviceKind::kHost,
                                        Limits(64 << 20, /*allgather_tensor=*/4096, 8 << 20, 32 << 20)));
  reg.Add(std::make_unique<FakeBackend>("NCCL", DeviceKind::kCuda, Limits(256 << 10, 1024, 512 << 10, 0)));
  FusionLimits host = reg.Fusion(DeviceKind::kHost);
  CHECK_EQ(host.allreduce_bytes, 1 << 20);
  CHECK_EQ(host.allgather_tensor_bytes, 4096);  // a per-tensor size, not capped
  CHECK_EQ(host.allgather_bytes, 1 << 20);
  CHECK_EQ(host.reducescatter_bytes, 1 << 20);
  FusionLimits cuda = reg.Fusion(DeviceKind::kCuda);
  CHECK_EQ(cuda.allreduce_bytes, 256 << 10);  // the backend's own limit is lower
  CHECK_EQ(cuda.allgather_bytes, 512 << 10);
  CHECK_EQ(cuda.reducescatter_bytes, 0);
  // The autotuner lowers the threshold: every limit follows.
  Tunables t = config.tunables();
  t.fusion_threshold_bytes = 100 << 10;
  config.Apply(t);
  CHECK_EQ(reg.Fusion(DeviceKind::kHost).allreduce_bytes, 100 << 10);
  CHECK_EQ(reg.Fusion(DeviceKind::kHost).reducescatter_bytes, 100 << 10);
  CHECK_EQ(reg.Fusion(DeviceKind::kCuda).allreduce_bytes, 100 << 10);
  CHECK_EQ(reg.Fusion(DeviceKind::kCuda).allgather_bytes, 100 << 10);
  t.fusion_threshold_bytes = 0;  // HOROVOD_FUSION_THRESHOLD=0: no fusion
  config.Apply(t);
  CHECK_EQ(reg.Fusion(DeviceKind::kHost).allreduce_bytes, 0);
}

TEST(registry_fusion_from_preferred_backend) {
  Parameters p;
  p.gpu_backend[static_cast<int>(RequestType::kAllreduce)] = "MPI";
  Config config(p);
  BackendRegistry reg(&config);
  reg.Add(std::make_unique<FakeBackend>("NCCL", DeviceKind::kCuda, Limits(8 << 20, 0, 0, 8 << 20)));
  reg.Add(std::make_unique<FakeBackend>("MPI", DeviceKind::kCuda, Limits(2 << 20, 0, 0, 3 << 20)));
  FusionLimits cuda = reg.Fusion(DeviceKind::kCuda);
  CHECK_EQ(cuda.allreduce_bytes, 2 << 20);      // the allreduce backend's
  CHECK_EQ(cuda.reducescatter_bytes, 8 << 20);  // the reducescatter backend's (NCCL preferred)
  CHECK_EQ(reg.Fusion(DeviceKind::kHost).allreduce_bytes, 0);  // no host backend
}

TEST(registry_two_level_stats_and_abort_aggregate) {
  Config config{Parameters{}};
  BackendRegistry reg(&config);
  auto a = std::make_unique<FakeBackend>("MPI", DeviceKind::kHost);
  auto b = std::make_unique<FakeBackend>("NCCL", DeviceKind::kCuda);
  FakeBackend* pa = a.get();
  FakeBackend* pb = b.get();
  reg.Add(std::move(a));
  reg.Add(std::move(b));
  CHECK(!reg.TwoLevelPossible());
  pb->two_level = true;
  CHECK(reg.TwoLevelPossible());
  pa->extents = 3;
  pb->extents = 4;
  CHECK_EQ(reg.Stats().huge_page_extents, 7);
  reg.AbortAll("peer lost");
  CHECK_EQ(pa->aborted, "peer lost");
  CHECK_EQ(pb->aborted, "peer lost");
  CHECK_EQ(reg.backends().size(), 2u);
}
