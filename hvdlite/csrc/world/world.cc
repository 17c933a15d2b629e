#include "world/world.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <thread>
#include <type_traits>

#include "backends/mpi/reduce_ops.h"
#include "common/logging.h"
#include "common/parameters.h"
#include "world/membership.h"

namespace hvdlite {
namespace {

// mpi4py's MPI._handleof(comm) is the communicator's handle as a number: a pointer in
// Open MPI, an int in MPICH and the MPIs derived from it.
template <typename Handle>
Handle HandleFromNumber(uintptr_t number) {
  if constexpr (std::is_pointer_v<Handle>) return reinterpret_cast<Handle>(number);
  else return static_cast<Handle>(number);
}

// Open MPI's MPI_Finalize ends with a fence over every process the job started. After
// a process of the job died (elastic training went on without it), that fence was
// seen to wait for the dead process for ever now and then (about 1 run in 40 here),
// with every survivor's work done and written. So after such a loss, MPI_Finalize
// gets this long; past it, the process leaves without it (exit status 0: a rank that
// failed has ended the job through hvdlite's exception hook long before).
constexpr std::chrono::seconds kFinalizeAfterLossSeconds{10};

class FinalizeWatchdog {
 public:
  explicit FinalizeWatchdog(std::chrono::seconds limit)
      : thread_([this, limit] {
          std::unique_lock<std::mutex> lk(mu_);
          if (cv_.wait_for(lk, limit, [this] { return done_; })) return;
          std::fprintf(stderr,
                       "[hvdlite WARNING] MPI_Finalize did not finish within %lld s: Open MPI's closing fence "
                       "waits for a process of the job that died; leaving without it\n",
                       static_cast<long long>(limit.count()));
          std::fflush(nullptr);
          _exit(0);
        }) {}
  ~FinalizeWatchdog() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;  // last: it starts once the others exist
};

}  // namespace

std::string World::ForkedMessage() const {
  return "hvdlite: this process (pid " + std::to_string(getpid()) + ") was forked from the process of rank " +
         std::to_string(engine_ ? engine_->rank() : -1) + " (pid " + std::to_string(engine_pid_) +
         ") after hvd.init(); only that process can run collectives. hvd.rank(), hvd.size() and the other "
         "process-info calls still answer here (in a DataLoader worker, for example)";
}

// ---- Lookups ----

Engine& World::Running() {
  RaiseIfForkedCopy();
  if (!engine_ || !engine_->Running()) throw std::runtime_error("hvdlite has not been initialized; call hvd.init() first");
  return *engine_;
}

Engine& World::RunningSet(int32_t id) {
  if (id == 0) return Running();
  RaiseIfForkedCopy();
  std::shared_ptr<Engine> engine;
  {
    std::lock_guard<std::mutex> lk(sets_mu_);
    auto it = sets_.find(id);
    if (it == sets_.end())
      throw std::invalid_argument("hvdlite: process set " + std::to_string(id) +
                                  " is not registered (it was removed, or never added on this rank)");
    engine = it->second.engine;
  }
  if (!engine)
    throw std::invalid_argument("hvdlite: this process (rank " + std::to_string(engine_ ? engine_->rank() : -1) +
                                ") is not in process set " + std::to_string(id));
  if (!engine->Running())
    throw std::runtime_error("hvdlite: process set " + std::to_string(id) + " has stopped: " + engine->ShutdownReason());
  return *engine;  // the set's entry keeps it until the set is removed, by this thread
}

Engine& World::Known() {
  if (!engine_) throw std::runtime_error("hvdlite has not been initialized; call hvd.init() first");
  return *engine_;
}

std::shared_ptr<Engine> World::OwnerEngine(int64_t h) {
  const int32_t owner = handles_.OwnerOf(h);
  if (owner <= 0) return engine_;
  std::lock_guard<std::mutex> lk(sets_mu_);
  auto it = sets_.find(owner);
  return it == sets_.end() ? nullptr : it->second.engine;
}

std::shared_ptr<Engine> World::SetEngineForC(int32_t id, std::string* why) {
  if (id == 0) return engine();
  std::lock_guard<std::mutex> lk(sets_mu_);
  auto it = sets_.find(id);
  if (it == sets_.end()) {
    *why = "hvdlite: process set " + std::to_string(id) + " is not registered (it was removed, or never added)";
    return nullptr;
  }
  if (!it->second.engine) *why = "hvdlite: this process is not in process set " + std::to_string(id);
  return it->second.engine;
}

std::map<int32_t, std::vector<int>> World::ProcessSets() {
  std::map<int32_t, std::vector<int>> out;
  std::vector<int> all(static_cast<size_t>(Known().size()));
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
  out[0] = all;
  std::lock_guard<std::mutex> lk(sets_mu_);
  for (const auto& [id, entry] : sets_) out[id] = entry.ranks;
  return out;
}

// ---- Lifecycle ----

void World::ForwardTunablesToSets(const Tunables& t) {
  std::vector<std::shared_ptr<Engine>> engines;
  {
    std::lock_guard<std::mutex> lk(sets_mu_);
    tuned_ = t;
    for (auto& [id, entry] : sets_)
      if (entry.engine) engines.push_back(entry.engine);
  }
  for (auto& e : engines) e->ProposeTunables(t);
}

void World::DropProcessSets(bool revoke) {
  std::map<int32_t, ProcessSetEntry> sets;
  {
    std::lock_guard<std::mutex> lk(sets_mu_);
    sets = std::move(sets_);
    sets_.clear();
  }
  auto unlocked = Unlocked();
  for (auto& [id, entry] : sets) {
    if (!entry.engine) continue;
    if (revoke && entry.engine->Running()) entry.engine->Abandon("hvdlite's world changed");
    entry.engine->Stop();
    entry.engine.reset();
  }
}

void World::FreeBase() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (base_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&base_);
  base_ = MPI_COMM_NULL;
  if (!finalized)
    for (MPI_Comm& c : retired_) MPI_Comm_free(&c);
  retired_.clear();
}

void World::RetireBase() {
  if (base_ != MPI_COMM_NULL) retired_.push_back(base_);
  base_ = MPI_COMM_NULL;
}

void World::EnsureMpi() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized) throw std::runtime_error("hvdlite: MPI has already been finalized in this process");
  if (!initialized) {
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
      throw std::runtime_error("hvdlite: MPI_Init_thread failed");
    mpi_owned_ = true;
  }
  MPI_Query_thread(&thread_level_);
  if (thread_level_ < MPI_THREAD_SERIALIZED)
    throw std::runtime_error("hvdlite needs MPI initialized with at least MPI_THREAD_SERIALIZED "
                             "(mpi4py: set mpi4py.rc.thread_level = 'multiple' before importing MPI)");
}

void World::Install(std::shared_ptr<Engine> engine) {
  engine_pid_ = getpid();
  {
    std::lock_guard<std::mutex> lk(sets_mu_);
    tuned_.reset();  // a new world tunes afresh
  }
  engine->OnTunablesApplied([this](const Tunables& t) { ForwardTunablesToSets(t); });
  SetEngine(std::move(engine));
}

void World::Init(uintptr_t comm_handle, const std::vector<int>& ranks) {
  RaiseIfForkedCopy();
  if (engine_ && engine_->Running()) return;
  if (engine_) {
    std::shared_ptr<Engine> old = TakeEngine();  // stopped by a remote shutdown
    auto unlocked = Unlocked();
    old.reset();
  }
  EnsureMpi();
  MPI_Comm base = MPI_COMM_WORLD;
  MPI_Comm created = MPI_COMM_NULL;
  MPI_Comm joined = MPI_COMM_NULL;
  if (comm_handle != 0) {
    base = HandleFromNumber<MPI_Comm>(comm_handle);
    if (base == MPI_COMM_NULL) throw std::invalid_argument("hvdlite.init: the communicator is MPI.COMM_NULL");
  } else if (!ranks.empty()) {
    // Checked on every rank alike (the list is the same everywhere), before MPI sees it.
    int world_size = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    std::vector<char> seen(world_size, 0);
    for (int r : ranks) {
      if (r < 0 || r >= world_size)
        throw std::invalid_argument("hvdlite.init: rank " + std::to_string(r) + " is outside MPI_COMM_WORLD (size " +
                                    std::to_string(world_size) + ")");
      if (seen[r]++) throw std::invalid_argument("hvdlite.init: rank " + std::to_string(r) + " is listed twice");
    }
    MPI_Group world, sub;
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    MPI_Group_incl(world, static_cast<int>(ranks.size()), ranks.data(), &sub);
    MPI_Comm_create(MPI_COMM_WORLD, sub, &created);
    MPI_Group_free(&world);
    MPI_Group_free(&sub);
    if (created == MPI_COMM_NULL) return;  // this process is not among `ranks`
    base = created;
  } else if (!joined_) {
    // A worker that elastic training started into a running job (Grow): its world is
    // that job's, not its own MPI_COMM_WORLD of one.
    auto unlocked = Unlocked();
    joined = MergeWithParent();
    joined_ = joined != MPI_COMM_NULL;
  }
  Parameters params = Parameters::FromEnvironment();
  std::shared_ptr<Engine> engine;
  {
    auto unlocked = Unlocked();  // MPI_Comm_dup waits for the other ranks
    FreeBase();
    if (joined != MPI_COMM_NULL) {
      base_ = joined;  // the joined job's world, taken as is, as Grow does on the others
    } else {
      MPI_Comm_dup(base, &base_);
      MPI_Comm_set_errhandler(base_, MPI_ERRORS_RETURN);
      if (created != MPI_COMM_NULL) MPI_Comm_free(&created);
    }
    engine = std::make_shared<Engine>(base_, params, &handles_);
  }
  // The same on every rank, so said once for the job, by its rank 0 (under hvdlite-run
  // the launcher has said them already and the ranks see none).
  if (engine->rank() == 0)
    for (const std::string& problem : params.problems) HVD_WARN(problem);
  Install(std::move(engine));
}

int32_t World::AddProcessSet(const std::vector<int>& ranks) {
  Engine& world = Running();
  if (thread_level_ < MPI_THREAD_MULTIPLE)
    throw std::runtime_error("hvdlite: process sets need MPI initialized with MPI_THREAD_MULTIPLE (each set's engine "
                             "runs in a thread of its own); with mpi4py, set mpi4py.rc.thread_level = 'multiple'");
  if (ranks.empty()) throw std::invalid_argument("hvdlite: a process set needs at least one rank");
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= world.size())
      throw std::invalid_argument("hvdlite: rank " + std::to_string(ranks[i]) + " of the process set is outside " +
                                  "hvdlite's world (size " + std::to_string(world.size()) + ")");
    if (i > 0 && ranks[i] <= ranks[i - 1])
      throw std::invalid_argument("hvdlite: a process set's ranks must be distinct and in ascending order");
  }
  const int32_t id = next_set_id_++;
  ProcessSetEntry entry;
  entry.ranks = ranks;
  const bool member = std::binary_search(ranks.begin(), ranks.end(), world.rank());
  if (member) {
    Parameters params = Parameters::FromEnvironment();
    auto unlocked = Unlocked();
    MPI_Group all, sub;
    MPI_Comm comm = MPI_COMM_NULL;
    CheckMpi(MPI_Comm_group(base_, &all), "MPI_Comm_group (process set)");
    CheckMpi(MPI_Group_incl(all, static_cast<int>(ranks.size()), ranks.data(), &sub), "MPI_Group_incl (process set)");
    const int rc = MPI_Comm_create_group(base_, sub, /*tag=*/id, &comm);
    MPI_Group_free(&all);
    MPI_Group_free(&sub);
    CheckMpi(rc, "MPI_Comm_create_group (process set)");
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    entry.engine = std::make_shared<Engine>(comm, params, &handles_, id, world.timeline_writer());
    MPI_Comm_free(&comm);  // the engine works on duplicates of its own
  }
  {
    std::lock_guard<std::mutex> lk(sets_mu_);
    if (entry.engine && tuned_) entry.engine->ProposeTunables(*tuned_);
    sets_.emplace(id, std::move(entry));
  }
  return id;
}

bool World::RemoveProcessSet(int32_t id) {
  RaiseIfForkedCopy();
  std::shared_ptr<Engine> engine;
  {
    std::lock_guard<std::mutex> lk(sets_mu_);
    auto it = sets_.find(id);
    if (it == sets_.end()) return false;
    engine = std::move(it->second.engine);
    sets_.erase(it);
  }
  if (engine) {
    auto unlocked = Unlocked();
    engine->Stop();
    engine.reset();
  }
  return true;
}

void World::Rebuild() {
  RaiseIfForkedCopy();
  if (base_ == MPI_COMM_NULL) throw std::runtime_error("hvdlite has not been initialized; call hvd.init() first");
  DropProcessSets(/*revoke=*/true);  // their members are renumbered, or gone
  std::shared_ptr<Engine> old = TakeEngine();
  Parameters params = Parameters::FromEnvironment();
  std::shared_ptr<Engine> engine;
  {
    auto unlocked = Unlocked();
    if (old) {
      if (old->Running()) old->Abandon("hvd.elastic reset the world");
      old.reset();
    }
    MPI_Comm survivors = ShrinkWorld(base_);
    lost_ = MissingRanks(base_, survivors);
    peer_died_ = peer_died_ || !lost_.empty();
    RetireBase();
    base_ = survivors;
    engine = std::make_shared<Engine>(base_, params, &handles_);
  }
  Install(std::move(engine));
}

bool World::Dismiss(const std::vector<int>& leaving) {
  RaiseIfForkedCopy();
  if (!engine_) throw std::runtime_error("hvdlite has not been initialized; call hvd.init() first");
  int rank = 0;
  MPI_Comm_rank(base_, &rank);
  const bool leaves = std::binary_search(leaving.begin(), leaving.end(), rank);
  return Rebase([&] { return SplitWorld(base_, leaves); });
}

bool World::Rebase(const std::function<MPI_Comm()>& next) {
  DropProcessSets(/*revoke=*/false);
  std::shared_ptr<Engine> old = TakeEngine();
  Parameters params = Parameters::FromEnvironment();
  std::shared_ptr<Engine> engine;
  std::string error;
  {
    auto unlocked = Unlocked();
    old->Stop();
    old.reset();
    try {
      MPI_Comm comm = next();
      if (comm == MPI_COMM_NULL) return false;  // this process leaves the world
      RetireBase();
      base_ = comm;
    } catch (const std::exception& ex) {
      error = ex.what();
    }
    engine = std::make_shared<Engine>(base_, params, &handles_);
  }
  Install(std::move(engine));
  if (!error.empty()) throw WorldError("hvdlite: " + error);
  return true;
}

int World::Agree(int value) {
  RaiseIfForkedCopy();
  if (base_ == MPI_COMM_NULL) throw std::runtime_error("hvdlite has not been initialized; call hvd.init() first");
  std::string failure;
  int out = 0;
  {
    auto unlocked = Unlocked();
    try {
      out = hvdlite::Agree(base_, value);
    } catch (const PeerFailure& ex) {
      failure = ex.what();
      if (engine_ && engine_->Running()) engine_->Abandon("a peer failed: " + failure);
    }
  }
  if (!failure.empty()) throw WorldError("hvdlite: a peer process failed (" + failure + ")");
  return out;
}

void World::Grow(const std::string& command, const std::vector<std::string>& args,
                 const std::vector<std::string>& hosts, const std::string& wdir, bool oversubscribe) {
  RaiseIfForkedCopy();
  // The engine may have stopped already: the first rank here stops every rank's.
  if (!engine_) throw std::runtime_error("hvdlite has not been initialized; call hvd.init() first");
  SpawnRequest request{command, args, hosts, wdir, oversubscribe};
  Rebase([&] { return SpawnAndMerge(base_, request); });
}

bool World::Shutdown() {
  if (!forked_) DropProcessSets(/*revoke=*/false);
  std::shared_ptr<Engine> e = TakeEngine();
  if (!e) return false;
  if (forked_) {
    // The parent's engine: stopping it would join a thread this process does not
    // have, and freeing it would call MPI. Abandon the copy.
    new std::shared_ptr<Engine>(std::move(e));
    return false;
  }
  auto unlocked = Unlocked();
  e->Stop();
  if (e->PeerUnresponsive()) peer_unresponsive_ = true;
  e.reset();
  return true;
}

void World::Finalize() {
  Shutdown();
  if (forked_) return;  // MPI belongs to the parent process
  FreeBase();
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) FreeReduceOps();
  if (mpi_owned_ && initialized && !finalized && peer_unresponsive_) {
    // MPI_Finalize would wait for the ranks that stopped answering. Leaving without it
    // is what ends the job: the launcher ends every process of a job one of which
    // exits without MPI_Finalize, the unresponsive ones included.
    std::fprintf(stderr,
                 "[hvdlite] leaving without MPI_Finalize, which would wait for the ranks that stopped "
                 "answering; the launcher ends the job\n");
    std::fflush(nullptr);
  } else if (mpi_owned_ && initialized && !finalized) {
    std::optional<FinalizeWatchdog> watchdog;
    if (peer_died_) watchdog.emplace(kFinalizeAfterLossSeconds);
    auto unlocked = Unlocked();
    MPI_Finalize();
  }
  mpi_owned_ = false;
}

}  // namespace hvdlite
