#include "engine.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <sstream>
#include <stdexcept>

#include <pthread.h>
#include <sched.h>

#include "backends/mpi/mpi_backend.h"
#include "backends/mpi/reduce_ops.h"
#include "backends/nccl/nccl_backend.h"
#include "backends/staged/host_staged_backend.h"
#include "logging.h"
#include "membership.h"

namespace hvdlite {
namespace {

constexpr int64_t kIdleWaitMicros = 100000;   // nothing in flight: wake this often anyway
constexpr int64_t kStallCheckEveryMicros = 1000000;
// How often a rank sends rank 0 the timeline records it relays (it also sends them when
// it leaves), so that rank 0's trace shows every process set's collectives soon.
constexpr int64_t kRelayEveryMicros = 50000;
// How long rank 0, failing, listens for a worker's report of the failure's cause.
constexpr int64_t kPeerReportGraceMicros = 200000;
// A clean shutdown sees a cycle in flight through, if every rank has started it (a rank
// that shut down had completed it): its messages are on their way and it ends within
// microseconds. This bounds the wait should it not.
constexpr int64_t kShutdownDrainMicros = 2000000;

// A caller that runs the engine (Drive) runs MPI's collectives on its own thread, so
// MPI's temporary buffers come from the same malloc arena as the caller's arrays. With
// glibc's adaptive thresholds, a freed 4 MiB result plus MPI's freed 4 MiB scratch at
// the top of the heap exceed the trim threshold (twice the largest freed block), the
// heap is returned to the kernel, and the next call faults every page back in: an
// out-of-place 4 MiB allreduce then took 3-4 ms instead of 0.7. Setting the thresholds
// to the ceiling glibc's own policy reaches (mmap above 32 MiB, trim above 64 MiB)
// keeps that memory.
// Threads other than the main one allocate from their own arenas, made of heaps of at
// most 64 MiB. When the last heap of such an arena becomes entirely free, glibc unmaps
// it unless the space free at the end of the heap before it is below M_TOP_PAD (128 KiB
// by default). A TensorFlow step whose gradients (38 MB for a 9.6 M-parameter model)
// and MPI's scratch are allocated on its executor thread crossed such a heap boundary
// in every step: the heap was unmapped at the end of the step, and 4,000+ pages (17 MB)
// were faulted back in during the next one, 10-15 ms of an 85 ms step. A top pad of
// 64 MiB, the size of a whole heap, keeps those heaps. It also keeps up to 64 MiB free at
// the top of the main heap when it is trimmed, in line with the trim threshold.
// Skipped when the user tunes malloc through its environment.
void TuneHostAllocator() {
#if defined(__GLIBC__)
  static bool done = false;
  if (done) return;
  done = true;
  for (const char* v : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_"})
    if (std::getenv(v)) return;
  mallopt(M_MMAP_THRESHOLD, 32 * 1024 * 1024);
  mallopt(M_TRIM_THRESHOLD, 64 * 1024 * 1024);
  mallopt(M_TOP_PAD, 64 * 1024 * 1024);
#endif
}


// Settings every rank must use alike, or their collectives would not match (how a
// fused allreduce is cut into MPI calls, which backend runs a GPU collective): rank 0's
// values, whatever the other ranks' environments say.
void ShareRankZeroSettings(ControlChannel& channel, Parameters* p) {
  struct Shared {
    int64_t host_chunk_bytes, fusion_direct_bytes, ring_min_segment_bytes, hierarchical_chunk_bytes, cache_capacity;
    int32_t gpu_mpi[kNumRequestTypes];  // 1: host-staged MPI, 0: NCCL
    TwoLevelSettings two_level;
  } s{};
  s.host_chunk_bytes = p->host_chunk_bytes;
  s.fusion_direct_bytes = p->fusion_direct_bytes;
  s.ring_min_segment_bytes = p->ring_min_segment_bytes;
  s.hierarchical_chunk_bytes = p->hierarchical_chunk_bytes;
  s.two_level = p->two_level;
  s.cache_capacity = p->cache_capacity;  // every rank's cycles carry a bit per entry
  for (int t = 0; t < kNumRequestTypes; ++t) s.gpu_mpi[t] = p->gpu_backend[t] == "MPI";
  channel.Share(&s, sizeof s, 0);
  p->host_chunk_bytes = s.host_chunk_bytes;
  p->fusion_direct_bytes = s.fusion_direct_bytes;
  p->ring_min_segment_bytes = s.ring_min_segment_bytes;
  p->hierarchical_chunk_bytes = s.hierarchical_chunk_bytes;
  p->two_level = s.two_level;
  p->cache_capacity = s.cache_capacity;
  for (int t = 0; t < kNumRequestTypes; ++t) p->gpu_backend[t] = s.gpu_mpi[t] ? "MPI" : "NCCL";
}

// The two-level schedule when HVDLITE_HIERARCHICAL_ALGORITHM is unset. The torus spreads
// a host's traffic and reductions over all its ranks, which wins while each rank has a
// core (leader / torus 1.6-1.8 on 4 x 2 ranks at 10 Gbit/s); on a host running more ranks
// than it has cores its concurrent cross-host streams contend for them, and the leader's
// one stream wins (0.83-0.95 from 1 MiB on, 2 x 4 ranks on 2 cores; docs/scale.md). Rank
// 0 decides from its own host and shares the choice, so every rank runs the same one.
void ChooseTwoLevelSchedule(const Topology& topology, unsigned cores, TwoLevelSettings* s) {
  if (s->algorithm >= 0) return;
  s->algorithm = (cores > 0 && static_cast<unsigned>(topology.local_size()) > cores) ? 1 : 0;
}

}  // namespace

Engine::Engine(MPI_Comm comm, const Parameters& params, HandleTable* handles, int32_t process_set,
               std::shared_ptr<TimelineWriter> timeline)
    : params_(params), handles_(handles), process_set_(process_set), cache_(0),
      timeline_(timeline ? Timeline(std::move(timeline), process_set) : Timeline()) {
  channel_ = std::make_unique<ControlChannel>(comm);
  topology_ = std::make_unique<Topology>(comm);
  const unsigned cores = std::thread::hardware_concurrency();
  ChooseTwoLevelSchedule(*topology_, cores, &params_.two_level);
  ShareRankZeroSettings(*channel_, &params_);
  cache_ = ResponseCache(params_.cache_capacity);
  const int rank = topology_->rank(), size = topology_->size();
  if (process_set_ == 0) SetLogContext(rank, params_.log_level);
  // Polling without sleeping only pays while every rank on this host has a core to
  // itself; with more ranks than cores it would take time from a rank that computes.
  spin_us_ = (cores == 0 || static_cast<unsigned>(topology_->local_size()) <= cores) ? params_.spin_us : 0;
  // A blocked caller runs the engine itself unless polling is turned off (spin_us 0).
  // With more ranks than cores it yields the core at every poll (as Open MPI's
  // mpi_yield_when_idle does) and hands the wait back after a cycle time without
  // progress: there the background thread's hand-overs and sleeps between polls cost
  // each step of a small collective a scheduler round trip (docs/scale.md).
  drive_ = params_.spin_us > 0;
  if (drive_) handles_->SetWaiterHook(process_set_, [this] { queue_.Wake(); });
  if (spin_us_ > 0 && params_.malloc_tuning) TuneHostAllocator();
  InitReduceOps();
  registry_ = std::make_unique<BackendRegistry>(params_);
  mpi_ = static_cast<MpiBackend*>(registry_->Add(std::make_unique<MpiBackend>(*topology_, params_)));
  registry_->Add(std::make_unique<NcclBackend>(channel_.get(), &gpus_, *topology_, params_));
  registry_->Add(std::make_unique<HostStagedBackend>(mpi_, &gpus_));
  const FusionLimits fusion[kNumDeviceKinds] = {registry_->Fusion(DeviceKind::kHost),
                                                registry_->Fusion(DeviceKind::kCuda)};
  if (rank == 0) coordinator_ = std::make_unique<Coordinator>(size, params_, fusion, &cache_, &timeline_);
  cycle_ = std::make_unique<CacheCycle>(comm, params_.cache_capacity, fusion,
                                        static_cast<int64_t>(params_.cycle_time_ms * 1000),
                                        topology_->cross_size() == 1);
  applied_.fusion_threshold_bytes = params_.fusion_threshold_bytes;
  applied_.cycle_time_ms = params_.cycle_time_ms;
  applied_.cache_enabled = params_.cache_capacity > 0 ? 1 : 0;
  applied_.hierarchical = params_.two_level.allreduce;
  if (rank == 0 && process_set_ == 0 && params_.autotune)
    tuner_ = std::make_unique<Autotuner>(applied_, mpi_->HierarchicalPossible(), params_.autotune_options);
  // A set's rank 0 records what the world's rank 0 does not see: its set, where rank 0
  // is not a member (elsewhere the writer does not relay, and the flag does nothing).
  if (process_set_ != 0 && rank == 0) timeline_.SetRelays(true);
  if (process_set_ == 0 && !params_.timeline_path.empty()) {
    std::string err;
    if (rank != 0) timeline_.writer()->StartRelay();
    else if (!timeline_.Start(params_.timeline_path, params_.timeline_mark_cycles, &err)) HVD_WARN(err);
  }
  HVD_INFO("engine started: rank " << rank << " of " << size << " (local " << topology_->local_rank() << " of "
           << topology_->local_size() << "), fusion threshold " << params_.fusion_threshold_bytes
           << " B, cycle time " << params_.cycle_time_ms << " ms, cache capacity " << params_.cache_capacity
           << ", poll without yielding " << spin_us_ << " us"
           << (mpi_->HierarchicalPossible()
                   ? (params_.two_level.algorithm == 1 ? ", two-level schedule leader" : ", two-level schedule torus")
                   : ""));
  thread_ = std::thread([this] { Loop(); });
}

Engine::~Engine() {
  handles_->SetWaiterHook(process_set_, nullptr);
  Stop();
  timeline_.Stop();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) {
    // A waiting thread outlived MPI itself: nothing left that can be freed safely.
    (void)registry_.release();
    (void)cycle_.release();
    (void)topology_.release();
    (void)channel_.release();
    return;
  }
  registry_.reset();  // NCCL communicators first (their queued work finishes), then MPI's
}

void Engine::Stop() {
  stop_requested_ = true;
  queue_.Wake();
  if (thread_.joinable()) thread_.join();
}

void Engine::Abandon(const std::string& why) {
  HVD_WARN("abandoning the engine: " << why);
  RevokeCommunicators();
  Stop();
}

void Engine::RevokeCommunicators() {
  channel_->Revoke();
  cycle_->Revoke();
  topology_->Revoke();
}

bool Engine::StartTimeline(const std::string& path, bool mark_cycles, std::string* error) {
  if (process_set_ != 0) return true;
  if (rank() != 0) {  // the world's rank 0 writes the timeline; the others relay to it
    timeline_.writer()->StartRelay();
    return true;
  }
  return timeline_.Start(path, mark_cycles, error);
}

void Engine::StopTimeline() { timeline_.Stop(); }

int64_t Engine::Enqueue(Request request, const void* input, void* output, bool caller_waits,
                        std::optional<uintptr_t> stream) {
  const int64_t h = handles_->Create(process_set_);
  request.rank = rank();
  if (!running_) {
    handles_->Complete(h, false, RequestLabel(request.type, request.name) + ": hvdlite has been shut down" +
                                     (shutdown_reason_.empty() ? "" : " (" + shutdown_reason_ + ")"));
    return h;
  }
  TensorEntry e;
  e.request = std::move(request);
  e.input = input;
  e.output = output;
  e.handle = h;
  e.enqueue_us = NowMicros();
  if (e.request.device != kCpuDevice && e.request.error.empty()) {
    // A problem only this rank sees (no CUDA runtime here, a second GPU) is a refusal:
    // the collective then fails on every rank instead of leaving the others waiting.
    const std::string problem = PrepareGpuRequest(e, stream);
    if (!problem.empty()) e.request.error = RequestLabel(e.request.type, e.request.name) + ": " + problem;
  }
  if (!queue_.Push(e, /*wake=*/!(caller_waits && drive_))) {  // refused: `e` is intact
    handles_->Release(h);
    throw DuplicateName(RequestLabel(e.request.type, e.request.name) + ": another " + RequestTypeName(e.request.type) +
                        " with this name is already in flight on rank " + std::to_string(rank()) +
                        "; wait for it to finish or use a different name");
  }
  return h;
}

std::string Engine::PrepareGpuRequest(TensorEntry& e, std::optional<uintptr_t> stream) {
  const int device = e.request.device;
  int expected = -1;
  if (!gpu_device_.compare_exchange_strong(expected, device) && expected != device)
    return "the tensor is on GPU " + std::to_string(device) + ", but this process already drives GPU " +
           std::to_string(expected) + "; hvdlite drives one GPU per process (pin it first, e.g. "
           "torch.cuda.set_device(hvd.local_rank()))";
  try {
    GpuContext::Device& d = gpus_.Get(device);
    if (stream) {
      cuda::DeviceGuard guard(d.rt, device);
      e.produced = d.events->Record(reinterpret_cast<cuda::Stream>(*stream));
    }
  } catch (const std::exception& ex) {
    return ex.what();
  }
  return "";
}

std::shared_ptr<DeviceAllocation> Engine::AllocateDevice(int device, int64_t bytes) {
  GpuContext::Device& d = gpus_.Get(device);
  return std::make_shared<cuda::StreamMemory>(d.events, d.stream, bytes);
}

void Engine::CopyOnDevice(int device, void* dst, const void* src, int64_t bytes, std::optional<uintptr_t> after) {
  GpuContext::Device& d = gpus_.Get(device);
  cuda::DeviceGuard guard(d.rt, device);
  const uintptr_t ours = reinterpret_cast<uintptr_t>(d.stream->get());
  if (after) d.events->Record(reinterpret_cast<cuda::Stream>(*after))->OrderBefore(ours);
  if (bytes > 0)
    d.rt.Check(d.rt.api().MemcpyAsync(dst, src, static_cast<size_t>(bytes), cuda::kDeviceToDevice, d.stream->get()),
               "cudaMemcpyAsync");
}

Engine::Stats Engine::GetStats() const {
  Stats s;
  s.requests_in_full = requests_in_full_;
  s.requests_as_ids = requests_as_ids_;
  s.cycles = cycle_->completed();
  s.carried = carried_;
  s.control_bytes_sent = channel_->bytes_sent();
  s.control_bytes_received = channel_->bytes_received();
  s.waits_driven = waits_driven_;
  s.waits_handed_back = waits_handed_back_;
  s.huge_page_extents = mpi_->huge_page_extents();
  s.device_collectives = device_collectives_;
  std::lock_guard<std::mutex> lk(tunables_mu_);
  s.tunables_applied = tunables_applied_;
  s.tunables = applied_;
  return s;
}

void Engine::BeginShutdown(const std::string& reason, bool failure, bool hold) {
  // A failure during a hold is announced at once, as a failure.
  if (shutting_down_ && !(shutdown_held_ && failure)) return;
  shutting_down_ = true;
  shutdown_reason_ = reason;
  stopped_by_failure_ = failure;
  if (failure) registry_->AbortAll(reason);
  shutdown_held_ = hold && !failure;
  if (shutdown_held_) {
    drain_until_us_ = NowMicros() + kShutdownDrainMicros;
    return;
  }
  AnnounceShutdown();
}

void Engine::AnnounceShutdown() {
  shutdown_held_ = false;
  ResponseList s;
  s.shutdown = true;
  s.shutdown_reason = shutdown_reason_;
  s.failure = stopped_by_failure_;
  if (!s.failure) s.shutdown_cycles = cycle_->completed();
  channel_->SendToWorkers(std::make_shared<std::vector<uint8_t>>(Serialize(s)));
}

void Engine::StopWorker() {
  drain_to_ = -1;
  RequestList ack;
  ack.shutdown_ack = true;
  if (process_set_ == 0) ack.timeline = timeline_.writer()->TakeRelayed();  // rank 0 writes it before it closes
  channel_->SendToCoordinator(std::make_shared<std::vector<uint8_t>>(Serialize(ack)));
  running_ = false;
}

void Engine::Fail(const std::string& reason) {
  HVD_ERROR(reason);
  if (peer_failed_) {  // the communicators are revoked: no one to tell
    registry_->AbortAll(reason);
    return;
  }
  if (rank() == 0) {
    // A worker that fails reports to this rank before it aborts its device work, and
    // that abort may be what failed here: its report, if it comes within a moment,
    // names the cause and becomes the job's reason.
    std::string cause = reason;
    std::vector<uint8_t> buf;
    int from = -1;
    const int64_t until = NowMicros() + kPeerReportGraceMicros;
    while (size() > 1 && !shutting_down_ && NowMicros() < until && cause == reason) {
      if (!channel_->ReceiveRequest(&buf, &from)) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        continue;
      }
      RequestList list = DeserializeRequestList(buf.data(), buf.size());
      if (list.shutdown_ack) ++acks_;
      else if (list.shutdown && list.failure) cause = list.shutdown_reason;
    }
    BeginShutdown(cause, /*failure=*/true);  // aborts this rank's device work too
    return;
  }
  // Tell the coordinator before aborting: the abort makes the peers' device work fail
  // too, and the job's reason should be this rank's, the cause.
  stopped_by_failure_ = true;
  if (!shutting_down_) {
    RequestList report;
    report.shutdown = true;
    report.failure = true;
    report.shutdown_reason = reason;
    channel_->SendToCoordinator(std::make_shared<std::vector<uint8_t>>(Serialize(report)));
    shutting_down_ = true;
  }
  registry_->AbortAll(reason);  // nothing of this rank's waits for a peer any more
}

void Engine::OnPeerFailure(const std::string& what) {
  const std::vector<int> dead = FailedRanks(topology_->world());
  RevokeCommunicators();
  std::string who;
  for (size_t i = 0; i < dead.size(); ++i) who += (i ? ", " : "") + std::to_string(dead[i]);
  shutdown_reason_ = dead.empty()
                         ? "a peer process failed (" + what + ")"
                         : std::string(dead.size() == 1 ? "rank " : "ranks ") + who + " of " + std::to_string(size()) +
                               " failed (" + (dead.size() == 1 ? "its process" : "their processes") +
                               " died or lost contact): " + what;
  stopped_by_failure_ = true;
  peer_failed_ = true;
  // In an elastic job the survivors go on: the front end says so in one warning, with
  // what it recovers to; here it is a detail.
  if (params_.elastic) HVD_INFO(shutdown_reason_);
  else HVD_ERROR(shutdown_reason_);
  registry_->AbortAll(shutdown_reason_);
}

void Engine::Route(Request r, int64_t now, RequestList* to_coordinator) {
  if (r.type != RequestType::kAllreduce || r.group_id < 0 || r.group_size <= 1) {
    RouteOne(std::move(r), now, to_coordinator);
    return;
  }
  PartialGroup& held = partial_groups_[r.group_id];
  if (held.members.empty()) held.since_us = now;
  held.members.push_back(std::move(r));
  if (static_cast<int>(held.members.size()) < held.members.front().group_size) return;
  std::vector<Request> group = std::move(held.members);
  partial_groups_.erase(group.front().group_id);
  // Every rank puts a whole group into one cycle, so its members are agreed on in the
  // same cycle everywhere and fused together, as the group asks. Where one member is
  // not cached here, the others go to rank 0 with it; RouteInFull evicts their entries
  // on every rank, so that the other ranks' members follow them there.
  std::vector<int32_t> ids;
  for (const Request& m : group) {
    const int32_t id = join_outstanding_ ? -1 : cache_.Lookup(m);
    if (id < 0) break;
    ids.push_back(id);
  }
  const bool cached = ids.size() == group.size();
  for (size_t i = 0; i < group.size(); ++i) {
    if (cached) ToCycle(ids[i], std::move(group[i]), now);
    else RouteInFull(std::move(group[i]), now, to_coordinator);
  }
}

// A front end submits a group's members in one call, so a group held for long lacks a
// member this rank will not send (a bug in the caller): it goes to rank 0 in full, where
// the stall inspector names what is missing, rather than wait here unseen.
bool Engine::FlushHeldGroups(int64_t now, RequestList* to_coordinator) {
  bool flushed = false;
  for (auto it = partial_groups_.begin(); it != partial_groups_.end();) {
    if (now - it->second.since_us < kGroupHoldMicros) {
      ++it;
      continue;
    }
    for (Request& m : it->second.members) RouteInFull(std::move(m), now, to_coordinator);
    it = partial_groups_.erase(it);
    flushed = true;
  }
  return flushed;
}

void Engine::RouteOne(Request r, int64_t now, RequestList* to_coordinator) {
  const int32_t id = join_outstanding_ ? -1 : cache_.Lookup(r);
  if (id >= 0) ToCycle(id, std::move(r), now);
  else RouteInFull(std::move(r), now, to_coordinator);
}

void Engine::ToCycle(int32_t id, Request r, int64_t now) {
  ++requests_as_ids_;
  const void* input = CacheCycle::CanCarry(r) ? queue_.InputOf(r.name) : nullptr;
  cycle_->AddReady(id, std::move(r), now, input);
}

void Engine::RouteInFull(Request r, int64_t now, RequestList* to_coordinator) {
  // The name is cached with another signature (or this rank refuses it, or another
  // member of its group is not cached): every rank's request for it must go to rank 0,
  // so the entry is evicted everywhere.
  const int32_t stale = cache_.IdOf(r.name);
  if (stale >= 0) cycle_->Evict(stale);
  if (r.type == RequestType::kJoin) {
    join_outstanding_ = true;
    cycle_->SetEvictAll(true);
  }
  ++requests_in_full_;
  if (rank() == 0) coordinator_->AddRequest(r, now);
  else to_coordinator->requests.push_back(std::move(r));
}

bool Engine::CoordinatorStep() {
  bool progress = false;
  const int64_t now = NowMicros();
  for (Request& r : queue_.TakeNew()) {
    progress = true;
    if (!shutting_down_) Route(std::move(r), now, nullptr);
  }
  std::vector<uint8_t> buf;
  int from = -1;
  // Alone, there is no one to hear from (and probing costs a system call).
  while (size() > 1 && channel_->ReceiveRequest(&buf, &from)) {
    progress = true;
    RequestList list = DeserializeRequestList(buf.data(), buf.size());
    if (!list.timeline.empty()) timeline_.writer()->WriteRelayed(list.timeline);
    if (list.shutdown_ack) {
      ++acks_;
      continue;
    }
    if (shutting_down_) continue;
    const int64_t t = NowMicros();
    for (Request& r : list.requests) coordinator_->AddRequest(r, t);
    for (size_t i = 0; i < list.waiting_ids.size(); ++i)
      if (cache_.Has(list.waiting_ids[i]))
        coordinator_->ReportCachedWait(from, list.waiting_ids[i], cache_.Get(list.waiting_ids[i]), list.waiting_us[i],
                                       list.waiting_cycle, t);
    if (list.shutdown && list.failure) {
      BeginShutdown(list.shutdown_reason, true);
    } else if (list.shutdown) {
      // If the departing rank completed the cycle in flight here, every rank has started
      // it: the announcement waits for it, so that what every rank submitted finishes.
      const bool hold = cycle_->InFlight() && list.cycles_completed >= cycle_->started();
      BeginShutdown("rank " + std::to_string(from) + " shut down (it called shutdown() or its process is exiting)",
                    false, hold);
    }
  }
  if (stop_requested_ && !shutting_down_)
    BeginShutdown("rank 0 shut down (it called shutdown() or its process is exiting)", false);
  if (!shutting_down_) {
    // GPU tensors wait while this rank's GPU work runs, so that they go out fused.
    ResponseList ready = coordinator_->TakeReady(/*hold_device=*/in_flight_count_ > 0);
    if (has_proposal_.load(std::memory_order_acquire)) {  // the global tuner's, for this set
      std::lock_guard<std::mutex> lk(tunables_mu_);
      if (proposed_) {
        proposed_->hierarchical = applied_.hierarchical;
        if (*proposed_ != applied_) tunables_to_send_ = *proposed_;
        proposed_.reset();
      }
      has_proposal_.store(false, std::memory_order_relaxed);
    }
    if (tunables_to_send_) {
      // The autotuner's next settings ride on this list (alone if it is empty): every
      // rank applies them before its collectives, where it falls in the one order.
      ready.has_tunables = true;
      ready.tunables = *tunables_to_send_;
      tunables_to_send_.reset();
    }
    if (!ready.responses.empty() || ready.has_tunables) {
      progress = true;
      // With a cycle in flight, the list runs after that cycle's tensors, on every rank.
      const bool after_cycle = cycle_->InFlight();
      ready.after_cycle = after_cycle ? cycle_->started() : cycle_->completed();
      ++lists_sent_;
      if (size() > 1) channel_->SendToWorkers(std::make_shared<std::vector<uint8_t>>(Serialize(ready)));
      if (after_cycle) deferred_.push_back(std::move(ready));
      else Execute(ready);
    }
    progress = CycleStep(now) || progress;
    const int64_t t = NowMicros();
    if (t - last_stall_check_us_ >= kStallCheckEveryMicros) {
      last_stall_check_us_ = t;
      SendStallReports(t);
      FlushHeldGroups(t, nullptr);
      std::string reason = coordinator_->CheckStalls(t);
      if (!reason.empty()) {
        HVD_ERROR(reason);
        BeginShutdown(reason, false);
      }
    }
  }
  if (shutting_down_ && shutdown_held_) {
    progress = CycleStep(now) || progress;  // the cycle in flight, seen through
    if (!cycle_->InFlight() || NowMicros() > drain_until_us_) {
      if (cycle_->InFlight()) HVD_WARN("shutting down with cycle " << cycle_->started() << " unfinished");
      AnnounceShutdown();
      progress = true;
    }
  }
  return progress;
}

bool Engine::WorkerStep() {
  bool progress = false;
  const int64_t now = NowMicros();
  std::vector<Request> fresh = queue_.TakeNew();
  const bool ask_shutdown = stop_requested_ && !shutting_down_;
  // Timeline records of process sets without the world's rank 0 go to it with this
  // rank's next message (so a barrier after them brings them there first), or alone
  // now and then.
  const bool relay = process_set_ == 0 && timeline_.writer()->HasRelayed() &&
                     (!fresh.empty() || ask_shutdown || now - last_relay_us_ >= kRelayEveryMicros);
  if (!fresh.empty() || ask_shutdown || relay) {
    progress = true;
    RequestList list;
    for (Request& r : fresh) Route(std::move(r), now, &list);
    if (ask_shutdown) {
      list.shutdown = true;
      list.cycles_completed = cycle_->completed();
      shutting_down_ = true;
    }
    if (relay) {
      list.timeline = timeline_.writer()->TakeRelayed();
      last_relay_us_ = now;
    }
    if (!list.requests.empty() || list.shutdown || !list.timeline.empty())
      channel_->SendToCoordinator(std::make_shared<std::vector<uint8_t>>(Serialize(list)));
  }
  std::vector<uint8_t> buf;
  if (channel_->ReceiveResponse(&buf)) {
    if (!TakeResponse(buf)) return true;
    // Return now: a caller driving the engine is likely waiting on what just ran, and
    // a further probe here would delay its return. The next step reads on.
    if (received_.empty()) return true;
    progress = true;
  }
  if (!running_) return progress;
  progress = CycleStep(now) || progress;
  if (drain_to_ >= 0 && (cycle_->completed() >= drain_to_ || NowMicros() > drain_until_us_)) {
    if (cycle_->completed() < drain_to_) HVD_WARN("shutting down with cycle " << drain_to_ << " unfinished");
    StopWorker();
    return true;
  }
  if (now - last_stall_check_us_ >= kStallCheckEveryMicros) {
    last_stall_check_us_ = now;
    SendStallReports(now);
    RequestList list;
    if (FlushHeldGroups(now, &list))
      channel_->SendToCoordinator(std::make_shared<std::vector<uint8_t>>(Serialize(list)));
  }
  return progress;
}

bool Engine::TakeResponse(std::vector<uint8_t>& buf) {
  ResponseList list = DeserializeResponseList(buf.data(), buf.size());
  if (list.shutdown) {
    shutdown_reason_ = list.shutdown_reason;
    shutting_down_ = true;  // no new cycles, nothing more to rank 0 but the acknowledgement
    if (list.failure) {
      stopped_by_failure_ = true;
      registry_->AbortAll(list.shutdown_reason);
    } else if (cycle_->completed() < list.shutdown_cycles && cycle_->started() >= list.shutdown_cycles) {
      // Rank 0 completed the cycle this rank has in flight, so every rank started it and
      // its messages are on their way: see it through (WorkerStep), then stop.
      drain_to_ = list.shutdown_cycles;
      drain_until_us_ = NowMicros() + kShutdownDrainMicros;
      return true;
    }
    StopWorker();
    return false;
  }
  received_.push_back(std::move(list));
  return RunReceivedLists();
}

bool Engine::RunReceivedLists(int64_t upto) {
  std::vector<uint8_t> buf;
  while (running_ && upto >= 0 && lists_run_ < upto) {
    if (received_.empty()) {
      // Rank 0 sent it before it started the cycle that just completed: it is on its way.
      if (channel_->ReceiveResponse(&buf)) {
        if (!TakeResponse(buf)) return false;
      }
      continue;
    }
    ResponseList list = std::move(received_.front());
    received_.pop_front();
    ++lists_run_;
    Execute(list);
  }
  while (running_ && !received_.empty() && received_.front().after_cycle <= cycles_run_) {
    ResponseList list = std::move(received_.front());
    received_.pop_front();
    ++lists_run_;
    Execute(list);
  }
  return running_;
}

bool Engine::CycleStep(int64_t now) {
  if (!running_) return false;
  bool progress = false;
  if (shutting_down_) {
    // No cycle starts. One in flight moves on only where every rank sees it through
    // (rank 0's hold, a worker's drain), since its collectives then run everywhere.
    if (!shutdown_held_ && drain_to_ < 0) return false;
  } else {
    // A list rank 0 sent while its cycle was in flight waits for that cycle, which needs
    // this rank's part too.
    const bool peer_waits = !received_.empty() && received_.back().after_cycle > cycle_->started();
    progress = cycle_->MaybeStart(rank() == 0 ? lists_sent_ : -1, peer_waits, cache_.Empty(), now);
  }
  CacheCycle::Outcome out;
  if (cycle_->Poll(cache_, NowMicros(), &out)) {
    RunCycle(out);
    progress = true;
  }
  return progress;
}

// A completed cycle, on every rank in the same order: rank 0's lists sent before the
// cycle started, the evictions, the tensors every rank had ready, then the lists rank 0
// sent while the cycle was in flight.
void Engine::RunCycle(CacheCycle::Outcome& out) {
  if (rank() != 0 && !RunReceivedLists(out.lists_before)) return;
  if (out.evict_all) {
    cache_.Clear();
  } else {
    for (int32_t id : out.evicted) cache_.Erase(id);
  }
  if (rank() == 0) {
    for (int32_t id : out.evicted) coordinator_->CachedRan(id, out.cycle);
  }
  // This rank's ready requests for evicted entries go to rank 0 in full; so do every
  // other rank's, after this same cycle.
  const int64_t now = NowMicros();
  RequestList full;
  for (Request& r : out.moved) {
    ++requests_in_full_;
    if (rank() == 0) coordinator_->AddRequest(r, now);
    else full.requests.push_back(std::move(r));
  }
  if (!full.requests.empty()) channel_->SendToCoordinator(std::make_shared<std::vector<uint8_t>>(Serialize(full)));
  // Rank 0 accounts for (and traces the negotiation of) what the cycle agreed on.
  auto agreed = [&](int32_t id) {
    if (rank() != 0) return;
    coordinator_->CachedRan(id, out.cycle);
    if (!timeline_.Active()) return;
    auto since = out.since_us.find(id);
    const Request& q = cache_.Get(id);
    std::string phase = std::string("NEGOTIATE_") + RequestTypeName(q.type);
    for (auto& c : phase) c = static_cast<char>(std::toupper(c));
    timeline_.Phase(q.name, phase.c_str(), since == out.since_us.end() ? now : since->second, now,
                    "{\"cycle\": " + std::to_string(out.cycle) + "}");
  };
  if (out.reduced_id >= 0) {
    agreed(out.reduced_id);
    CompleteCarried(out.reduced_id, out.reduced, now);
  }
  for (const std::vector<int32_t>& ids : cycle_->Collectives(out.ready, cache_)) {
    for (int32_t id : ids) agreed(id);
    Perform(FromCache(ids));
  }
  cycles_run_ = out.cycle;
  if (rank() == 0) {
    while (!deferred_.empty()) {
      ResponseList list = std::move(deferred_.front());
      deferred_.pop_front();
      Execute(list);
    }
  } else {
    RunReceivedLists();
  }
}

// A tensor the cycle carried and reduced (CacheCycle::CanCarry): its sum over all ranks
// is in `sum`; what is left is Average's and postscale's factor.
void Engine::CompleteCarried(int32_t id, const void* sum, int64_t now) {
  const Request& q = cache_.Get(id);
  TensorEntry e;
  if (!queue_.Pop(q.name, &e)) return;
  const int64_t count = NumElements(q.shape);
  const double post = q.postscale * (q.reduce_op == ReduceOp::kAverage ? 1.0 / size() : 1.0);
  if (post != 1.0) ScaleCopy(e.output, sum, count, q.dtype, post);
  else std::memcpy(e.output, sum, static_cast<size_t>(count * DataTypeSize(q.dtype)));
  if (timeline_.Active()) {
    timeline_.Phase(q.name, "QUEUE", e.enqueue_us, now);
    timeline_.Phase(q.name, "CYCLE_ALLREDUCE", now, NowMicros());
  }
  ++carried_;
  if (tuner_) Tune({q.name}, count * DataTypeSize(q.dtype));
  handles_->Complete(e.handle, true, "");
}

// Stall reports: this rank's cached tensors that have waited in cycles past the stall
// check time go to rank 0, whose stall inspector names the ranks that have not
// submitted them. (Only reports travel: a healthy cycle involves no rank 0.)
void Engine::SendStallReports(int64_t now) {
  if (params_.stall_check_seconds <= 0) return;
  const int64_t check_us = static_cast<int64_t>(params_.stall_check_seconds * 1e6);
  auto waiting = cycle_->WaitingSince(now - check_us);
  if (waiting.empty()) return;
  if (rank() == 0) {
    for (const auto& [id, since] : waiting)
      if (cache_.Has(id)) coordinator_->ReportCachedWait(0, id, cache_.Get(id), now - since, cycle_->completed(), now);
    return;
  }
  RequestList report;
  report.waiting_cycle = cycle_->completed();
  for (const auto& [id, since] : waiting) {
    report.waiting_ids.push_back(id);
    report.waiting_us.push_back(now - since);
  }
  channel_->SendToCoordinator(std::make_shared<std::vector<uint8_t>>(Serialize(report)));
}

// One round: announce new requests, take in what arrived, run what became ready, and
// look after device work in flight. Called with step_mu_ held.
bool Engine::Step() {
  // Device work first: on rank 0, GPU tensors held while it runs go out in this step.
  bool progress = in_flight_count_ > 0 && PollInFlight();
  progress = (rank() == 0 ? CoordinatorStep() : WorkerStep()) || progress;
  channel_->Reap(false);
  if (progress && timeline_.Active()) {
    timeline_.CycleMark(NowMicros());
    timeline_.Flush();
  }
  return progress;
}

bool Engine::PollInFlight() {
  bool progress = false;
  const int64_t now = NowMicros();
  const int64_t limit_us = static_cast<int64_t>(params_.stall_shutdown_seconds * 1e6);
  for (auto it = in_flight_.begin(); it != in_flight_.end();) {
    if (it->completion->Done()) {
      const std::string error = it->completion->Error();
      if (!error.empty()) Fail(it->label + " failed on rank " + std::to_string(rank()) + ": " + error);
      it = in_flight_.erase(it);
      --in_flight_count_;
      progress = true;
      continue;
    }
    if (limit_us > 0 && now - it->start_us > limit_us && !shutting_down_)
      Fail(it->label + " did not finish on the GPU within " + std::to_string(static_cast<int64_t>(params_.stall_shutdown_seconds)) +
           " s on rank " + std::to_string(rank()) +
           " (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS): a peer died or stopped taking part; NCCL was aborted");
    ++it;
  }
  return progress;
}

// Rank 0 has announced shutdown and every other rank acknowledged it.
bool Engine::Finished() const { return rank() == 0 && shutting_down_ && !shutdown_held_ && acks_ >= size() - 1; }

// HOROVOD_THREAD_AFFINITY: this thread on the core given for this local rank.
void Engine::PinThread() const {
  const std::vector<int>& cores = params_.thread_affinity;
  const int local = topology_->local_rank();
  if (cores.empty() || process_set_ != 0) return;
  if (static_cast<int>(cores.size()) <= local) {
    HVD_WARN("HOROVOD_THREAD_AFFINITY names " << cores.size() << " core(s), none for local rank " << local
                                              << "; its background thread is not pinned");
    return;
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cores[local], &set);
  if (const int rc = pthread_setaffinity_np(pthread_self(), sizeof(set), &set); rc != 0)
    HVD_WARN("HOROVOD_THREAD_AFFINITY: cannot pin the background thread to core " << cores[local] << ": "
                                                                                  << std::strerror(rc));
}

void Engine::Loop() {
  PinThread();
  int64_t last_progress = NowMicros();
  int64_t sleep_us = 0;
  const int64_t cap_us = std::max<int64_t>(1, static_cast<int64_t>(params_.cycle_time_ms * 1000));
  try {
    while (running_) {
      bool progress, stopping;
      {
        // A caller is running the engine (Drive). It wakes us when it lets go and
        // leaves work behind, so sleep until then rather than poll the lock.
        std::unique_lock<std::mutex> lk(step_mu_, std::try_to_lock);
        if (!lk.owns_lock()) {
          queue_.WaitForWork(kIdleWaitMicros);
          continue;
        }
        if (fatal_) std::rethrow_exception(fatal_);
        progress = Step();
        if (Finished()) break;
        stopping = shutting_down_;
      }
      const int64_t now = NowMicros();
      if (progress) {
        last_progress = now;
        sleep_us = 0;
        continue;
      }
      // A cycle in flight counts: the other ranks' cycles move on only as this rank
      // passes its messages on.
      const bool outstanding = queue_.HasOutstanding() || in_flight_count_ > 0 || cycle_->InFlight();
      if (!outstanding && !stopping) {
        queue_.WaitForWork(kIdleWaitMicros);  // nothing of ours in flight: sleep until work arrives
        last_progress = NowMicros();
        continue;
      }
      // Work is in flight. Poll without sleeping for a moment after progress, and for
      // as long as a caller is blocked waiting on a result: that caller's core would
      // be idle anyway, and a sleep here would add directly to its wait.
      if (spin_us_ > 0 && (now - last_progress < spin_us_ || handles_->Waiting() > 0)) {
        std::this_thread::yield();
        continue;
      }
      sleep_us = std::min(cap_us, std::max<int64_t>(10, sleep_us * 2));
      queue_.WaitForWork(sleep_us);
    }
  } catch (const PeerFailure& ex) {
    OnPeerFailure(ex.what());
  } catch (const std::exception& ex) {
    shutdown_reason_ = std::string("hvdlite engine failed: ") + ex.what();
    stopped_by_failure_ = true;
    HVD_ERROR(shutdown_reason_);
    registry_->AbortAll(shutdown_reason_);
  }
  std::lock_guard<std::mutex> lk(step_mu_);  // a caller may still be finishing a step
  if (shutdown_reason_.empty()) shutdown_reason_ = "hvdlite was shut down";
  running_ = false;
  // Device work queued before the shutdown: every rank queued the same, so it finishes
  // (after a failure it was aborted). If it does not within the stall limit (30 s
  // without one), a peer is gone: abort it, and give up on it a little later.
  const double limit_s = params_.stall_shutdown_seconds > 0 ? params_.stall_shutdown_seconds : 30.0;
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
                               << in_flight_.front().label);
      in_flight_.clear();
      in_flight_count_ = 0;
      break;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  cycle_->Cancel();
  channel_->Reap(true);
  for (TensorEntry& e : queue_.TakeAll())
    handles_->Complete(e.handle, false,
                       RequestLabel(e.request.type, e.request.name) + " did not finish: " + shutdown_reason_);
  timeline_.Flush();
}

// The caller's thread runs the engine until `h` is done, if the background thread is
// not running it right now: the caller's core would otherwise sit idle in the wait.
// While every rank of the host has a core to itself (spin_us_ > 0) it polls without
// sleeping until `h` is done. With more ranks than cores it yields at every poll and
// gives up after a cycle time without progress (a slow peer), leaving the wait to the
// background thread, which sleeps between polls. Shutdown and failures are left to the
// background thread, which is woken whenever the caller leaves work behind. With a
// deadline (>= 0) it returns by then, done or not.
void Engine::Drive(int64_t h, int64_t deadline_us) {
  if (!drive_) return;
  // Only an idle engine is taken over. While the background thread is busy (async
  // requests in flight) it notices results the moment they are in, and taking the
  // lock from it would only add hand-overs between the two threads; the caller then
  // waits as before, and the background thread polls without sleeping meanwhile.
  std::unique_lock<std::mutex> lk(step_mu_, std::try_to_lock);
  if (!lk.owns_lock()) return;
  ++waits_driven_;
  try {
    // Poll without yielding for the first spin_us_ after the last progress: a yield
    // costs a system call each time (~0.7 us here), which would add to every hop of
    // the negotiation. Past that the peer is slow, and the core is offered to others.
    const int64_t give_up_us = spin_us_ > 0 ? -1 : static_cast<int64_t>(params_.cycle_time_ms * 1000);
    int64_t last_progress = NowMicros();
    while (running_ && !shutting_down_ && !fatal_ && !handles_->Poll(h)) {
      if (Step()) {
        last_progress = NowMicros();
        if (deadline_us >= 0 && last_progress >= deadline_us) break;
        continue;
      }
      const int64_t now = NowMicros();
      if (deadline_us >= 0 && now >= deadline_us) break;
      const int64_t idle = now - last_progress;
      if (give_up_us >= 0 && idle >= give_up_us) {
        ++waits_handed_back_;
        break;
      }
      if (idle >= spin_us_) std::this_thread::yield();
    }
  } catch (const std::exception&) {
    fatal_ = std::current_exception();
  }
  const bool ending = !running_ || shutting_down_ || fatal_;
  lk.unlock();
  // Hand what is left (other callers' requests, async ones, a shutdown, device work to
  // watch) back to the background thread. Checked after unlocking: work pushed from
  // then on finds the lock free, and its own wake-up reaches the background thread.
  if (ending || stop_requested_ || queue_.HasOutstanding() || in_flight_count_ > 0) queue_.Wake();
}

bool Engine::Wait(int64_t h, std::string* error, bool release, std::shared_ptr<ReadyEvent>* ready,
                  int64_t deadline_us, bool* pending) {
  if (running_ && !handles_->Poll(h)) Drive(h, deadline_us);
  return handles_->Wait(h, error, release, ready, deadline_us, pending);
}

// What response `r` says of every rank's part of its `i`-th tensor, where a request
// alone does not say it: an allgather's rows per rank (its slice of the fused sizes),
// an alltoall's splits matrix. Empty for the other kinds.
std::vector<int64_t> Engine::PartsOf(const Response& r, size_t i) {
  if (r.type == RequestType::kAlltoall) return r.sizes;
  if (r.type != RequestType::kAllgather || r.names.empty()) return {};
  const size_t per = r.sizes.size() / r.names.size();
  return std::vector<int64_t>(r.sizes.begin() + static_cast<std::ptrdiff_t>(i * per),
                              r.sizes.begin() + static_cast<std::ptrdiff_t>((i + 1) * per));
}

Response Engine::FromCache(const std::vector<int32_t>& ids) const {
  Response r = ResponseTo(cache_.Get(ids.front()));
  for (int32_t id : ids) {
    const Request& q = cache_.Get(id);
    r.names.push_back(q.name);
    const std::vector<int64_t>& parts = cache_.Sizes(id);  // every rank's rows or splits
    if (parts.empty()) r.sizes.push_back(NumElements(q.shape));
    else r.sizes.insert(r.sizes.end(), parts.begin(), parts.end());
    r.cache_ids.push_back(id);
  }
  return r;
}

void Engine::Execute(const ResponseList& list) {
  HVD_DEBUG("executing " << list.responses.size() << " negotiated collective(s)");
  if (list.has_tunables) ApplyTunables(list.tunables);
  for (const Response& r : list.responses) Perform(r);
}

void Engine::ApplyTunables(const Tunables& t) {
  HVD_INFO("autotune: fusion threshold " << t.fusion_threshold_bytes << " B, cycle time " << t.cycle_time_ms
           << " ms, response cache " << (t.cache_enabled ? "on" : "off") << ", hierarchical allreduce "
           << t.hierarchical);
  params_.fusion_threshold_bytes = t.fusion_threshold_bytes;
  params_.cycle_time_ms = t.cycle_time_ms;
  registry_->SetFusionThreshold(t.fusion_threshold_bytes);
  const FusionLimits fusion[kNumDeviceKinds] = {registry_->Fusion(DeviceKind::kHost),
                                                registry_->Fusion(DeviceKind::kCuda)};
  cycle_->SetFusion(fusion);
  cycle_->SetBackoffCap(static_cast<int64_t>(t.cycle_time_ms * 1000));
  mpi_->SetHierarchicalAllreduce(t.hierarchical);
  // Off: rank 0 gives new tensors no entries, and the cycles evict the ones there are
  // (every rank alike, as when a rank joins); their requests go to rank 0 in full.
  caching_ = t.cache_enabled != 0;
  cycle_->SetEvictAll(join_outstanding_ || !caching_);
  if (coordinator_) {
    coordinator_->SetFusion(fusion);
    coordinator_->SetCaching(caching_);
  }
  std::function<void(const Tunables&)> tell;
  {
    std::lock_guard<std::mutex> lk(tunables_mu_);
    applied_ = t;
    ++tunables_applied_;
    tell = on_tunables_;
  }
  if (tell) tell(t);
}

void Engine::ProposeTunables(const Tunables& t) {
  if (!coordinator_) return;  // the set's other ranks apply what its rank 0 sends
  std::lock_guard<std::mutex> lk(tunables_mu_);
  proposed_ = t;
  has_proposal_.store(true, std::memory_order_release);
  queue_.Wake();
}

void Engine::OnTunablesApplied(std::function<void(const Tunables&)> fn) {
  std::lock_guard<std::mutex> lk(tunables_mu_);
  on_tunables_ = std::move(fn);
}

void Engine::Tune(const std::vector<std::string>& names, int64_t bytes) {
  Tunables next;
  if (tuner_->Record(names, bytes, NowMicros(), &next)) tunables_to_send_ = next;
  if (tuner_->Done()) tuner_.reset();  // settled: nothing more to count on the hot path
}

void Engine::Perform(const Response& r) {
  const size_t n = r.type == RequestType::kJoin ? 1 : r.names.size();
  HVD_LOG(0, RequestTypeName(r.type) << " of " << n << " tensor(s), first '" << (r.names.empty() ? "" : r.names[0])
                                     << "'" << (r.error.empty() ? "" : ", failing: " + r.error));
  std::vector<TensorEntry> entries(n);
  std::vector<char> have(n, 0);
  for (size_t i = 0; i < n; ++i)
    have[i] = queue_.Pop(r.type == RequestType::kJoin ? std::string("\x01join") : r.names[i], &entries[i]);

  // Remember the agreed signatures under the ids the coordinator assigned.
  if (r.error.empty() && r.joined_ranks.empty()) {
    for (size_t i = 0; i < r.cache_ids.size() && i < n; ++i) {
      if (r.cache_ids[i] < 0 || !have[i]) continue;
      if (cache_.Lookup(entries[i].request) == r.cache_ids[i]) continue;  // already known
      Request sig = entries[i].request;
      sig.rank = 0;
      cache_.Put(r.cache_ids[i], sig, PartsOf(r, i));
    }
  }

  auto fail_all = [&](const std::string& message) {
    std::vector<HandleTable::Result> results;
    for (size_t i = 0; i < n; ++i)
      if (have[i]) results.push_back({entries[i].handle, false, message, nullptr, nullptr});
    handles_->CompleteAll(std::move(results));
  };
  if (!r.error.empty()) return fail_all(r.error);
  if (tuner_) {
    int64_t bytes = 0;
    for (size_t i = 0; i < n; ++i)
      if (have[i]) bytes += NumElements(entries[i].request.shape) * DataTypeSize(entries[i].request.dtype);
    Tune(r.names, bytes);
  }
  if (timeline_.Active()) {
    const int64_t now = NowMicros();
    for (size_t i = 0; i < n; ++i)
      if (have[i]) timeline_.Phase(entries[i].request.name, "QUEUE", entries[i].enqueue_us, now);
  }
  switch (r.type) {
    case RequestType::kBarrier:
      // Negotiation already proved that every rank reached the barrier.
      if (have[0]) handles_->Complete(entries[0].handle, true, "");
      return;
    case RequestType::kJoin: {
      join_outstanding_ = false;  // every rank has joined
      cycle_->SetEvictAll(!caching_);
      if (!have[0]) return;
      auto out = std::make_unique<OutputBuffer>();
      out->aux = {r.last_joined};
      handles_->Complete(entries[0].handle, true, "", std::move(out));
      return;
    }
    default:
      break;
  }

  const std::string label = RequestLabel(r.type, r.names[0]) +
                            (n > 1 ? " (fused with " + std::to_string(n - 1) + " more)" : std::string());
  std::string why;
  Backend* backend = registry_->Select(r, &why);
  if (!backend) return fail_all(why);
  int32_t device = kCpuDevice;
  if (KindOfDevice(r.device) == DeviceKind::kCuda) {
    device = gpu_device_ >= 0 ? gpu_device_.load() : 0;  // a joined rank: the GPU it drives
    for (size_t i = 0; i < n; ++i)
      if (have[i]) device = entries[i].request.device;
  }
  Tracer tracer(&timeline_);
  CollectiveJob job{r, entries, have, tracer, {}, device};
  std::unique_ptr<Completion> completion;
  try {
    completion = backend->Run(job);
  } catch (const PeerFailure& ex) {
    fail_all(label + " failed on rank " + std::to_string(rank()) + ": a peer process failed (" + ex.what() + ")");
    throw;  // the engine stops (OnPeerFailure)
  } catch (const FailedOnEveryRank& ex) {
    return fail_all(label + " failed (" + backend->Name() + " backend, " + DeviceLabel(device) + "): " + ex.what());
  } catch (const std::exception& ex) {
    const std::string message = label + " failed on rank " + std::to_string(rank()) + " (" + backend->Name() +
                                " backend, " + DeviceLabel(device) + "): " + ex.what();
    fail_all(message);
    // The peers have queued their part on their GPUs and would wait for this rank's
    // forever: the job stops everywhere, with this reason.
    if (backend->Device() != DeviceKind::kHost) Fail(message);
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
    in_flight_.push_back(InFlight{std::move(completion), label, NowMicros()});
    ++in_flight_count_;
    ++device_collectives_;
  }
}

}  // namespace hvdlite
