// The engine: one per process, owning the background thread, the control plane
// (rank 0 coordinates, every rank talks to it point-to-point on a private
// communicator), and the data plane (collectives through a backend).
//
// Lifetime: constructed by init (collective over the communicator), Stop() by
// shutdown (collective: the first rank to stop stops every rank), destroyed after.
#pragma once

#include <mpi.h>

#include <atomic>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "collectives.h"
#include "coordinator.h"
#include "fusion_buffer.h"
#include "handle_table.h"
#include "host_memory.h"
#include "message.h"
#include "parameters.h"
#include "response_cache.h"
#include "tensor_queue.h"
#include "timeline.h"

namespace hvdlite {

class Engine {
 public:
  // Duplicates `comm` (collective over it) and starts the background thread.
  Engine(MPI_Comm comm, const Parameters& params, HandleTable* handles);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  int cross_rank() const { return cross_rank_; }
  int cross_size() const { return cross_size_; }
  bool Running() const { return running_; }
  // Why the engine stopped (set once the background thread has ended).
  std::string ShutdownReason() const { return running_ ? std::string() : shutdown_reason_; }

  // Queues one request; returns its handle at once (already failed on bad input).
  // `caller_waits`: the caller will Wait() on the handle right away, so there is no
  // need to wake the background thread (the caller may run the engine itself).
  int64_t Enqueue(Request request, const void* input, void* output, bool caller_waits = false);
  // Blocks until handle `h` is done (see HandleTable::Wait). While no one else is
  // running the engine, the calling thread runs it itself until `h` is done, instead
  // of waking the background thread and being woken again (two thread hand-offs per
  // blocking call, ~50 us each on a small VM).
  bool Wait(int64_t h, std::string* error, bool release = false);
  void Stop();

  // Control-plane counters since init, for diagnostics and the benchmark's response
  // cache measurement.
  struct Stats {
    int64_t requests_in_full = 0;     // this rank's requests sent with their full description
    int64_t requests_as_ids = 0;      // ... sent as response-cache ids
    int64_t control_bytes_sent = 0;   // bytes this rank sent on the control plane
    int64_t control_bytes_received = 0;
    int64_t waits_driven = 0;         // blocking waits in which the caller ran the engine itself
    int64_t huge_page_extents = 0;    // 2 MiB extents of reused buffers remapped as huge pages
  };
  Stats GetStats() const;

  bool StartTimeline(const std::string& path, bool mark_cycles, std::string* error);
  void StopTimeline();

 private:
  void Loop();
  bool Step();
  bool Finished() const;
  void Drive(int64_t h);
  bool CoordinatorStep();
  bool WorkerStep();
  void Send(int dest, int tag, std::shared_ptr<std::vector<uint8_t>> bytes);
  void ReapSends(bool wait_all);
  void BeginShutdown(const std::string& reason);
  void Execute(const ResponseList& list);
  Response FromCache(const std::vector<int32_t>& ids) const;
  void Perform(const Response& response);
  void DoAllreduce(const Response& r, std::vector<TensorEntry>& entries, const std::vector<char>& have);
  void DoAllgather(const Response& r, std::vector<TensorEntry>& entries, const std::vector<char>& have);
  void DoAlltoall(const Response& r, TensorEntry& e);
  void DoReducescatter(const Response& r, TensorEntry& e);
  void Trace(const TensorEntry& e, const char* phase, int64_t start, int64_t end);

  Parameters params_;
  HandleTable* handles_;
  MPI_Comm ctrl_comm_ = MPI_COMM_NULL;   // control plane, point-to-point
  MPI_Comm data_comm_ = MPI_COMM_NULL;   // data plane, collectives
  MPI_Comm local_comm_ = MPI_COMM_NULL;
  MPI_Comm cross_comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1, cross_rank_ = 0, cross_size_ = 1;

  std::unique_ptr<Collectives> collectives_;
  TensorQueue queue_;
  ResponseCache cache_;
  Timeline timeline_;
  std::unique_ptr<Coordinator> coordinator_;  // rank 0 only
  FusionBuffer fusion_;
  FusionBuffer scratch_;
  HugePages huge_pages_;

  struct PendingSend {
    MPI_Request request;
    std::shared_ptr<std::vector<uint8_t>> bytes;
  };
  std::list<PendingSend> sends_;

  std::thread thread_;
  // Held by whichever thread runs a step: the background thread, or a caller that
  // runs the engine while it waits (Drive). Everything the steps touch (control
  // plane, coordinator, cache, fusion buffers, pending sends) is guarded by it.
  std::mutex step_mu_;
  std::string fatal_;  // an exception a driving caller caught; the loop rethrows it
  std::atomic<bool> stop_requested_{false};
  std::atomic<bool> running_{true};
  bool shutting_down_ = false;   // coordinator: shutdown announced; worker: asked for it
  int acks_ = 0;
  std::string shutdown_reason_;
  int64_t last_stall_check_us_ = 0;
  std::atomic<int64_t> requests_in_full_{0}, requests_as_ids_{0};
  std::atomic<int64_t> control_bytes_sent_{0}, control_bytes_received_{0}, waits_driven_{0};
  int64_t spin_us_ = 0;  // see Parameters::spin_us; 0 when ranks outnumber cores
};

}  // namespace hvdlite
