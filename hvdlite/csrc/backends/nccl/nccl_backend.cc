#include "backends/nccl/nccl_backend.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "backends/layout.h"
#include "backends/mpi/mpi_collectives.h"
#include "common/half.h"
#include "common/logging.h"
#include "transport/control_transport.h"

namespace hvdlite {
namespace {

// The first NCCL whose one-rank reductions scale every element (NVIDIA/nccl#1950).
constexpr int kOneRankScalingFixed = 22907;

nccl::DataType NcclType(DataType dt) {
  switch (dt) {
    case DataType::kUInt8: return nccl::kUint8;
    case DataType::kInt8: return nccl::kInt8;
    case DataType::kInt32: return nccl::kInt32;
    case DataType::kInt64: return nccl::kInt64;
    case DataType::kFloat16: return nccl::kFloat16;
    case DataType::kBFloat16: return nccl::kBfloat16;
    case DataType::kFloat32: return nccl::kFloat32;
    case DataType::kFloat64: return nccl::kFloat64;
  }
  throw std::runtime_error("no NCCL type for " + std::string(DataTypeName(dt)));
}

bool IsFloat(DataType dt) {
  return dt == DataType::kFloat16 || dt == DataType::kBFloat16 || dt == DataType::kFloat32 || dt == DataType::kFloat64;
}

// Device work of one response: done when its event fires, failed if one of the
// communicators it ran on reports an asynchronous error first. Records the collective's
// phase in the timeline when it sees the work finish, and the phases of its steps
// (two-level allreduce): a step whose end the host did not see when it was queued ends
// when this completion first sees its event fired, so its end is as exact as the polling.
class NcclCompletion : public Completion {
 public:
  struct Step {
    const char* phase;
    int64_t start_us = -1;  // -1: when the step before it ended
    int64_t end_us = -1;    // -1: when `done` is first seen fired (or the whole work ends)
    std::shared_ptr<ReadyEvent> done;
  };
  NcclCompletion(std::shared_ptr<ReadyEvent> ready, const nccl::Library* lib, NcclBackend::CommList comms,
                 std::vector<std::string> names, const char* phase, int64_t start_us, const Tracer& trace,
                 std::vector<Step> steps = {})
      : ready_(std::move(ready)), lib_(lib), comms_(std::move(comms)), names_(std::move(names)), phase_(phase),
        start_us_(start_us), trace_(trace), steps_(std::move(steps)) {}

  bool Done() override {
    if (done_) return true;
    bool fired = false;
    try {
      if (trace_.Active()) StampSteps();
      fired = ready_->Query();
    } catch (const std::exception& ex) {
      error_ = ex.what();
      done_ = true;
    }
    // A failed communicator can let the stream run on past the work it skipped, so
    // finished work is checked for asynchronous errors once, when it is first seen
    // finished. Work still queued (held up by a failed peer, perhaps) is checked at most
    // once a millisecond: the engine polls far more often than that.
    if (!done_) {
      if ((fired || ErrorCheckDue()) && FindAsyncError()) return done_ = true;
      done_ = fired;
    }
    if (done_ && error_.empty() && trace_.Active()) {
      const int64_t now = NowMicros();
      for (const std::string& n : names_) {
        trace_.Phase(n, phase_, start_us_, now);
        int64_t at = start_us_;
        for (const Step& st : steps_) {
          const int64_t begin = st.start_us >= 0 ? st.start_us : at;
          const int64_t end = st.end_us >= 0 ? st.end_us : now;
          trace_.Phase(n, st.phase, begin, end);
          at = end;
        }
      }
    }
    return done_;
  }
  std::string Error() override { return error_; }
  std::shared_ptr<ReadyEvent> Ready() override { return ready_; }

 private:
  // Work still queued: whether a millisecond has passed since its errors were last asked for.
  bool ErrorCheckDue() {
    const int64_t now = NowMicros();
    if (now - errors_checked_us_ < kErrorCheckMicros) return false;
    errors_checked_us_ = now;
    return true;
  }

  // Whether a communicator of the device reports an asynchronous error (then in error_).
  bool FindAsyncError() {
    for (nccl::Comm comm : *comms_) {
      nccl::Result async = nccl::kSuccess;
      if (lib_->api().CommGetAsyncError(comm, &async) != nccl::kSuccess ||
          (async != nccl::kSuccess && async != nccl::kInProgress)) {
        error_ = "NCCL reported an asynchronous error: " + lib_->ErrorString(async, comm);
        return true;
      }
    }
    return false;
  }

  // Steps end in order: stop at the first one still running.
  void StampSteps() {
    for (Step& st : steps_) {
      if (st.end_us >= 0) continue;
      if (!st.done || !st.done->Query()) return;
      st.end_us = NowMicros();
      st.done.reset();
    }
  }

  std::shared_ptr<ReadyEvent> ready_;
  const nccl::Library* lib_;
  NcclBackend::CommList comms_;
  std::vector<std::string> names_;  // for the timeline: empty when it was not recording
  const char* phase_;
  int64_t start_us_;
  Tracer trace_;
  std::vector<Step> steps_;
  bool done_ = false;
  std::string error_;
  static constexpr int64_t kErrorCheckMicros = 1000;
  int64_t errors_checked_us_ = std::numeric_limits<int64_t>::min() / 2;  // never yet
};

// A stream-ordered device allocation handed out as a result.
std::unique_ptr<OutputBuffer> DeviceOutput(GpuContext::Device& d, int64_t bytes, DataType dt,
                                           std::vector<int64_t> shape) {
  auto out = std::make_unique<OutputBuffer>();
  out->device_data = std::make_shared<cuda::StreamMemory>(d.events, d.stream, bytes);
  out->device = d.index;
  out->bytes = bytes;
  out->dtype = dt;
  out->shape = std::move(shape);
  return out;
}

}  // namespace

NcclBackend::NcclBackend(ControlTransport* channel, GpuContext* gpus, const Topology& topology,
                         const Config* config)
    : channel_(channel), gpus_(gpus), topology_(topology), config_(config), params_(config->job()), rank_(topology.rank()),
      size_(topology.size()) {
  // Two levels only where each level has something to do and every host has the same
  // share: the reduce-scatter inside a host cuts the buffer into local_size shards, and
  // the ranks holding the same shard on every host must all exist.
  if (params_.two_level.allreduce != 1) return;
  if (topology.cross_size() <= 1) two_level_why_not_ = "the job runs on one host";
  else if (!topology.homogeneous())
    two_level_why_not_ = "the hosts run different numbers of ranks, and the two-level allreduce needs the same "
                         "number on every host";
  else if (topology.local_size() <= 1) two_level_why_not_ = "every host runs one rank, so there is no level inside a host";
  two_level_ = two_level_why_not_.empty();
  if (two_level_ && params_.two_level.gpu_cross_nccl == 0)
    cross_mpi_ = std::make_unique<MpiCollectives>(topology.cross(), params_.ring_min_segment_bytes);
}

NcclBackend::~NcclBackend() {
  std::lock_guard<std::mutex> lk(mu_);
  // The cross and local communicators first, then the world's: each Destroy waits for
  // its communicator's queued work.
  for (auto it = comms_.rbegin(); it != comms_.rend(); ++it) {
    const int device = it->first.first;
    Communicator& c = it->second;
    if (!c.comm) continue;
    try {
      cuda::DeviceGuard guard(cuda::Runtime::Get(), device);
      // An aborted one is gone already.
      if (!c.aborted) lib_->api().CommDestroy(c.comm);
    } catch (const std::exception& ex) {
      HVD_WARN("destroying the " << ScopeName(it->first.second) << " of GPU " << device << ": "
                                 << ex.what());
    }
  }
  if (host_shard_) {
    try {
      cuda::Runtime& rt = cuda::Runtime::Get();
      cuda::DeviceGuard guard(rt, host_shard_device_);
      // The last copy back from it may still be queued.
      rt.api().StreamSynchronize(gpus_->Get(host_shard_device_).stream->get());
      rt.api().FreeHost(host_shard_);
    } catch (const std::exception& ex) {
      HVD_WARN("freeing the host buffer of the two-level allreduce: " << ex.what());
    }
  }
}

const char* NcclBackend::ScopeName(int scope) {
  switch (scope) {
    case kLocal: return "local NCCL communicator (this host's ranks)";
    case kCross: return "cross NCCL communicator (one rank per host)";
    default: return "NCCL communicator";
  }
}

bool NcclBackend::Supports(const Response& r, std::string* why_not) const {
  if (KindOfDevice(r.device) != DeviceKind::kCuda) {
    *why_not = "the NCCL backend takes GPU memory";
    return false;
  }
  if (r.type != RequestType::kAllreduce && r.type != RequestType::kReducescatter) return true;
  if (r.reduce_op == ReduceOp::kAdasum) {
    *why_not = "NCCL has no Adasum";
    return false;
  }
  const bool scaled = r.prescale != 1.0 || r.postscale != 1.0;
  if (!scaled) return true;
  if (size_ == 1) {
    // NCCL before 2.29.7 leaves the last elements of a one-rank reduction that scales
    // (ncclAvg, a PreMulSum) unwritten when their count is not a multiple of its block
    // count (NVIDIA/nccl#1950). One rank has nothing to exchange: host memory does it.
    std::string load_error;
    nccl::Library* lib = nccl::Library::TryGet(&load_error);
    if (!lib || lib->version() < kOneRankScalingFixed) {
      *why_not = "a scale factor on one rank (NCCL before 2.29.7 scales one rank's data incompletely)";
      return false;
    }
  }
  if (r.reduce_op != ReduceOp::kSum && r.reduce_op != ReduceOp::kAverage) {
    *why_not = std::string("a scale factor with ") + ReduceOpName(r.reduce_op) +
               " (NCCL can only scale a sum, and hvdlite has no GPU kernels of its own)";
    return false;
  }
  if (!IsFloat(r.dtype)) {
    *why_not = std::string("a scale factor on ") + DataTypeName(r.dtype) + " (NCCL scales floating-point sums only)";
    return false;
  }
  return true;
}

FusionLimits NcclBackend::Fusion() const {
  // On a GPU copies are cheap and launches are not: one large buffer, as in Horovod.
  FusionLimits f;
  f.allreduce_bytes = config_->tunables().fusion_threshold_bytes;
  f.allgather_tensor_bytes = config_->tunables().fusion_threshold_bytes;
  f.allgather_bytes = config_->tunables().fusion_threshold_bytes;
  return f;
}

void NcclBackend::Check(nccl::Result r, const char* what, nccl::Comm comm) const {
  if (r == nccl::kSuccess) return;
  throw std::runtime_error(std::string(what) + " failed: " + lib_->ErrorString(r, comm));
}

nccl::Comm NcclBackend::CommFor(int device) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = comms_.find({device, kWorld});
    if (it != comms_.end()) {
      if (it->second.aborted)
        throw std::runtime_error("the NCCL communicator of GPU " + std::to_string(device) +
                                 " was aborted after an earlier failure");
      return it->second.comm;
    }
  }
  // Every rank reaches this point for the same response. First agree that every rank
  // can load NCCL, so that nobody waits in ncclCommInitRank for a rank that never comes.
  std::string why;
  nccl::Library* lib = nccl::Library::TryGet(&why);
  const std::vector<std::string> notes = channel_->GatherNotes(lib ? std::string() : why);
  std::string missing;
  for (int r = 0; r < size_; ++r)
    if (!notes[r].empty()) missing += "\nrank " + std::to_string(r) + ": " + notes[r];
  if (!missing.empty()) throw FailedOnEveryRank("NCCL cannot be loaded on every rank:" + missing);
  lib_ = lib;

  struct Shared {
    int32_t ok;
    char why[480];
    nccl::UniqueId id;
  } shared{};
  if (rank_ == 0) {
    const nccl::Result r = lib_->api().GetUniqueId(&shared.id);
    shared.ok = r == nccl::kSuccess;
    if (!shared.ok) std::snprintf(shared.why, sizeof shared.why, "%s", lib_->ErrorString(r).c_str());
  }
  channel_->Share(&shared, sizeof shared, 0);
  if (!shared.ok) throw FailedOnEveryRank(std::string("ncclGetUniqueId failed on rank 0: ") + shared.why);

  cuda::DeviceGuard guard(cuda::Runtime::Get(), device);
  nccl::Comm comm = nullptr;
  const nccl::Result r = lib_->api().CommInitRank(&comm, size_, shared.id, rank_);
  Check(r, "ncclCommInitRank", nullptr);
  HVD_INFO("NCCL communicator for GPU " << device << " ready (" << size_ << " ranks, NCCL "
                                        << lib_->VersionString() << ")");
  AddComm(device, kWorld, comm);
  return comm;
}

// Called right after CommFor, by every rank for the same response in the same order, so
// the broadcasts inside each host and across them match. Each unique id comes from rank 0
// of its communicator (local rank 0, cross rank 0) over MPI; whether every rank got one
// is then gathered over the world, so a failed ncclGetUniqueId on any host is an error
// on every rank, before anyone waits in ncclCommInitRank.
NcclBackend::LevelComms NcclBackend::LevelCommsFor(int device) {
  const bool nccl_cross = params_.two_level.gpu_cross_nccl != 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto local = comms_.find({device, kLocal});
    if (local != comms_.end()) {
      auto cross = comms_.find({device, kCross});
      const bool aborted = local->second.aborted || (cross != comms_.end() && cross->second.aborted);
      if (aborted)
        throw std::runtime_error("the two-level NCCL communicators of GPU " + std::to_string(device) +
                                 " were aborted after an earlier failure");
      if (!nccl_cross || cross != comms_.end())
        return LevelComms{local->second.comm, cross != comms_.end() ? cross->second.comm : nullptr};
    }
  }
  struct Shared {
    int32_t ok;
    char why[480];
    nccl::UniqueId id;
  };
  std::string failure;
  // Every rank takes part in both broadcasts, failed or not, so that none waits alone.
  auto share = [&](MPI_Comm comm, int my_rank, const char* which) {
    Shared shared{};
    if (my_rank == 0) {
      const nccl::Result r = lib_->api().GetUniqueId(&shared.id);
      shared.ok = r == nccl::kSuccess;
      if (!shared.ok) std::snprintf(shared.why, sizeof shared.why, "%s", lib_->ErrorString(r).c_str());
    }
    const int rc = MPI_Bcast(&shared, static_cast<int>(sizeof shared), MPI_BYTE, 0, comm);
    if (!failure.empty()) return shared.id;
    if (rc != MPI_SUCCESS) failure = std::string("MPI_Bcast of the ") + which + " NCCL unique id failed";
    else if (!shared.ok)
      failure = std::string("ncclGetUniqueId for the ") + which + " communicator failed: " + shared.why;
    return shared.id;
  };
  const nccl::UniqueId local_id = share(topology_.local(), topology_.local_rank(), "local");
  nccl::UniqueId cross_id{};
  if (nccl_cross) cross_id = share(topology_.cross(), topology_.cross_rank(), "cross");
  const std::vector<std::string> notes = channel_->GatherNotes(failure);
  std::string failed;
  for (int r = 0; r < size_; ++r)
    if (!notes[r].empty()) failed += "\nrank " + std::to_string(r) + ": " + notes[r];
  if (!failed.empty())
    throw FailedOnEveryRank("the two-level allreduce's NCCL communicators cannot be made:" + failed);

  cuda::DeviceGuard guard(cuda::Runtime::Get(), device);
  LevelComms lv;
  auto init = [&](int scope, int nranks, const nccl::UniqueId& id, int rank) {
    nccl::Comm comm = nullptr;
    Check(lib_->api().CommInitRank(&comm, nranks, id, rank), "ncclCommInitRank", nullptr);
    AddComm(device, scope, comm);
    return comm;
  };
  lv.local = init(kLocal, topology_.local_size(), local_id, topology_.local_rank());
  if (nccl_cross) lv.cross = init(kCross, topology_.cross_size(), cross_id, topology_.cross_rank());
  HVD_INFO("two-level NCCL communicators for GPU " << device << " ready (" << topology_.local_size()
           << " ranks inside the host; across hosts " << (nccl_cross ? "NCCL" : "MPI") << ", "
           << topology_.cross_size() << " ranks)");
  return lv;
}

NcclBackend::CommList NcclBackend::CommsOf(int device) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = comm_lists_.find(device);
  if (it != comm_lists_.end()) return it->second;
  return std::make_shared<const std::vector<nccl::Comm>>();
}

void NcclBackend::AddComm(int device, int scope, nccl::Comm comm) {
  std::lock_guard<std::mutex> lk(mu_);
  comms_[{device, scope}].comm = comm;
  auto list = std::make_shared<std::vector<nccl::Comm>>();
  for (const auto& [key, c] : comms_)
    if (key.first == device && c.comm) list->push_back(c.comm);
  comm_lists_[device] = std::move(list);
}

// The names of the tensors a completion records in the timeline; none when it is not
// recording (the steady state builds no strings per collective).
std::vector<std::string> NcclBackend::TracedNames(const CollectiveJob& job) {
  std::vector<std::string> names;
  if (!job.trace.Active()) return names;
  for (size_t i = 0; i < job.have.size(); ++i)
    if (job.have[i]) names.push_back(job.response.names[i]);
  return names;
}

void NcclBackend::Abort(const std::string& why) {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& [key, c] : comms_) {
    if (!c.comm || c.aborted) continue;
    HVD_WARN("aborting the " << ScopeName(key.second) << " of GPU " << key.first << ": " << why);
    lib_->api().CommAbort(c.comm);
    c.aborted = true;
  }
}

// The response's tensors one after another at `buf` (a joined rank's as zeros), on the
// device's stream; returns the bytes written.
int64_t NcclBackend::PackFused(CollectiveJob& job, GpuContext::Device& d, uint8_t* buf) {
  const Response& r = job.response;
  const int64_t es = DataTypeSize(r.dtype);
  int64_t off = 0;
  for (size_t i = 0; i < r.names.size(); ++i) {
    const int64_t bytes = r.sizes[i] * es;
    if (job.have[i]) Copy(d, buf + off, job.entries[i].input, bytes);
    else if (bytes > 0)
      d.rt.Check(d.rt.api().MemsetAsync(buf + off, 0, static_cast<size_t>(bytes), d.stream->get()), "cudaMemsetAsync");
    off += bytes;
  }
  return off;
}

// The reverse: each tensor this rank has gets its part of `buf`.
void NcclBackend::UnpackFused(CollectiveJob& job, GpuContext::Device& d, const uint8_t* buf) {
  const Response& r = job.response;
  const int64_t es = DataTypeSize(r.dtype);
  int64_t off = 0;
  for (size_t i = 0; i < r.names.size(); ++i) {
    const int64_t bytes = r.sizes[i] * es;
    if (job.have[i]) Copy(d, job.entries[i].output, buf + off, bytes);
    off += bytes;
  }
}

void NcclBackend::Copy(GpuContext::Device& d, void* dst, const void* src, int64_t bytes) {
  if (bytes <= 0 || dst == src) return;
  d.rt.Check(d.rt.api().MemcpyAsync(dst, src, static_cast<size_t>(bytes), cuda::kDeviceToDevice, d.stream->get()),
             "cudaMemcpyAsync");
}

nccl::RedOp NcclBackend::ReductionFor(const Response& r, nccl::Comm comm, bool* created) {
  *created = false;
  switch (r.reduce_op) {
    case ReduceOp::kMin: return nccl::kMin;
    case ReduceOp::kMax: return nccl::kMax;
    case ReduceOp::kProduct: return nccl::kProd;
    default: break;
  }
  const bool average = r.reduce_op == ReduceOp::kAverage;
  double factor = r.prescale * r.postscale;
  // The average of one rank is its data: ncclSum is a plain copy there, where ncclAvg
  // runs NCCL's one-rank scaling kernel (see Supports on its flaw before 2.29.7).
  if (factor == 1.0) return average && size_ > 1 ? nccl::kAvg : nccl::kSum;
  if (average) factor /= size_;
  // Scaling each rank's input before the sum: the result is the scaled sum (with one
  // rounding per input instead of one at the end).
  union {
    double f64;
    float f32;
    uint16_t f16;
  } scalar{};
  switch (r.dtype) {
    case DataType::kFloat64: scalar.f64 = factor; break;
    case DataType::kFloat32: scalar.f32 = static_cast<float>(factor); break;
    case DataType::kFloat16: scalar.f16 = FloatToHalf(static_cast<float>(factor)); break;
    case DataType::kBFloat16: scalar.f16 = FloatToBFloat16(static_cast<float>(factor)); break;
    default: throw std::runtime_error("NCCL cannot scale " + std::string(DataTypeName(r.dtype)));
  }
  nccl::RedOp op = nccl::kSum;
  Check(lib_->api().RedOpCreatePreMulSum(&op, &scalar, NcclType(r.dtype), nccl::kScalarHostImmediate, comm),
        "ncclRedOpCreatePreMulSum", comm);
  *created = true;
  return op;
}

std::unique_ptr<Completion> NcclBackend::Run(CollectiveJob& job) {
  const Response& r = job.response;
  GpuContext::Device& d = gpus_->Get(job.device);
  nccl::Comm comm = CommFor(job.device);
  const bool two_level = r.type == RequestType::kAllreduce && TwoLevel(r);
  const LevelComms lv = two_level ? LevelCommsFor(job.device) : LevelComms{};
  cuda::DeviceGuard guard(d.rt, d.index);
  // The producers' work comes first: each tensor's event was recorded on the stream
  // that made it when it was enqueued.
  for (size_t i = 0; i < job.entries.size(); ++i)
    if (job.have[i] && job.entries[i].produced) job.entries[i].produced->OrderBefore(reinterpret_cast<uintptr_t>(d.stream->get()));
  const int64_t start = NowMicros();
  if (two_level) return TwoLevelAllreduce(job, d, lv, start);
  const char* phase = "NCCL_ALLREDUCE";
  switch (r.type) {
    case RequestType::kAllreduce: Allreduce(job, d, comm); break;
    case RequestType::kAllgather: Allgather(job, d, comm); phase = "NCCL_ALLGATHER"; break;
    case RequestType::kBroadcast: Broadcast(job, d, comm); phase = "NCCL_BCAST"; break;
    case RequestType::kAlltoall: Alltoall(job, d, comm); phase = "NCCL_ALLTOALL"; break;
    case RequestType::kReducescatter: Reducescatter(job, d, comm); phase = "NCCL_REDUCESCATTER"; break;
    default: throw std::runtime_error(std::string("the NCCL backend has no ") + RequestTypeName(r.type));
  }
  return std::make_unique<NcclCompletion>(d.events->Record(d.stream->get()), lib_, CommsOf(job.device),
                                          TracedNames(job), phase, start, job.trace);
}

// Two levels where the user forced them (HOROVOD_HIERARCHICAL_ALLREDUCE=1) and the
// topology allows, and where they give what the flat allreduce gives. The GPU default
// stays flat: NCCL builds its rings and trees from the topology it detects (NVLink, PCIe,
// network), so a single ncclAllReduce already keeps most traffic inside each host, and
// unlike on host memory there is no measurement here (no GPU) to show two levels win.
bool NcclBackend::TwoLevel(const Response& r) {
  if (params_.two_level.allreduce != 1) return false;
  if (!two_level_) {
    if (rank_ == 0 && !warned_flat_) {
      warned_flat_ = true;
      HVD_WARN("HOROVOD_HIERARCHICAL_ALLREDUCE=1 does not apply to GPU allreduces: " << two_level_why_not_
               << "; they stay flat (one ncclAllReduce)");
    }
    return false;
  }
  // Integer Average: the flat ncclAvg divides the whole sum once, truncating; no scale
  // factor put into the first level can do the same. (Scale factors on integers never
  // reach this backend: Supports sends them through host memory.)
  if (r.reduce_op == ReduceOp::kAverage && !IsFloat(r.dtype)) return false;
  int64_t total = 0;
  for (int64_t c : r.sizes) total += c;
  return total > 0;
}

uint8_t* NcclBackend::HostShard(GpuContext::Device& d, int64_t bytes) {
  if (bytes <= host_shard_bytes_ && host_shard_device_ == d.index) return static_cast<uint8_t*>(host_shard_);
  if (host_shard_) {
    // The last copy back from the old buffer may still be queued.
    d.rt.Check(d.rt.api().StreamSynchronize(gpus_->Get(host_shard_device_).stream->get()), "cudaStreamSynchronize");
    d.rt.api().FreeHost(host_shard_);
    host_shard_ = nullptr;
    host_shard_bytes_ = 0;
  }
  const int64_t want = std::max<int64_t>(bytes, 1 << 20);
  d.rt.Check(d.rt.api().MallocHost(&host_shard_, static_cast<size_t>(want)), "cudaMallocHost");
  host_shard_bytes_ = want;
  host_shard_device_ = d.index;
  return static_cast<uint8_t*>(host_shard_);
}

// The (fused) buffer, padded with zeros to local_size equal shards:
//   1. ncclReduceScatter inside the host: local rank l holds its host's reduction of
//      shard l, scaled by the whole factor (prescale x postscale, 1/size for Average) as
//      a PreMulSum, so the levels after it only sum;
//   2. that shard allreduced among the ranks with local rank l on every host: NCCL on the
//      cross communicator, or (Horovod's way) copied to host memory on hvdlite's stream,
//      waited for, reduced by MPI on the topology's cross communicator (the MPI backend's
//      reduction, so every type and op works), and copied back;
//   3. ncclAllGather inside the host puts every shard everywhere.
// Min, Max and Product apply the same op at each level. A joined rank's tensors are zeros.
// A tensor alone whose size local_size divides is reduced where it lies.
std::unique_ptr<Completion> NcclBackend::TwoLevelAllreduce(CollectiveJob& job, GpuContext::Device& d,
                                                           const LevelComms& lv, int64_t start_us) {
  const Response& r = job.response;
  const size_t n = r.names.size();
  const int64_t es = DataTypeSize(r.dtype);
  const nccl::DataType type = NcclType(r.dtype);
  const int local_size = topology_.local_size();
  cuda::Stream s = d.stream->get();
  const bool trace = job.trace.Active();
  int64_t total = 0;
  for (int64_t c : r.sizes) total += c;
  const int64_t shard = (total + local_size - 1) / local_size;
  const int64_t padded = shard * local_size;
  const bool direct = n == 1 && job.have[0] && padded == total;

  const void* in = nullptr;
  uint8_t* buf = nullptr;
  const int64_t t_in = NowMicros();
  if (direct) {
    in = job.entries[0].input;
    buf = static_cast<uint8_t*>(job.entries[0].output);
  } else {
    buf = d.fusion.Get(padded * es, s);
    const int64_t off = PackFused(job, d, buf);
    if (padded > total)
      d.rt.Check(d.rt.api().MemsetAsync(buf + off, 0, static_cast<size_t>((padded - total) * es), s),
                 "cudaMemsetAsync");
    in = buf;
  }
  uint8_t* mine = buf + topology_.local_rank() * shard * es;
  const int64_t t_call = NowMicros();

  // The levels' ops: everything Sum and Average need is scaled in the first.
  nccl::RedOp first = nccl::kSum, rest = nccl::kSum;
  ReduceOp host_op = ReduceOp::kSum;
  bool created = false;
  switch (r.reduce_op) {
    case ReduceOp::kMin: first = rest = nccl::kMin; host_op = ReduceOp::kMin; break;
    case ReduceOp::kMax: first = rest = nccl::kMax; host_op = ReduceOp::kMax; break;
    case ReduceOp::kProduct: first = rest = nccl::kProd; host_op = ReduceOp::kProduct; break;
    default: {
      Response summed = r;
      summed.reduce_op = ReduceOp::kSum;
      double factor = r.prescale * r.postscale;
      if (r.reduce_op == ReduceOp::kAverage) factor /= size_;
      summed.prescale = factor;
      summed.postscale = 1.0;
      first = ReductionFor(summed, lv.local, &created);
    }
  }
  std::vector<NcclCompletion::Step> steps;
  try {
    Check(lib_->api().ReduceScatter(in, mine, static_cast<size_t>(shard), type, first, lv.local, s),
          "ncclReduceScatter", lv.local);
  } catch (...) {
    if (created) lib_->api().RedOpDestroy(first, lv.local);
    throw;
  }
  if (created) lib_->api().RedOpDestroy(first, lv.local);

  if (lv.cross) {
    if (trace) steps.push_back({"NCCL_REDUCESCATTER", t_call, -1, d.events->Record(s)});
    Check(lib_->api().AllReduce(mine, mine, static_cast<size_t>(shard), type, rest, lv.cross, s), "ncclAllReduce",
          lv.cross);
    if (trace) steps.push_back({"NCCL_ALLREDUCE", -1, -1, d.events->Record(s)});
  } else {
    uint8_t* host = HostShard(d, shard * es);
    d.rt.Check(d.rt.api().MemcpyAsync(host, mine, static_cast<size_t>(shard * es), cuda::kDeviceToHost, s),
               "cudaMemcpyAsync");
    // Waited for with an eye on the local communicator: a peer that failed inside the
    // host is an error here, not a wait forever.
    // The error is checked once more after the copy is seen done: a reduce-scatter that
    // failed (or was stopped by an abort) still lets the stream run on to the copy, and
    // the shard it left must not go to the other hosts.
    std::shared_ptr<ReadyEvent> copied = d.events->Record(s);
    for (bool done = false; !done;) {
      done = copied->Query();
      nccl::Result async = nccl::kSuccess;
      if (lib_->api().CommGetAsyncError(lv.local, &async) != nccl::kSuccess ||
          (async != nccl::kSuccess && async != nccl::kInProgress))
        throw std::runtime_error("NCCL reported an asynchronous error in the two-level allreduce's reduce-scatter: " +
                                 lib_->ErrorString(async, lv.local));
      if (!done) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    const int64_t t_mpi = NowMicros();
    cross_mpi_->Allreduce(host, host, shard, r.dtype, host_op, 1.0);
    const int64_t t_back = NowMicros();
    d.rt.Check(d.rt.api().MemcpyAsync(mine, host, static_cast<size_t>(shard * es), cuda::kHostToDevice, s),
               "cudaMemcpyAsync");
    if (trace) {
      steps.push_back({"NCCL_REDUCESCATTER", t_call, t_mpi, nullptr});
      steps.push_back({"MPI_ALLREDUCE", t_mpi, t_back, nullptr});
    }
  }
  Check(lib_->api().AllGather(mine, buf, static_cast<size_t>(shard), type, lv.local, s), "ncclAllGather", lv.local);
  if (trace) steps.push_back({"NCCL_ALLGATHER", -1, -1, nullptr});

  if (!direct) {
    const int64_t t_out = NowMicros();
    UnpackFused(job, d, buf);
    if (trace) {
      const int64_t t_end = NowMicros();
      for (size_t i = 0; i < n; ++i) {
        if (!job.have[i]) continue;
        job.trace.Phase(r.names[i], "MEMCPY_IN_FUSION_BUFFER", t_in, t_call);
        job.trace.Phase(r.names[i], "MEMCPY_OUT_FUSION_BUFFER", t_out, t_end);
      }
    }
  }
  return std::make_unique<NcclCompletion>(d.events->Record(s), lib_, CommsOf(job.device), TracedNames(job),
                                          "NCCL_HIERARCHICAL_ALLREDUCE", start_us, job.trace, std::move(steps));
}

// One NCCL call per response: a tensor alone is reduced where it lies; several are
// packed into the device fusion buffer, reduced there and copied out. A joined rank's
// tensors are zeros.
void NcclBackend::Allreduce(CollectiveJob& job, GpuContext::Device& d, nccl::Comm comm) {
  const Response& r = job.response;
  const size_t n = r.names.size();
  const int64_t es = DataTypeSize(r.dtype);
  bool created = false;
  const nccl::RedOp op = ReductionFor(r, comm, &created);
  cuda::Stream s = d.stream->get();
  auto call = [&](const void* in, void* out, int64_t count) {
    Check(lib_->api().AllReduce(in, out, static_cast<size_t>(count), NcclType(r.dtype), op, comm, s), "ncclAllReduce",
          comm);
  };
  try {
    if (n == 1) {
      const int64_t count = r.sizes[0];
      if (job.have[0]) {
        call(job.entries[0].input, job.entries[0].output, count);
      } else {
        uint8_t* z = d.scratch.Get(count * es, s);
        d.rt.Check(d.rt.api().MemsetAsync(z, 0, static_cast<size_t>(count * es), s), "cudaMemsetAsync");
        call(z, z, count);
      }
    } else {
      int64_t total = 0;
      for (int64_t c : r.sizes) total += c;
      uint8_t* buf = d.fusion.Get(total * es, s);
      const int64_t t_in = NowMicros();
      PackFused(job, d, buf);
      const int64_t t_call = NowMicros();
      call(buf, buf, total);
      const int64_t t_out = NowMicros();
      UnpackFused(job, d, buf);
      if (job.trace.Active()) {
        const int64_t t_end = NowMicros();
        for (size_t i = 0; i < n; ++i) {
          if (!job.have[i]) continue;
          job.trace.Phase(r.names[i], "MEMCPY_IN_FUSION_BUFFER", t_in, t_call);
          job.trace.Phase(r.names[i], "MEMCPY_OUT_FUSION_BUFFER", t_out, t_end);
        }
      }
    }
  } catch (...) {
    if (created) lib_->api().RedOpDestroy(op, comm);
    throw;
  }
  // An op may be destroyed once the last call that uses it has been queued.
  if (created) lib_->api().RedOpDestroy(op, comm);
}

// Rank q's block goes to every rank by a broadcast rooted at q, all in one group: that
// is an allgather with a different size per rank (ncclAllGather when they are equal).
// Several tensors are packed into one block per rank first and cut apart afterwards.
void NcclBackend::Allgather(CollectiveJob& job, GpuContext::Device& d, nccl::Comm comm) {
  const Response& r = job.response;
  const size_t n = r.names.size();
  for (size_t i = 0; i < n; ++i)
    if (!job.have[i]) throw std::runtime_error("allgather '" + r.names[i] + "' is not queued on this rank");
  cuda::Stream s = d.stream->get();
  const GatherLayout g = PlanAllgather(r, job.entries, size_);
  job.outputs.resize(n);
  for (size_t i = 0; i < n; ++i)
    job.outputs[i] = DeviceOutput(d, g.OutputBytes(i), job.entries[i].request.dtype,
                                  g.OutputShape(i, job.entries[i].request.shape));
  if (g.total == 0) return;
  // Gather every rank's block into `dst` (blocks in rank order), this rank's from `mine`.
  auto gather = [&](const void* mine, uint8_t* dst) {
    bool equal = true;
    for (int q = 1; q < size_; ++q) equal = equal && g.block[q] == g.block[0];
    if (equal) {
      Check(lib_->api().AllGather(mine, dst, static_cast<size_t>(g.block[0]), nccl::kUint8, comm, s), "ncclAllGather",
            comm);
      return;
    }
    Check(lib_->api().GroupStart(), "ncclGroupStart", comm);
    nccl::Result rc = nccl::kSuccess;
    for (int q = 0; q < size_ && rc == nccl::kSuccess; ++q) {
      if (g.block[q] == 0) continue;
      rc = lib_->api().Broadcast(q == rank_ ? mine : dst + g.block_offset[q], dst + g.block_offset[q],
                                 static_cast<size_t>(g.block[q]), nccl::kUint8, q, comm, s);
    }
    const nccl::Result end = lib_->api().GroupEnd();
    Check(rc, "ncclBroadcast", comm);
    Check(end, "ncclGroupEnd", comm);
  };
  if (n == 1) {
    gather(job.entries[0].input, static_cast<uint8_t*>(job.outputs[0]->device_data->data()));
    return;
  }
  uint8_t* buf = d.fusion.Get(g.total + g.block[rank_], s);
  uint8_t* mine = buf + g.total;
  int64_t off = 0;
  for (size_t i = 0; i < n; ++i) {
    Copy(d, mine + off, job.entries[i].input, g.Bytes(i, rank_));
    off += g.Bytes(i, rank_);
  }
  gather(mine, buf);
  std::vector<int64_t> at = g.block_offset;
  for (size_t i = 0; i < n; ++i) {
    uint8_t* dst = static_cast<uint8_t*>(job.outputs[i]->device_data->data());
    for (int q = 0; q < size_; ++q) {
      const int64_t bytes = g.Bytes(i, q);
      Copy(d, dst, buf + at[q], bytes);
      dst += bytes;
      at[q] += bytes;
    }
  }
}

void NcclBackend::Broadcast(CollectiveJob& job, GpuContext::Device& d, nccl::Comm comm) {
  if (!job.have[0]) return;
  const Response& r = job.response;
  TensorEntry& e = job.entries[0];
  void* buf = e.output ? e.output : const_cast<void*>(e.input);
  const int64_t bytes = r.sizes[0] * DataTypeSize(r.dtype);
  if (bytes == 0) return;
  Check(lib_->api().Broadcast(buf, buf, static_cast<size_t>(bytes), nccl::kUint8, r.root, comm, d.stream->get()),
        "ncclBroadcast", comm);
}

void NcclBackend::Alltoall(CollectiveJob& job, GpuContext::Device& d, nccl::Comm comm) {
  if (!job.have[0]) return;
  const Response& r = job.response;
  TensorEntry& e = job.entries[0];
  const AlltoallLayout a = PlanAlltoall(r, e, rank_, size_);
  job.outputs.resize(1);
  job.outputs[0] = DeviceOutput(d, a.total_recv, r.dtype, a.output_shape);
  job.outputs[0]->aux = a.received_rows;
  if (!a.moves_data) return;
  cuda::Stream s = d.stream->get();
  const uint8_t* in = static_cast<const uint8_t*>(e.input);
  uint8_t* out = static_cast<uint8_t*>(job.outputs[0]->device_data->data());
  Check(lib_->api().GroupStart(), "ncclGroupStart", comm);
  nccl::Result rc = nccl::kSuccess;
  const char* failed = "";
  for (int q = 0; q < size_ && rc == nccl::kSuccess; ++q) {
    if (a.send_bytes[q] > 0) {
      rc = lib_->api().Send(in + a.send_offset[q], static_cast<size_t>(a.send_bytes[q]), nccl::kUint8, q, comm, s);
      failed = "ncclSend";
    }
    if (rc == nccl::kSuccess && a.recv_bytes[q] > 0) {
      rc = lib_->api().Recv(out + a.recv_offset[q], static_cast<size_t>(a.recv_bytes[q]), nccl::kUint8, q, comm, s);
      failed = "ncclRecv";
    }
  }
  const nccl::Result end = lib_->api().GroupEnd();
  Check(rc, failed, comm);
  Check(end, "ncclGroupEnd", comm);
}

// NCCL's reducescatter gives every rank the same number of elements; Horovod's gives the
// first dim0 % size ranks one row more. Uneven shares are padded to the largest one.
void NcclBackend::Reducescatter(CollectiveJob& job, GpuContext::Device& d, nccl::Comm comm) {
  if (!job.have[0]) return;
  const Response& r = job.response;
  TensorEntry& e = job.entries[0];
  const int64_t es = DataTypeSize(r.dtype);
  const ScatterLayout sl = PlanReducescatter(e.request.shape, rank_, size_);
  job.outputs.resize(1);
  job.outputs[0] = DeviceOutput(d, sl.counts[rank_] * es, r.dtype, sl.output_shape);
  if (sl.total == 0) return;
  cuda::Stream s = d.stream->get();
  uint8_t* out = static_cast<uint8_t*>(job.outputs[0]->device_data->data());
  bool created = false;
  const nccl::RedOp op = ReductionFor(r, comm, &created);
  try {
    const int64_t share = sl.counts[0];  // the largest
    bool even = true;
    for (int64_t c : sl.counts) even = even && c == share;
    if (even) {
      Check(lib_->api().ReduceScatter(e.input, out, static_cast<size_t>(share), NcclType(r.dtype), op, comm, s),
            "ncclReduceScatter", comm);
    } else {
      uint8_t* buf = d.fusion.Get(share * size_ * es, s);
      for (int q = 0; q < size_; ++q) {
        uint8_t* slot = buf + q * share * es;
        Copy(d, slot, static_cast<const uint8_t*>(e.input) + sl.offset[q] * es, sl.counts[q] * es);
        if (sl.counts[q] < share)
          d.rt.Check(d.rt.api().MemsetAsync(slot + sl.counts[q] * es, 0, static_cast<size_t>((share - sl.counts[q]) * es), s),
                     "cudaMemsetAsync");
      }
      uint8_t* mine = buf + rank_ * share * es;  // in place, as NCCL defines it
      Check(lib_->api().ReduceScatter(buf, mine, static_cast<size_t>(share), NcclType(r.dtype), op, comm, s),
            "ncclReduceScatter", comm);
      Copy(d, out, mine, sl.counts[rank_] * es);
    }
  } catch (...) {
    if (created) lib_->api().RedOpDestroy(op, comm);
    throw;
  }
  if (created) lib_->api().RedOpDestroy(op, comm);
}

}  // namespace hvdlite
