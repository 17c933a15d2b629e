// Tunables read from the environment at init: HVDLITE_X, or Horovod's HOROVOD_X.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/common.h"
#include "common/tunables.h"

namespace hvdlite {

// Settings of the two-level collectives across hosts, which every rank takes from rank 0
// (one block in ShareRankZeroSettings, engine.cc).
struct TwoLevelSettings {
  // Host-memory allreduces / allgathers across hosts: 1 always two-level
  // (HierarchicalAllreduce / HierarchicalAllgather) where every host runs the same number
  // of ranks, 0 never, -1 (unset) chosen per message by MpiBackend.
  // HOROVOD_HIERARCHICAL_ALLREDUCE, HOROVOD_HIERARCHICAL_ALLGATHER. GPU allreduces on NCCL
  // are two-level only with allreduce == 1 (NcclBackend::TwoLevel).
  int32_t allreduce = -1;
  int32_t allgather = -1;
  // The two-level allreduce's schedule: 0 torus (reduce-scatter inside the host, allreduce
  // across, allgather inside), 1 leader (reduce to local rank 0, allreduce among the
  // leaders, broadcast inside). HVDLITE_HIERARCHICAL_ALGORITHM=torus|leader; unset (-1):
  // chosen by rank 0 from its host (ChooseTwoLevelSchedule, engine.cc).
  int32_t algorithm = -1;
  // GPU allreduces forced two-level (allreduce == 1) on the NCCL backend: how the shards
  // cross the hosts. 0: copied to host memory and allreduced with MPI on the cross
  // communicator (Horovod's NCCL+MPI mode, the default); 1: ncclAllReduce on a cross NCCL
  // communicator. HVDLITE_HIERARCHICAL_CROSS=mpi|nccl. With allreduce unset (-1), GPU
  // allreduces stay flat: NCCL's own algorithms already follow the hosts.
  int32_t gpu_cross_nccl = 0;
};

// Every cycle (CacheCycle) carries two bits per response-cache entry: 16 KiB at this size.
constexpr int64_t kMaxCacheCapacity = 65536;

struct Parameters {
  int64_t fusion_threshold_bytes = 128LL * 1024 * 1024;  // Horovod's default
  double cycle_time_ms = 1.0;        // longest sleep between checks while work is outstanding
  int64_t cache_capacity = 1024;     // 0 disables the response cache (and the cycles)
  std::string timeline_path;
  bool timeline_mark_cycles = false;
  // HOROVOD_THREAD_AFFINITY: a core per local rank (comma-separated, in local-rank
  // order) to pin that rank's background thread to; empty: not pinned.
  std::vector<int> thread_affinity;
  double stall_check_seconds = 60.0;  // 0 disables the stall inspector
  double stall_shutdown_seconds = 0.0;  // 0: never shut down for a stall
  // An elastic job whose launcher ends processes on request (hvdlite-run sets
  // HVDLITE_LAUNCHER_REQUESTS=1): a minority of ranks that miss their collectives past
  // the stall shutdown time is evicted (rank 0 asks for their end) rather than the
  // whole job shut down; the survivors then go on without them.
  bool stall_evicts = false;
  // Size of the pieces a fused set (or a large tensor) is reduced in on host memory,
  // chosen to stay in the last-level cache (see docs/architecture.md).
  int64_t host_chunk_bytes = 4LL * 1024 * 1024;
  // Tensors at least this large are reduced from their own memory, never copied into
  // the fusion buffer: above a few tens of KiB a copy in and out costs more than the
  // latency of one more MPI call.
  int64_t fusion_direct_bytes = 64LL * 1024;
  // Allreduces whose bytes per rank reach this run as hvdlite's ring over MPI
  // point-to-point (MpiCollectives::RingAllreduce); smaller ones call MPI_Allreduce,
  // whose fewer steps win while latency dominates.
  int64_t ring_min_segment_bytes = 256LL * 1024;
  // While this rank has work in flight, the background thread polls MPI without
  // sleeping for this long after each bit of progress, and for as long as a caller
  // is blocked waiting on a result (its core is idle then). Otherwise it sleeps
  // between polls, backing off up to the cycle time, so that it takes no time from
  // computation. A caller that runs the engine itself (Engine::Drive) polls without
  // even yielding for this long after progress. 0 turns polling without sleeping off.
  // When this host runs more ranks than it has cores, only a caller that runs the
  // engine polls, yielding its core at every poll, for at most the cycle time.
  int64_t spin_us = 50;
  // Raise glibc's malloc thresholds to the ceiling its own adaptive policy reaches
  // (see TuneHostAllocator in engine.cc). HVDLITE_MALLOC_TUNING=0 leaves malloc alone.
  bool malloc_tuning = true;
  // Back the large buffers an allreduce hands to MPI as they are with 2 MiB pages once
  // they are reused (see host_memory.h). HVDLITE_HUGE_PAGES=0 leaves their mapping alone.
  bool huge_pages = true;
  // The pieces a two-level allreduce sends between hosts one after the other: on
  // emulated 1 Gbit/s links 2 MiB beat 1 MiB (waits between pieces) and 4-16 MiB (TCP
  // stalls on long transfers); docs/scale.md. HVDLITE_HIERARCHICAL_CHUNK_BYTES.
  int64_t hierarchical_chunk_bytes = 2LL * 1024 * 1024;
  TwoLevelSettings two_level;
  int log_level = 3;  // 0 trace, 1 debug, 2 info, 3 warning, 4 error, 5 fatal
  // GPU tensors: the backend each kind of collective prefers, by request type ("NCCL",
  // or "MPI" for host-staged), from HOROVOD_GPU_OPERATIONS and HOROVOD_GPU_<OP>.
  std::string gpu_backend[kNumRequestTypes] = {"NCCL", "NCCL", "NCCL", "NCCL", "NCCL", "NCCL", "NCCL"};

  // HOROVOD_AUTOTUNE=1: rank 0 searches the fusion threshold, the cycle time, the
  // response cache on/off and the two-level allreduce while training runs (autotune.h).
  bool autotune = false;
  AutotuneOptions autotune_options;
  // An elastic worker (hvdlite-run --min-np ... sets HVDLITE_ELASTIC=1): a peer's
  // failure is something the job recovers from, not an error.
  bool elastic = false;

  // Values that could not be used, each with what applies instead. hvd.init() says
  // them on the world's rank 0 only, once (they are the same on every rank).
  std::vector<std::string> problems;

  static Parameters FromEnvironment();
};

// Value of HVDLITE_<suffix>, else HOROVOD_<suffix>, else nullptr.
const char* GetEnv(const char* suffix);

}  // namespace hvdlite
