// hvdlite's world in one process: MPI's initialization and finalization, the base
// communicator every engine is made from, the global engine (process set 0) and the
// process sets' engines, elastic training's shrink, grow and agreement, and the guard
// against a forked copy of a process that runs an engine. The Python bindings
// (api/bindings.cc) and the C interface (api/core_api.h) are thin layers over it.
//
// Threads: the lifecycle calls (Init, Shutdown, Finalize, AddProcessSet,
// RemoveProcessSet, Rebuild, Dismiss, Agree, Grow) come from one thread at a time, under the
// caller's lock (the bindings': Python's GIL), which the world lets go of while it
// blocks in MPI (`Release`). The lookups may come from any thread.
#pragma once

#include <mpi.h>
#include <unistd.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/handle_table.h"
#include "common/tunables.h"
#include "engine/engine.h"

namespace hvdlite {

// A failure the world reports as hvdlite's own (HvdliteError in Python): a peer failed
// during an agreement, new processes could not start, a forked copy was used.
class WorldError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class World {
 public:
  // Lets go of the caller's lock until the returned object is destroyed (null: none).
  using Release = std::function<std::shared_ptr<void>()>;
  explicit World(Release release) : release_(std::move(release)) {}
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  // Outlives engines, so that a handle from before a shutdown still reports.
  HandleTable& handles() { return handles_; }

  // ---- Lifecycle ----
  // Starts the world on a duplicate of `comm_handle` (mpi4py's handle of a communicator;
  // 0: MPI_COMM_WORLD, or `ranks` of it), initializing MPI if no one has. A process
  // outside `ranks` gets no engine. A worker that elastic training started into a
  // running job joins that job's world. Nothing happens if the engine runs already.
  void Init(uintptr_t comm_handle, const std::vector<int>& ranks);
  // Stops every engine (collective: the first rank to stop stops every rank's). In a
  // forked copy, abandons the parent's engine instead. True if it stopped an engine.
  bool Shutdown();
  // Shutdown, then MPI_Finalize if hvdlite initialized MPI.
  void Finalize();
  // Registers a process set of the world ranks `ranks` (ascending, distinct) and
  // returns its id. Called by every rank in the same order; collective over the set's
  // members, who start its engine.
  int32_t AddProcessSet(const std::vector<int>& ranks);
  // Stops process set `id`'s engine (collective over its members) and forgets the set.
  // False if there is no such set (the global one included).
  bool RemoveProcessSet(int32_t id);
  // Elastic training after a peer died: the live processes agree on a new world
  // (collective over them), renumbered 0..n-1 in their old order, and a new engine
  // starts on it. On a running engine, it is stopped first, its communicators revoked,
  // so that the other ranks take the same path.
  void Rebuild();
  // Elastic training: collective over the world. The ranks in `leaving` (world ranks,
  // ascending) leave it: the engine stops on every rank, and the others go on in a
  // world of themselves, renumbered in their old order, with a new engine. Returns
  // whether this process stays; one that leaves has no engine left and only exits.
  // If a peer fails meanwhile, the engine restarts on the old world and WorldError is
  // thrown (on every survivor alike), for the failure path to take over.
  bool Dismiss(const std::vector<int>& leaving);
  // Elastic training: the AND of every rank's `value` (ULFM's fault-tolerant agreement,
  // at each commit). A rank that failed since the world was made fails it on every
  // survivor alike: the engine is stopped as after a peer's failure, and WorldError
  // thrown.
  int Agree(int value);
  // Elastic training: collective over the world. The engine stops; new processes start
  // (`command` `args`, one per entry of `hosts`) and join; a new engine runs on the old
  // ranks, in order, then the new ones. If they cannot start, the engine restarts on
  // the old world and WorldError is thrown (on every rank alike).
  void Grow(const std::string& command, const std::vector<std::string>& args, const std::vector<std::string>& hosts,
            const std::string& wdir, bool oversubscribe);

  // ---- Lookups ----
  // The global engine, running; throws if there is none (or in a forked copy).
  Engine& Running();
  // The engine of process set `id` (0: the global one), running; throws what stops a
  // collective on it: an unknown set, a set without this process, a stopped engine.
  Engine& RunningSet(int32_t id);
  // The global engine, running or stopped by another rank's shutdown: process info
  // stays available until this process shuts down itself (as in Horovod).
  Engine& Known();
  // The global engine, or null. Any thread.
  std::shared_ptr<Engine> engine() const { return std::atomic_load(&engine_); }
  // The same, without the atomic load, for the thread that makes the lifecycle calls
  // (under the caller's lock): the hot paths of blocking collectives.
  Engine* current() const { return engine_.get(); }
  // The engine a handle belongs to, if it still exists.
  std::shared_ptr<Engine> OwnerEngine(int64_t h);
  // For the C interface: the engine of process set `id`, or null and why. Any thread.
  std::shared_ptr<Engine> SetEngineForC(int32_t id, std::string* why);
  // Every registered set's ranks, the global set (0) included.
  std::map<int32_t, std::vector<int>> ProcessSets();

  bool joined() const { return joined_; }
  const std::vector<int>& lost_ranks() const { return lost_; }
  bool mpi_threads_supported() const { return thread_level_ >= MPI_THREAD_MULTIPLE; }

  // ---- The fork guard ----
  // A process forked after init() (a DataLoader worker started with "fork", say) holds
  // a copy of the engine whose background thread and MPI connections exist only in its
  // parent. It keeps the process info, but must never touch MPI or the engine's locks.
  void MarkForked() { forked_ = true; }  // the pthread_atfork child handler's
  bool forked() const { return forked_; }
  bool ForkedCopy() const { return forked_ && engine_; }
  std::string ForkedMessage() const;
  void RaiseIfForkedCopy() const {
    if (ForkedCopy()) throw WorldError(ForkedMessage());
  }

 private:
  struct ProcessSetEntry {
    std::vector<int> ranks;          // world ranks, ascending
    std::shared_ptr<Engine> engine;  // null where this process is not a member
  };

  std::shared_ptr<void> Unlocked() const { return release_ ? release_() : nullptr; }
  void SetEngine(std::shared_ptr<Engine> engine) { std::atomic_store(&engine_, std::move(engine)); }
  std::shared_ptr<Engine> TakeEngine() { return std::atomic_exchange(&engine_, std::shared_ptr<Engine>()); }
  // Makes `engine` the global one.
  void Install(std::shared_ptr<Engine> engine);
  void EnsureMpi();
  // Stops every process set's engine and forgets the sets (shutdown, or a new world).
  // With `revoke`, their communicators are revoked first: a member may be dead.
  void DropProcessSets(bool revoke);
  void FreeBase();
  void RetireBase();
  // Dismiss and Grow: the engine stops (collective), `next` makes the next base
  // communicator (MPI_COMM_NULL: this process leaves, and false is returned), and a new
  // engine starts on it. If `next` throws, the engine restarts on the old base and
  // WorldError is thrown.
  bool Rebase(const std::function<MPI_Comm()>& next);
  // Called on the global engine's thread, on every rank, when it applies tuned
  // settings: each process set's rank 0 sends them on in its own order.
  void ForwardTunablesToSets(const Tunables& t);

  Release release_;
  HandleTable handles_;
  // Shared so that a thread waiting in Engine::Wait keeps its engine alive while another
  // thread shuts down. Replaced by the lifecycle calls; read atomically by other
  // threads (the C interface's, which TensorFlow's threads call).
  std::shared_ptr<Engine> engine_;
  bool mpi_owned_ = false;  // we called MPI_Init, so we call MPI_Finalize
  int thread_level_ = 0;
  // The communicator the world is made from: a duplicate of what Init was given, and
  // after a peer failed, the survivors' (membership.h). Every engine duplicates it.
  MPI_Comm base_ = MPI_COMM_NULL;
  bool joined_ = false;     // this process was started into a running job (Grow)
  std::vector<int> lost_;   // the ranks the last Rebuild left out (old numbering)
  bool peer_died_ = false;  // some Rebuild left a dead process out of the world
  bool peer_unresponsive_ = false;  // an engine stopped because ranks stopped answering
  // Worlds replaced by Rebuild and Grow. They are kept, not freed: Open MPI's ULFM
  // agreement (ERA) keys its history by communicator id, ids of freed communicators are
  // handed out again, and an agreement on a new world that reused an old world's id was
  // seen to complete on some ranks and hang on the others ("removing old agreement from
  // history, due to cycling of identifiers"). One handle per reset.
  std::vector<MPI_Comm> retired_;

  // Horovod's process sets. The global set (id 0) is engine_. Every other set has an
  // engine of its own, on a communicator of its members: its own negotiation, response
  // cache, fusion buffers and NCCL communicators, and its own background thread, so
  // that sets run their collectives concurrently without waiting for one another (and
  // for the global set). Registered on every rank alike, in the same order (the front
  // end checks that first), so ids agree everywhere; a process that is not a member
  // keeps the entry without an engine. Changed by the lifecycle calls only; sets_mu_
  // keeps it whole for readers on other threads.
  std::map<int32_t, ProcessSetEntry> sets_;
  int32_t next_set_id_ = 1;
  std::mutex sets_mu_;
  // The settings the global set's autotuner last applied (HOROVOD_AUTOTUNE), under
  // sets_mu_: process sets take them up, those added later included.
  std::optional<Tunables> tuned_;

  bool forked_ = false;
  pid_t engine_pid_ = 0;  // the process that started engine_
};

}  // namespace hvdlite
