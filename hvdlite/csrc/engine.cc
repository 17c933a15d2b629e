#include "engine.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <sstream>
#include <stdexcept>

#include "logging.h"
#include "mpi_collectives.h"
#include "reduce_ops.h"

namespace hvdlite {
namespace {

constexpr int kTagRequest = 101;
constexpr int kTagResponse = 102;
constexpr int64_t kIdleWaitMicros = 100000;   // nothing in flight: wake this often anyway
constexpr int64_t kStallCheckEveryMicros = 1000000;

std::vector<uint8_t> Receive(MPI_Comm comm, int source, int tag, bool* got, int* from) {
  int flag = 0;
  MPI_Message msg;
  MPI_Status status;
  MPI_Improbe(source, tag, comm, &flag, &msg, &status);
  *got = flag != 0;
  if (!flag) return {};
  int count = 0;
  MPI_Get_count(&status, MPI_BYTE, &count);
  std::vector<uint8_t> buf(static_cast<size_t>(count));
  MPI_Mrecv(buf.data(), count, MPI_BYTE, &msg, MPI_STATUS_IGNORE);
  *from = status.MPI_SOURCE;
  return buf;
}

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

}  // namespace

Engine::Engine(MPI_Comm comm, const Parameters& params, HandleTable* handles)
    : params_(params), handles_(handles), cache_(params.cache_capacity), huge_pages_(params.huge_pages) {
  MPI_Comm_dup(comm, &ctrl_comm_);
  MPI_Comm_dup(comm, &data_comm_);
  MPI_Comm_set_errhandler(data_comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(ctrl_comm_, &rank_);
  MPI_Comm_size(ctrl_comm_, &size_);
  MPI_Comm_split_type(ctrl_comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local_comm_);
  MPI_Comm_rank(local_comm_, &local_rank_);
  MPI_Comm_size(local_comm_, &local_size_);
  MPI_Comm_split(ctrl_comm_, local_rank_, rank_, &cross_comm_);
  MPI_Comm_rank(cross_comm_, &cross_rank_);
  MPI_Comm_size(cross_comm_, &cross_size_);
  SetLogContext(rank_, params_.log_level);
  // Polling without sleeping only pays while every rank on this host has a core to
  // itself; with more ranks than cores it would take time from a rank that computes.
  const unsigned cores = std::thread::hardware_concurrency();
  spin_us_ = (cores == 0 || static_cast<unsigned>(local_size_) <= cores) ? params_.spin_us : 0;
  if (spin_us_ > 0) handles_->SetWaiterHook([this] { queue_.Wake(); });
  if (spin_us_ > 0 && params_.malloc_tuning) TuneHostAllocator();
  InitReduceOps();
  collectives_ = std::make_unique<MpiCollectives>(data_comm_, params_.ring_min_segment_bytes);
  if (rank_ == 0) coordinator_ = std::make_unique<Coordinator>(size_, params_, &cache_, &timeline_);
  if (rank_ == 0 && !params_.timeline_path.empty()) {
    std::string err;
    if (!timeline_.Start(params_.timeline_path, params_.timeline_mark_cycles, &err)) HVD_WARN(err);
  }
  HVD_INFO("engine started: rank " << rank_ << " of " << size_ << " (local " << local_rank_ << " of " << local_size_
           << "), fusion threshold " << params_.fusion_threshold_bytes << " B, cycle time " << params_.cycle_time_ms
           << " ms, cache capacity " << params_.cache_capacity << ", poll without yielding " << spin_us_ << " us");
  thread_ = std::thread([this] { Loop(); });
}

Engine::~Engine() {
  handles_->SetWaiterHook(nullptr);
  Stop();
  timeline_.Stop();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;  // a waiting thread outlived MPI itself; nothing left to free
  for (MPI_Comm* c : {&ctrl_comm_, &data_comm_, &local_comm_, &cross_comm_})
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
}

void Engine::Stop() {
  stop_requested_ = true;
  queue_.Wake();
  if (thread_.joinable()) thread_.join();
}

bool Engine::StartTimeline(const std::string& path, bool mark_cycles, std::string* error) {
  if (rank_ != 0) return true;  // rank 0 writes the timeline
  return timeline_.Start(path, mark_cycles, error);
}

void Engine::StopTimeline() { timeline_.Stop(); }

int64_t Engine::Enqueue(Request request, const void* input, void* output, bool caller_waits) {
  const int64_t h = handles_->Create();
  request.rank = rank_;
  if (!running_) {
    handles_->Complete(h, false, RequestLabel(request.type, request.name) + ": hvdlite has been shut down" +
                                     (shutdown_reason_.empty() ? "" : " (" + shutdown_reason_ + ")"));
    return h;
  }
  if (request.device != kCpuDevice && request.error.empty()) {
    handles_->Complete(h, false, RequestLabel(request.type, request.name) + ": the engine takes host memory only; GPU tensors must be staged through the host");
    return h;
  }
  TensorEntry e;
  e.request = std::move(request);
  e.input = input;
  e.output = output;
  e.handle = h;
  e.enqueue_us = NowMicros();
  if (!queue_.Push(e, /*wake=*/!(caller_waits && spin_us_ > 0))) {  // refused: `e` is intact
    handles_->Complete(h, false, RequestLabel(e.request.type, e.request.name) + ": a " +
                                     RequestTypeName(e.request.type) + " with this name is already in flight on rank " +
                                     std::to_string(rank_) + "; wait for it to finish or use a different name");
  }
  return h;
}

Engine::Stats Engine::GetStats() const {
  Stats s;
  s.requests_in_full = requests_in_full_;
  s.requests_as_ids = requests_as_ids_;
  s.control_bytes_sent = control_bytes_sent_;
  s.control_bytes_received = control_bytes_received_;
  s.waits_driven = waits_driven_;
  s.huge_page_extents = huge_pages_.collapsed();
  return s;
}

void Engine::Send(int dest, int tag, std::shared_ptr<std::vector<uint8_t>> bytes) {
  control_bytes_sent_ += static_cast<int64_t>(bytes->size());
  PendingSend s;
  s.bytes = std::move(bytes);
  MPI_Isend(s.bytes->data(), static_cast<int>(s.bytes->size()), MPI_BYTE, dest, tag, ctrl_comm_, &s.request);
  sends_.push_back(std::move(s));
}

void Engine::ReapSends(bool wait_all) {
  for (auto it = sends_.begin(); it != sends_.end();) {
    int done = 0;
    if (wait_all) {
      MPI_Wait(&it->request, MPI_STATUS_IGNORE);
      done = 1;
    } else {
      MPI_Test(&it->request, &done, MPI_STATUS_IGNORE);
    }
    it = done ? sends_.erase(it) : std::next(it);
  }
}

void Engine::BeginShutdown(const std::string& reason) {
  if (shutting_down_) return;
  shutting_down_ = true;
  shutdown_reason_ = reason;
  ResponseList s;
  s.shutdown = true;
  s.shutdown_reason = reason;
  auto bytes = std::make_shared<std::vector<uint8_t>>(Serialize(s));
  for (int r = 1; r < size_; ++r) Send(r, kTagResponse, bytes);
}

bool Engine::CoordinatorStep() {
  bool progress = false;
  const int64_t now = NowMicros();
  for (Request& r : queue_.TakeNew()) {
    progress = true;
    if (shutting_down_) continue;
    const int32_t id = cache_.Lookup(r);
    ++(id >= 0 ? requests_as_ids_ : requests_in_full_);
    if (id >= 0) coordinator_->AddCacheHit(rank_, id, now);
    else coordinator_->AddRequest(r, now);
  }
  while (size_ > 1) {  // alone, there is no one to hear from (and probing costs a system call)
    bool got = false;
    int from = -1;
    std::vector<uint8_t> buf = Receive(ctrl_comm_, MPI_ANY_SOURCE, kTagRequest, &got, &from);
    if (!got) break;
    progress = true;
    control_bytes_received_ += static_cast<int64_t>(buf.size());
    RequestList list = DeserializeRequestList(buf.data(), buf.size());
    if (list.shutdown_ack) {
      ++acks_;
      continue;
    }
    if (shutting_down_) continue;
    const int64_t t = NowMicros();
    for (int32_t id : list.cache_hits) coordinator_->AddCacheHit(from, id, t);
    for (Request& r : list.requests) coordinator_->AddRequest(r, t);
    if (list.shutdown) BeginShutdown("rank " + std::to_string(from) + " shut down (it called shutdown() or its process is exiting)");
  }
  if (stop_requested_ && !shutting_down_) BeginShutdown("rank 0 shut down (it called shutdown() or its process is exiting)");
  if (!shutting_down_) {
    ResponseList ready = coordinator_->TakeReady();
    if (!ready.order.empty()) {
      progress = true;
      if (size_ > 1) {
        auto bytes = std::make_shared<std::vector<uint8_t>>(Serialize(ready));
        for (int r = 1; r < size_; ++r) Send(r, kTagResponse, bytes);
      }
      Execute(ready);
    }
    const int64_t t = NowMicros();
    if (t - last_stall_check_us_ >= kStallCheckEveryMicros) {
      last_stall_check_us_ = t;
      std::string reason = coordinator_->CheckStalls(t);
      if (!reason.empty()) {
        HVD_ERROR(reason);
        BeginShutdown(reason);
      }
    }
  }
  return progress;
}

bool Engine::WorkerStep() {
  bool progress = false;
  std::vector<Request> fresh = queue_.TakeNew();
  const bool ask_shutdown = stop_requested_ && !shutting_down_;
  if (!fresh.empty() || ask_shutdown) {
    progress = true;
    RequestList list;
    for (Request& r : fresh) {
      const int32_t id = cache_.Lookup(r);
      if (id >= 0) list.cache_hits.push_back(id);
      else list.requests.push_back(std::move(r));
    }
    requests_in_full_ += static_cast<int64_t>(list.requests.size());
    requests_as_ids_ += static_cast<int64_t>(list.cache_hits.size());
    if (ask_shutdown) {
      list.shutdown = true;
      shutting_down_ = true;
    }
    Send(0, kTagRequest, std::make_shared<std::vector<uint8_t>>(Serialize(list)));
  }
  while (true) {
    bool got = false;
    int from = -1;
    std::vector<uint8_t> buf = Receive(ctrl_comm_, 0, kTagResponse, &got, &from);
    if (!got) break;
    progress = true;
    control_bytes_received_ += static_cast<int64_t>(buf.size());
    ResponseList list = DeserializeResponseList(buf.data(), buf.size());
    if (list.shutdown) {
      shutdown_reason_ = list.shutdown_reason;
      RequestList ack;
      ack.shutdown_ack = true;
      Send(0, kTagRequest, std::make_shared<std::vector<uint8_t>>(Serialize(ack)));
      running_ = false;
      return true;
    }
    Execute(list);
    // Return now: a caller driving the engine is likely waiting on what just ran, and
    // a further probe here would delay its return. The next step reads on.
    return true;
  }
  return progress;
}

// One round: announce new requests, take in what arrived, run what became ready.
// Called with step_mu_ held.
bool Engine::Step() {
  const bool progress = rank_ == 0 ? CoordinatorStep() : WorkerStep();
  ReapSends(false);
  if (progress && timeline_.Active()) {
    timeline_.CycleMark(NowMicros());
    timeline_.Flush();
  }
  return progress;
}

// Rank 0 has announced shutdown and every other rank acknowledged it.
bool Engine::Finished() const { return rank_ == 0 && shutting_down_ && acks_ >= size_ - 1; }

void Engine::Loop() {
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
        if (!fatal_.empty()) throw std::runtime_error(fatal_);
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
      const bool outstanding = queue_.HasOutstanding();
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
  } catch (const std::exception& ex) {
    shutdown_reason_ = std::string("hvdlite engine failed: ") + ex.what();
    HVD_ERROR(shutdown_reason_);
  }
  std::lock_guard<std::mutex> lk(step_mu_);  // a caller may still be finishing a step
  if (shutdown_reason_.empty()) shutdown_reason_ = "hvdlite was shut down";
  running_ = false;
  ReapSends(true);
  for (TensorEntry& e : queue_.TakeAll())
    handles_->Complete(e.handle, false,
                       RequestLabel(e.request.type, e.request.name) + " did not finish: " + shutdown_reason_);
  timeline_.Flush();
}

// The caller's thread runs the engine until `h` is done, if the background thread is
// not running it right now. It polls without sleeping, which is only done while every
// rank of the host has a core to itself (spin_us_ > 0); the caller's core would
// otherwise sit idle in the wait. Shutdown and failures are left to the background
// thread, which is woken whenever the caller leaves work behind.
void Engine::Drive(int64_t h) {
  if (spin_us_ == 0) return;
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
    int64_t last_progress = NowMicros();
    while (running_ && !shutting_down_ && fatal_.empty() && !handles_->Poll(h)) {
      if (Step()) {
        last_progress = NowMicros();
      } else if (NowMicros() - last_progress >= spin_us_) {
        std::this_thread::yield();
      }
    }
  } catch (const std::exception& ex) {
    fatal_ = ex.what();
  }
  const bool ending = !running_ || shutting_down_ || !fatal_.empty();
  lk.unlock();
  // Hand what is left (other callers' requests, async ones, a shutdown) back to the
  // background thread. Checked after unlocking: work pushed from then on finds the
  // lock free, and its own wake-up reaches the background thread.
  if (ending || stop_requested_ || queue_.HasOutstanding()) queue_.Wake();
}

bool Engine::Wait(int64_t h, std::string* error, bool release) {
  if (running_ && !handles_->Poll(h)) Drive(h);
  return handles_->Wait(h, error, release);
}

Response Engine::FromCache(const std::vector<int32_t>& ids) const {
  Response r = ResponseTo(cache_.Get(ids.front()));
  for (int32_t id : ids) {
    const Request& q = cache_.Get(id);
    r.names.push_back(q.name);
    r.sizes.push_back(NumElements(q.shape));
    r.cache_ids.push_back(id);
  }
  return r;
}

void Engine::Execute(const ResponseList& list) {
  HVD_DEBUG("executing " << list.order.size() << " collective(s): " << list.responses.size() << " negotiated, "
                         << list.cached.size() << " agreed through the response cache");
  for (int32_t idx : list.order) {
    if (idx >= 0) Perform(list.responses[idx]);
    else Perform(FromCache(list.cached[-idx - 1]));
  }
}

void Engine::Trace(const TensorEntry& e, const char* phase, int64_t start, int64_t end) {
  timeline_.Phase(e.request.name, phase, start, end);
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
      cache_.Put(r.cache_ids[i], sig);
    }
  }

  if (!r.error.empty()) {
    for (size_t i = 0; i < n; ++i)
      if (have[i]) handles_->Complete(entries[i].handle, false, r.error);
    return;
  }
  if (timeline_.Active()) {
    const int64_t now = NowMicros();
    for (size_t i = 0; i < n; ++i)
      if (have[i]) Trace(entries[i], "QUEUE", entries[i].enqueue_us, now);
  }
  try {
    switch (r.type) {
      case RequestType::kAllreduce:
        DoAllreduce(r, entries, have);
        return;  // completes its own handles
      case RequestType::kAllgather:
        DoAllgather(r, entries, have);
        return;
      case RequestType::kAlltoall:
        if (have[0]) DoAlltoall(r, entries[0]);
        return;
      case RequestType::kReducescatter:
        if (have[0]) DoReducescatter(r, entries[0]);
        return;
      case RequestType::kBroadcast: {
        if (!have[0]) return;
        const int64_t t0 = NowMicros();
        void* buf = entries[0].output ? entries[0].output : const_cast<void*>(entries[0].input);
        const int64_t bytes = r.sizes[0] * DataTypeSize(r.dtype);
        if (bytes > 0) collectives_->Broadcast(buf, bytes, r.root);
        if (timeline_.Active()) Trace(entries[0], "MPI_BCAST", t0, NowMicros());
        handles_->Complete(entries[0].handle, true, "");
        return;
      }
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
    }
  } catch (const std::exception& ex) {
    for (size_t i = 0; i < n; ++i)
      if (have[i]) handles_->Complete(entries[i].handle, false,
                                      RequestLabel(r.type, r.names[i]) + " failed: " + ex.what());
  }
}

// A fused allreduce on host memory. Tensors too big to share a piece are reduced
// straight from their own memory (no copy) in cache-sized chunks; small ones are
// packed into a cache-sized piece of the fusion buffer, reduced there, and copied out
// while the piece is still in cache. Ranks that joined contribute zeros.
void Engine::DoAllreduce(const Response& r, std::vector<TensorEntry>& entries, const std::vector<char>& have) {
  const size_t n = r.names.size();
  const DataType dt = r.dtype;
  const int64_t es = DataTypeSize(dt);
  const double pre = r.prescale;
  // Average divides by the whole world, joined ranks included: they count as zeros (as in Horovod).
  const double post = r.postscale * (r.reduce_op == ReduceOp::kAverage ? 1.0 / size_ : 1.0);
  const ReduceOp op = r.reduce_op == ReduceOp::kAverage ? ReduceOp::kSum : r.reduce_op;
  const int64_t chunk_bytes = std::max<int64_t>(es, params_.host_chunk_bytes);
  const int64_t chunk_elems = std::max<int64_t>(1, chunk_bytes / es);
  const bool trace = timeline_.Active();

  // Plan: a list of steps, each either one tensor alone or a piece of several.
  struct Step {
    std::vector<size_t> members;
  };
  std::vector<Step> plan;
  Step piece;
  int64_t piece_elems = 0;
  for (size_t i = 0; i < n; ++i) {
    const int64_t cnt = r.sizes[i];
    if (cnt == 0) continue;
    if (n == 1 || cnt * es >= std::min(params_.fusion_direct_bytes, chunk_bytes / 2)) {
      plan.push_back(Step{{i}});
      continue;
    }
    if (piece_elems + cnt > chunk_elems) {
      plan.push_back(std::move(piece));
      piece = Step{};
      piece_elems = 0;
    }
    piece.members.push_back(i);
    piece_elems += cnt;
  }
  if (!piece.members.empty()) plan.push_back(std::move(piece));

  for (const Step& step : plan) {
    if (step.members.size() == 1) {
      const size_t i = step.members[0];
      const int64_t cnt = r.sizes[i];
      const int64_t t0 = NowMicros();
      if (have[i]) {
        huge_pages_.Prepare(entries[i].input, cnt * es);
        if (entries[i].output != entries[i].input) huge_pages_.Prepare(entries[i].output, cnt * es);
      }
      for (int64_t off = 0; off < cnt; off += chunk_elems) {
        const int64_t c = std::min(chunk_elems, cnt - off);
        if (!have[i]) {
          uint8_t* z = scratch_.Get(c * es);
          std::memset(z, 0, static_cast<size_t>(c * es));
          // The same factor as every other rank: a backend may scale on any rank's behalf.
          collectives_->Allreduce(z, z, c, dt, op, post);
          continue;
        }
        const uint8_t* src = static_cast<const uint8_t*>(entries[i].input) + off * es;
        uint8_t* dst = static_cast<uint8_t*>(entries[i].output) + off * es;
        if (pre != 1.0) {
          ScaleCopy(dst, src, c, dt, pre);
          src = dst;
        }
        collectives_->Allreduce(src, dst, c, dt, op, post);
      }
      if (trace && have[i]) Trace(entries[i], "MPI_ALLREDUCE", t0, NowMicros());
      continue;
    }
    // Pack, reduce, unpack one piece.
    int64_t total = 0;
    for (size_t i : step.members) total += r.sizes[i];
    uint8_t* buf = fusion_.Get(chunk_bytes);
    int64_t off = 0;
    std::vector<int64_t> copy_in_end(step.members.size());
    const int64_t t_in = NowMicros();
    for (size_t k = 0; k < step.members.size(); ++k) {
      const size_t i = step.members[k];
      const int64_t c = r.sizes[i];
      if (!have[i]) std::memset(buf + off * es, 0, static_cast<size_t>(c * es));
      else if (pre != 1.0) ScaleCopy(buf + off * es, entries[i].input, c, dt, pre);
      else std::memcpy(buf + off * es, entries[i].input, static_cast<size_t>(c * es));
      off += c;
      if (trace) copy_in_end[k] = NowMicros();
    }
    const int64_t t_mpi = NowMicros();
    huge_pages_.Prepare(buf, total * es);
    collectives_->Allreduce(buf, buf, total, dt, op, 1.0);  // scaled as it is copied out
    const int64_t t_out = NowMicros();
    off = 0;
    for (size_t k = 0; k < step.members.size(); ++k) {
      const size_t i = step.members[k];
      const int64_t c = r.sizes[i];
      const int64_t s = trace ? NowMicros() : 0;
      if (have[i]) {
        if (post != 1.0) ScaleCopy(entries[i].output, buf + off * es, c, dt, post);
        else std::memcpy(entries[i].output, buf + off * es, static_cast<size_t>(c * es));
        if (trace) {
          Trace(entries[i], "MEMCPY_IN_FUSION_BUFFER", k ? copy_in_end[k - 1] : t_in, copy_in_end[k]);
          Trace(entries[i], "MPI_ALLREDUCE", t_mpi, t_out);
          Trace(entries[i], "MEMCPY_OUT_FUSION_BUFFER", s, NowMicros());
        }
      }
      off += c;
    }
  }
  for (size_t i = 0; i < n; ++i)
    if (have[i]) handles_->Complete(entries[i].handle, true, "");
}

// An allgather of one tensor or of several fused ones (r.sizes: the first dimension
// of each name on each rank, name after name). One tensor is gathered straight from
// its own memory into its output. Several are packed, rank by rank, into one block per
// rank: this rank copies its tensors into the fusion buffer, one MPI_Allgatherv moves
// every block, and each output is cut from the blocks of all ranks. The coordinator
// fuses only small tensors, so the copies stay in cache.
void Engine::DoAllgather(const Response& r, std::vector<TensorEntry>& entries, const std::vector<char>& have) {
  const size_t n = r.names.size();
  for (size_t i = 0; i < n; ++i)  // every rank submitted it before rank 0 answered
    if (!have[i]) throw std::runtime_error("allgather '" + r.names[i] + "' is not queued on this rank");
  const int64_t t0 = NowMicros();
  std::vector<int64_t> row(n);  // bytes per row of each tensor
  std::vector<std::unique_ptr<OutputBuffer>> outs(n);
  std::vector<int64_t> block(size_, 0);  // bytes each rank contributes
  for (size_t i = 0; i < n; ++i) {
    const std::vector<int64_t>& shape = entries[i].request.shape;
    row[i] = RowElements(shape) * DataTypeSize(entries[i].request.dtype);
    int64_t rows = 0;
    for (int q = 0; q < size_; ++q) {
      const int64_t k = r.sizes[i * size_ + q];
      rows += k;
      block[q] += k * row[i];
    }
    auto& out = outs[i];
    out = std::make_unique<OutputBuffer>();
    out->bytes = rows * row[i];
    out->data.reset(new uint8_t[std::max<int64_t>(1, out->bytes)]);
    out->dtype = entries[i].request.dtype;
    out->shape = shape;
    out->shape[0] = rows;
  }
  int64_t total = 0;
  for (int64_t b : block) total += b;
  const bool trace = timeline_.Active();
  if (n == 1) {
    if (total > 0) collectives_->Allgatherv(entries[0].input, block[rank_], outs[0]->data.get(), block);
    if (trace) Trace(entries[0], "MPI_ALLGATHER", t0, NowMicros());
  } else if (total > 0) {
    uint8_t* buf = fusion_.Get(total + block[rank_]);
    uint8_t* mine = buf + total;  // this rank's block, packed
    int64_t off = 0;
    for (size_t i = 0; i < n; ++i) {
      const int64_t bytes = r.sizes[i * size_ + rank_] * row[i];
      std::memcpy(mine + off, entries[i].input, static_cast<size_t>(bytes));
      off += bytes;
    }
    const int64_t t_mpi = NowMicros();
    collectives_->Allgatherv(mine, block[rank_], buf, block);
    const int64_t t_out = NowMicros();
    std::vector<int64_t> at(size_);  // where the next tensor starts in each rank's block
    int64_t start_q = 0;
    for (int q = 0; q < size_; ++q) {
      at[q] = start_q;
      start_q += block[q];
    }
    for (size_t i = 0; i < n; ++i) {
      uint8_t* dst = outs[i]->data.get();
      for (int q = 0; q < size_; ++q) {
        const int64_t bytes = r.sizes[i * size_ + q] * row[i];
        std::memcpy(dst, buf + at[q], static_cast<size_t>(bytes));
        dst += bytes;
        at[q] += bytes;
      }
    }
    if (trace) {
      const int64_t t_end = NowMicros();
      for (size_t i = 0; i < n; ++i) {
        Trace(entries[i], "MEMCPY_IN_FUSION_BUFFER", t0, t_mpi);
        Trace(entries[i], "MPI_ALLGATHER", t_mpi, t_out);
        Trace(entries[i], "MEMCPY_OUT_FUSION_BUFFER", t_out, t_end);
      }
    }
  }
  for (size_t i = 0; i < n; ++i) handles_->Complete(entries[i].handle, true, "", std::move(outs[i]));
}

void Engine::DoAlltoall(const Response& r, TensorEntry& e) {
  const int64_t t0 = NowMicros();
  const std::vector<int64_t>& shape = e.request.shape;
  const int64_t row = RowElements(shape) * DataTypeSize(r.dtype);
  std::vector<int64_t> send(size_), recv(size_);
  auto out = std::make_unique<OutputBuffer>();
  int64_t rows = 0, total_send = 0, total_recv = 0;
  for (int q = 0; q < size_; ++q) {
    send[q] = r.sizes[rank_ * size_ + q] * row;
    recv[q] = r.sizes[q * size_ + rank_] * row;
    rows += r.sizes[q * size_ + rank_];
    out->aux.push_back(r.sizes[q * size_ + rank_]);
    total_send += send[q];
    total_recv += recv[q];
  }
  out->data.reset(new uint8_t[std::max<int64_t>(1, total_recv)]);
  out->bytes = total_recv;
  out->dtype = r.dtype;
  out->shape = shape;
  out->shape[0] = rows;
  // Every rank runs the collective unless nobody moves any data.
  int64_t moved = 0;
  for (int64_t v : r.sizes) moved += v;
  if (moved > 0 && row > 0) collectives_->Alltoallv(e.input, send, out->data.get(), recv);
  if (timeline_.Active()) Trace(e, "MPI_ALLTOALL", t0, NowMicros());
  handles_->Complete(e.handle, true, "", std::move(out));
}

void Engine::DoReducescatter(const Response& r, TensorEntry& e) {
  const int64_t t0 = NowMicros();
  const std::vector<int64_t>& shape = e.request.shape;
  const DataType dt = r.dtype;
  const int64_t es = DataTypeSize(dt);
  const int64_t row_elems = RowElements(shape);
  const int64_t dim0 = shape[0];
  std::vector<int64_t> counts(size_);
  for (int q = 0; q < size_; ++q) counts[q] = (dim0 / size_ + (q < dim0 % size_ ? 1 : 0)) * row_elems;
  auto out = std::make_unique<OutputBuffer>();
  const int64_t my = counts[rank_];
  out->data.reset(new uint8_t[std::max<int64_t>(1, my * es)]);
  out->bytes = my * es;
  out->dtype = dt;
  out->shape = shape;
  out->shape[0] = my / std::max<int64_t>(1, row_elems);
  if (row_elems == 0) out->shape[0] = dim0 / size_ + (rank_ < dim0 % size_ ? 1 : 0);
  const int64_t total = dim0 * row_elems;
  if (total > 0) {
    const void* src = e.input;
    if (r.prescale != 1.0) {
      uint8_t* tmp = scratch_.Get(total * es);
      ScaleCopy(tmp, e.input, total, dt, r.prescale);
      src = tmp;
    }
    const ReduceOp op = r.reduce_op == ReduceOp::kAverage ? ReduceOp::kSum : r.reduce_op;
    collectives_->ReduceScatter(src, out->data.get(), counts, dt, op);
    const double post = r.postscale * (r.reduce_op == ReduceOp::kAverage ? 1.0 / size_ : 1.0);
    ScaleBuffer(out->data.get(), my, dt, post);
  }
  if (timeline_.Active()) Trace(e, "MPI_REDUCESCATTER", t0, NowMicros());
  handles_->Complete(e.handle, true, "", std::move(out));
}

}  // namespace hvdlite
