#include "engine/engine.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <pthread.h>
#include <sched.h>

#include "backends/factory.h"
#include "common/logging.h"
#include "mpi/errors.h"
#include "transport/mpi/control_channel.h"

namespace hvdlite {
namespace {

constexpr int64_t kIdleWaitMicros = 100000;  // nothing in flight: wake this often anyway

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
void ShareRankZeroSettings(ControlTransport& channel, Parameters* p) {
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
    : handles_(handles), process_set_(process_set),
      timeline_(timeline ? Timeline(std::move(timeline), process_set) : Timeline()) {
  topology_ = std::make_unique<Topology>(comm);
  control_ = std::make_unique<ControlChannel>(comm, topology_->cross_size() == 1);
  const unsigned cores = std::thread::hardware_concurrency();
  Parameters job = params;
  ChooseTwoLevelSchedule(*topology_, cores, &job.two_level);
  ShareRankZeroSettings(*control_, &job);
  config_ = std::make_unique<Config>(job, topology_->hosts());
  const Parameters& p = config_->job();
  const int rank = topology_->rank(), size = topology_->size();
  if (process_set_ == 0) SetLogContext(rank, p.log_level);
  // Polling without sleeping only pays while every rank on this host has a core to
  // itself; with more ranks than cores it would take time from a rank that computes.
  spin_us_ = (cores == 0 || static_cast<unsigned>(topology_->local_size()) <= cores) ? p.spin_us : 0;
  // A blocked caller runs the engine itself unless polling is turned off (spin_us 0).
  // With more ranks than cores it yields the core at every poll (as Open MPI's
  // mpi_yield_when_idle does) and hands the wait back after a cycle time without
  // progress: there the background thread's hand-overs and sleeps between polls cost
  // each step of a small collective a scheduler round trip (docs/scale.md).
  drive_ = p.spin_us > 0;
  if (drive_) handles_->SetWaiterHook(process_set_, [this] { queue_.Wake(); });
  for (int t = 0; t < kNumRequestTypes; ++t) nccl_runs_[t] = p.gpu_backend[t] == "NCCL";
  if (spin_us_ > 0 && p.malloc_tuning) TuneHostAllocator();
  executor_ = std::make_unique<Executor>(MakeBackends(BackendContext{*topology_, control_.get(), &gpus_, config_.get()}),
                                         config_.get(), &queue_, handles_, &timeline_, &gpus_, rank, size);
  negotiator_ = std::make_unique<Negotiator>(control_.get(), config_.get(), &queue_, &timeline_, executor_.get(),
                                             process_set_);
  const bool two_level = executor_->registry().TwoLevelPossible();
  negotiator_->StartTuning(two_level);
  Executor::Hooks hooks;
  hooks.fail = [this](const std::string& reason) { negotiator_->Fail(reason); };
  hooks.shutting_down = [this] { return negotiator_->shutdown().Begun(); };
  if (negotiator_->Tuning())
    hooks.ran = [this](const std::vector<std::string>& names, int64_t bytes) {
      if (negotiator_->Tuning()) negotiator_->Tune(names, bytes);
    };
  executor_->SetHooks(std::move(hooks));
  // A set's rank 0 records what the world's rank 0 does not see: its set, where rank 0
  // is not a member (elsewhere the writer does not relay, and the flag does nothing).
  if (process_set_ != 0 && rank == 0) timeline_.SetRelays(true);
  if (process_set_ == 0 && !p.timeline_path.empty()) {
    std::string err;
    if (rank != 0) timeline_.writer()->StartRelay();
    else if (!timeline_.Start(p.timeline_path, p.timeline_mark_cycles, &err)) HVD_WARN(err);
  }
  HVD_INFO("engine started: rank " << rank << " of " << size << " (local " << topology_->local_rank() << " of "
           << topology_->local_size() << "), fusion threshold " << p.fusion_threshold_bytes
           << " B, cycle time " << p.cycle_time_ms << " ms, cache capacity " << p.cache_capacity
           << ", poll without yielding " << spin_us_ << " us"
           << (two_level ? (p.two_level.algorithm == 1 ? ", two-level schedule leader" : ", two-level schedule torus")
                         : ""));
  thread_ = std::thread([this] { Loop(); });
}

Engine::~Engine() {
  handles_->SetWaiterHook(process_set_, nullptr);
  Stop();
  timeline_.Stop();
  int finalized = 0;
  MPI_Finalized(&finalized);
  executor_->ReleaseBackends(/*leak=*/finalized != 0);  // NCCL communicators first, then MPI's
  if (finalized) {
    // A waiting thread outlived MPI itself: nothing left that can be freed safely.
    (void)negotiator_.release();
    (void)topology_.release();
    (void)control_.release();
  }
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
  negotiator_->Revoke();
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

bool Engine::MayAdvance(const Request& r) const {
  return drive_ && r.device != kCpuDevice && r.error.empty() && executor_->device_collectives() > 0 &&
         nccl_runs_[static_cast<int>(r.type)];
}

int64_t Engine::Enqueue(Request request, const void* input, void* output, bool caller_waits,
                        std::optional<uintptr_t> stream, bool advance) {
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
  e.enqueue_us = timeline_.Active() ? NowMicros() : CoarseNowMicros();
  if (e.request.device != kCpuDevice && e.request.error.empty()) {
    // A problem only this rank sees (no CUDA runtime here, a second GPU) is a refusal:
    // the collective then fails on every rank instead of leaving the others waiting.
    const std::string problem = executor_->PrepareGpuRequest(e, stream);
    if (!problem.empty()) e.request.error = RequestLabel(e.request.type, e.request.name) + ": " + problem;
  }
  // A GPU collective's submitter takes the step itself while the engine is idle: it
  // only queues NCCL on hvdlite's stream, and a hand-off to the background thread and
  // back would cost more than the step (tens of microseconds on a small host).
  advance = advance && !caller_waits && MayAdvance(e.request);
  if (!queue_.Push(e, /*wake=*/!((caller_waits || advance) && drive_))) {  // refused: `e` is intact
    handles_->Release(h);
    throw DuplicateName(RequestLabel(e.request.type, e.request.name) + ": another " + RequestTypeName(e.request.type) +
                        " with this name is already in flight on rank " + std::to_string(rank()) +
                        "; wait for it to finish or use a different name");
  }
  if (advance) Advance(h);
  return h;
}

std::shared_ptr<DeviceAllocation> Engine::AllocateDevice(int device, int64_t bytes) {
  return executor_->AllocateDevice(device, bytes);
}

void Engine::CopyOnDevice(int device, void* dst, const void* src, int64_t bytes, std::optional<uintptr_t> after) {
  executor_->CopyOnDevice(device, dst, src, bytes, after);
}

void Engine::ProposeTunables(const Tunables& t) { negotiator_->ProposeTunables(t); }

void Engine::OnTunablesApplied(std::function<void(const Tunables&)> fn) { negotiator_->OnTunablesApplied(std::move(fn)); }

Engine::Stats Engine::GetStats() const {
  Stats s;
  const Negotiator::Stats n = negotiator_->GetStats();
  s.requests_in_full = n.requests_in_full;
  s.requests_as_ids = n.requests_as_ids;
  s.cycles = n.cycles;
  s.carried = executor_->carried();
  s.control_bytes_sent = control_->bytes_sent();
  s.control_bytes_received = control_->bytes_received();
  s.waits_driven = waits_driven_;
  s.waits_handed_back = waits_handed_back_;
  s.submits_advanced = submits_advanced_;
  s.huge_page_extents = executor_->registry().Stats().huge_page_extents;
  s.device_collectives = executor_->device_collectives();
  s.tunables = config_->Snapshot(&s.tunables_applied);
  return s;
}

void Engine::OnPeerFailure(const std::string& what) {
  const std::vector<int> dead = FailedRanks(topology_->world());
  RevokeCommunicators();
  std::string who;
  for (size_t i = 0; i < dead.size(); ++i) who += (i ? ", " : "") + std::to_string(dead[i]);
  const std::string reason =
      dead.empty() ? "a peer process failed (" + what + ")"
                   : std::string(dead.size() == 1 ? "rank " : "ranks ") + who + " of " + std::to_string(size()) +
                         " failed (" + (dead.size() == 1 ? "its process" : "their processes") +
                         " died or lost contact): " + what;
  negotiator_->PeerFailed(reason);
  // In an elastic job the survivors go on: the front end says so in one warning, with
  // what it recovers to; here it is a detail.
  if (config_->job().elastic) HVD_INFO(reason);
  else HVD_ERROR(reason);
  executor_->Abort(reason);
}

// An elastic job runs with ULFM's failure detector (hvdlite-run --failure-timeout),
// which marks a peer that stopped sending heartbeats (its host cut off, its process
// stopped) as failed. Only operations that involve that peer then fail, and this rank
// may be waiting on others (rank 0 polls for any rank's requests, a worker for rank
// 0's word): so look for such marks now and then.
void Engine::CheckForSilentPeers() {
  const int64_t now = NowMicros();
  if (now - last_failure_check_us_ < kFailureCheckMicros) return;
  last_failure_check_us_ = now;
  if (!FailedRanks(topology_->world()).empty())
    throw PeerFailure("MPI's failure detector reports ranks that stopped answering");
}

// The engine has stopped: why, for other threads (written before running_ turns false).
void Engine::Settle() {
  if (!running_) return;
  negotiator_->DefaultReason("hvdlite was shut down");
  shutdown_reason_ = negotiator_->shutdown().reason();
  stopped_by_failure_ = negotiator_->shutdown().failure();
  peer_failed_ = negotiator_->shutdown().peer_failed();
  peer_unresponsive_ = negotiator_->shutdown().unresponsive();
  running_ = false;
}

// One round: device work first (on rank 0, GPU tensors held while it runs go out in
// this step), then the negotiation, which hands on what became agreed. Called with
// step_mu_ held. Returns what it did (kNegotiated, kDeviceWorkFinished), 0 if nothing.
int Engine::Step() {
  if (config_->job().elastic) CheckForSilentPeers();
  int done = executor_->InFlight() && executor_->PollInFlight() ? kDeviceWorkFinished : 0;
  if (negotiator_->Step(stop_requested_)) done |= kNegotiated;
  negotiator_->Reap();
  if (negotiator_->shutdown().Stopped()) Settle();  // a worker acknowledged the shutdown
  if (done && timeline_.Active()) {
    timeline_.CycleMark(NowMicros());
    timeline_.Flush();
  }
  return done;
}

// HOROVOD_THREAD_AFFINITY: this thread on the core given for this local rank.
void Engine::PinThread() const {
  const std::vector<int>& cores = config_->job().thread_affinity;
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
  const int64_t cap_us = std::max<int64_t>(1, config_->cycle_time_us());
  try {
    while (running_) {
      int done;
      bool stopping;
      {
        // A caller is running the engine (Drive). It wakes us when it lets go and
        // leaves work behind, so sleep until then rather than poll the lock.
        std::unique_lock<std::mutex> lk(step_mu_, std::try_to_lock);
        if (!lk.owns_lock()) {
          queue_.WaitForWork(kIdleWaitMicros);
          continue;
        }
        if (fatal_) std::rethrow_exception(fatal_);
        if (!running_) break;  // a caller's step stopped this rank
        done = Step();
        if (negotiator_->Finished()) break;
        stopping = negotiator_->shutdown().Begun();
      }
      const int64_t now = NowMicros();
      // Device work that finished is not a reason to poll again at once (see below).
      if (done & kNegotiated) {
        last_progress = now;
        sleep_us = 0;
        continue;
      }
      // A cycle in flight counts: the other ranks' cycles move on only as this rank
      // passes its messages on.
      const bool negotiating = queue_.HasOutstanding() || negotiator_->CycleInFlight();
      if (!negotiating && !executor_->InFlight() && !stopping) {
        queue_.WaitForWork(kIdleWaitMicros);  // nothing of ours in flight: sleep until work arrives
        last_progress = NowMicros();
        continue;
      }
      // Work is in flight. While requests are being negotiated, poll without sleeping
      // for a moment after progress, and for as long as a caller is blocked waiting on
      // a result: that caller's core would be idle anyway, and a sleep here would add
      // directly to its wait. Device work alone is watched with growing sleeps, up to
      // the cycle time: its handles are complete already, and a thread polling it
      // without pause would hold the engine against the submitters that queue GPU
      // collectives themselves (a collective finishing every few microseconds would
      // keep it polling for ever).
      if (spin_us_ > 0 && negotiating && (now - last_progress < spin_us_ || handles_->Waiting() > 0)) {
        std::this_thread::yield();
        continue;
      }
      sleep_us = std::min(cap_us, std::max<int64_t>(10, sleep_us * 2));
      queue_.WaitForWork(sleep_us);
    }
  } catch (const PeerFailure& ex) {
    OnPeerFailure(ex.what());
  } catch (const std::exception& ex) {
    const std::string reason = std::string("hvdlite engine failed: ") + ex.what();
    negotiator_->EngineFailed(reason);
    HVD_ERROR(reason);
    executor_->Abort(reason);
  }
  std::lock_guard<std::mutex> lk(step_mu_);  // a caller may still be finishing a step
  Settle();
  // Device work queued before the shutdown: every rank queued the same, so it finishes
  // (after a failure it was aborted). If it does not within the stall limit (30 s
  // without one), a peer is gone: abort it, and give up on it a little later.
  executor_->DrainInFlight();
  stopped_by_failure_ = negotiator_->shutdown().failure();  // a failure seen while draining
  negotiator_->Close();
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
// timeout (>= 0) it returns after about that long, done or not.
void Engine::Drive(int64_t h, int64_t timeout_us) {
  if (!drive_) return;
  // Only an idle engine is taken over. While the background thread is busy (async
  // requests in flight) it notices results the moment they are in, and taking the
  // lock from it would only add hand-overs between the two threads; the caller then
  // waits as before, and the background thread polls without sleeping meanwhile.
  std::unique_lock<std::mutex> lk(step_mu_, std::try_to_lock);
  if (!lk.owns_lock()) return;
  ++waits_driven_;
  try {
    // Poll without yielding for the first spin_us_ of idleness: a yield costs a system
    // call each time (~0.7 us here), which would add to every hop of the negotiation.
    // Past that the peer is slow, and the core is offered to others. The clock is read
    // only when a step finds nothing to do, and every kStepsPerClock steps that do: a
    // blocking collective is usually done within a step or two, and a clock read costs
    // as much as a tenth of such a step.
    const int64_t give_up_us = spin_us_ > 0 ? -1 : config_->cycle_time_us();
    int64_t idle_since = -1, deadline = -1;
    int unclocked = 0;
    // The caller has just seen `h` not done (Wait): the first step needs no look.
    for (bool first = true; Steppable() && (first || !handles_->Poll(h)); first = false) {
      const bool moved = Step() != 0;
      if (moved) idle_since = -1;
      if (moved && ++unclocked < kStepsPerClock) continue;
      unclocked = 0;
      const int64_t now = NowMicros();
      if (deadline < 0 && timeout_us >= 0) deadline = now + timeout_us;
      if (deadline >= 0 && now >= deadline) break;
      if (moved) continue;
      if (idle_since < 0) idle_since = now;
      const int64_t idle = now - idle_since;
      if (give_up_us >= 0 && idle >= give_up_us) {
        ++waits_handed_back_;
        break;
      }
      if (idle >= spin_us_) std::this_thread::yield();
    }
  } catch (const std::exception&) {
    fatal_ = std::current_exception();
  }
  HandBack(lk, /*watch_device=*/true);
}

// A submitter's step (Enqueue's `advance`): if no one runs the engine, one step, which
// queues the request's device work when the peers have it too; else the background
// thread is woken to take the request.
//
// The background thread's own steps are short while it only watches device work, so a
// submitter that finds the engine taken tries again for a moment (kAdvanceRetryMicros,
// long enough for a step whose thread the scheduler paused) before it hands the
// request over. Handing it over at the first miss made the misses feed themselves: the
// background thread, having negotiated the request, polled again at once and took the
// next submitter's turn too, and whole runs of requests went through it (at 1 rank on
// 2 loaded cores, 4 of 80 queued by their submitter).
void Engine::Advance(int64_t h) {
  std::unique_lock<std::mutex> lk(step_mu_, std::try_to_lock);
  for (int64_t until = -1; !lk.owns_lock();) {
    const int64_t now = NowMicros();
    if (until < 0) until = now + kAdvanceRetryMicros;
    if (now >= until) {
      queue_.Wake();
      return;
    }
    std::this_thread::yield();
    lk.try_lock();
  }
  try {
    if (Steppable() && !handles_->Poll(h)) Step();
  } catch (const std::exception&) {
    fatal_ = std::current_exception();
  }
  if (handles_->Poll(h)) ++submits_advanced_;
  // The device work it queued is left to the next step, whoever takes it: the
  // background thread looks at least every kIdleWaitMicros, and waking it for every
  // collective would put a thread hand-off back on the submitter's core.
  HandBack(lk, /*watch_device=*/false);
}

bool Engine::Steppable() const { return running_ && !negotiator_->shutdown().Begun() && !fatal_; }

// Hands what is left (other callers' requests, async ones, a shutdown, with
// `watch_device` device work to watch) back to the background thread. Checked after
// unlocking: work pushed from then on finds the lock free, and its own wake-up reaches
// the background thread.
void Engine::HandBack(std::unique_lock<std::mutex>& lk, bool watch_device) {
  const bool ending = !running_ || negotiator_->shutdown().Begun() || fatal_;
  lk.unlock();
  const bool device_work = watch_device && executor_->InFlight();
  if (ending || stop_requested_ || queue_.HasOutstanding() || device_work) queue_.Wake();
}

bool Engine::Wait(int64_t h, std::string* error, bool release, std::shared_ptr<ReadyEvent>* ready,
                  int64_t timeout_us, bool* pending) {
  if (running_ && !handles_->Poll(h)) Drive(h, timeout_us);
  return handles_->Wait(h, error, release, ready, timeout_us, pending);
}

}  // namespace hvdlite
