#include "world/membership.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <thread>

#include "mpi/ulfm.h"

namespace hvdlite {

MPI_Comm ShrinkWorld(MPI_Comm comm) {
#if HVDLITE_HAVE_ULFM
  MPI_Comm out = MPI_COMM_NULL;
  CheckMpi(MPIX_Comm_shrink(comm, &out), "MPIX_Comm_shrink");
  MPI_Comm_set_errhandler(out, MPI_ERRORS_RETURN);
  return out;
#else
  (void)comm;
  throw std::runtime_error(
      "hvdlite was built against an MPI without fault tolerance (ULFM): it cannot go on after a rank failed");
#endif
}

MPI_Comm SplitWorld(MPI_Comm comm, bool leaves) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm out = MPI_COMM_NULL;
  CheckMpi(MPI_Comm_split(comm, leaves ? MPI_UNDEFINED : 0, rank, &out), "MPI_Comm_split (workers leaving)");
  if (out != MPI_COMM_NULL) MPI_Comm_set_errhandler(out, MPI_ERRORS_RETURN);
  return out;
}

std::vector<int> MissingRanks(MPI_Comm before, MPI_Comm after) {
  MPI_Group b = MPI_GROUP_NULL, a = MPI_GROUP_NULL;
  MPI_Comm_group(before, &b);
  MPI_Comm_group(after, &a);
  int n = 0;
  MPI_Group_size(b, &n);
  std::vector<int> in(static_cast<size_t>(n)), out(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) in[static_cast<size_t>(i)] = i;
  MPI_Group_translate_ranks(b, n, in.data(), a, out.data());
  MPI_Group_free(&a);
  MPI_Group_free(&b);
  std::vector<int> missing;
  for (int i = 0; i < n; ++i)
    if (out[static_cast<size_t>(i)] == MPI_UNDEFINED) missing.push_back(i);
  return missing;
}

int Agree(MPI_Comm comm, int value) {
  int flag = value;
#if HVDLITE_HAVE_ULFM
  CheckMpi(MPIX_Comm_agree(comm, &flag), "MPIX_Comm_agree");
#else
  CheckMpi(MPI_Allreduce(MPI_IN_PLACE, &flag, 1, MPI_INT, MPI_BAND, comm), "MPI_Allreduce (agree)");
#endif
  return flag;
}

MPI_Comm SpawnAndMerge(MPI_Comm comm, const SpawnRequest& request) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  // Rank 0's request, as one command per host (processes on a host in one go).
  std::vector<std::string> hosts;
  std::vector<int> counts;
  for (const std::string& h : request.hosts) {
    if (!hosts.empty() && hosts.back() == h) {
      ++counts.back();
    } else {
      hosts.push_back(h);
      counts.push_back(1);
    }
  }
  const int n = static_cast<int>(hosts.size());
  std::vector<char*> argv;
  for (const std::string& a : request.args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> commands(static_cast<size_t>(n), const_cast<char*>(request.command.c_str()));
  std::vector<char**> argvs(static_cast<size_t>(n), argv.data());
  std::vector<MPI_Info> infos(static_cast<size_t>(n), MPI_INFO_NULL);
  for (int i = 0; i < n && rank == 0; ++i) {
    MPI_Info_create(&infos[static_cast<size_t>(i)]);
    MPI_Info_set(infos[static_cast<size_t>(i)], "host", hosts[static_cast<size_t>(i)].c_str());
    if (!request.wdir.empty()) MPI_Info_set(infos[static_cast<size_t>(i)], "wdir", request.wdir.c_str());
    if (request.oversubscribe) MPI_Info_set(infos[static_cast<size_t>(i)], "PMIX_MAPBY", ":OVERSUBSCRIBE");
  }
  int total = 0;
  for (int c : counts) total += c;
  std::vector<int> errcodes(static_cast<size_t>(std::max(total, 1)), MPI_SUCCESS);
  MPI_Comm inter = MPI_COMM_NULL;
  const int rc = MPI_Comm_spawn_multiple(n, commands.data(), argvs.data(), counts.data(), infos.data(), 0, comm,
                                         &inter, errcodes.data());
  for (MPI_Info& info : infos)
    if (info != MPI_INFO_NULL) MPI_Info_free(&info);
  int ok = rc == MPI_SUCCESS && inter != MPI_COMM_NULL;
  if (rank == 0)
    for (int e : errcodes) ok = ok && e == MPI_SUCCESS;
  // Every rank must take the same way out.
  ok = Agree(comm, ok ? 1 : 0);
  if (!ok) {
    if (inter != MPI_COMM_NULL) MPI_Comm_free(&inter);
    char msg[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    if (rc != MPI_SUCCESS) MPI_Error_string(rc, msg, &len);
    throw std::runtime_error("could not start " + std::to_string(total) + " new worker(s) (MPI_Comm_spawn_multiple" +
                             (len ? std::string(": ") + std::string(msg, static_cast<size_t>(len)) : std::string()) +
                             ")");
  }
  MPI_Comm merged = MPI_COMM_NULL;
  CheckMpi(MPI_Intercomm_merge(inter, 0, &merged), "MPI_Intercomm_merge");
  MPI_Comm_free(&inter);
  MPI_Comm_set_errhandler(merged, MPI_ERRORS_RETURN);
  return merged;
}

MPI_Comm MergeWithParent() {
  MPI_Comm parent = MPI_COMM_NULL;
  MPI_Comm_get_parent(&parent);
  if (parent == MPI_COMM_NULL) return MPI_COMM_NULL;
  MPI_Comm merged = MPI_COMM_NULL;
  CheckMpi(MPI_Intercomm_merge(parent, 1, &merged), "MPI_Intercomm_merge (joining)");
  MPI_Comm_set_errhandler(merged, MPI_ERRORS_RETURN);
  return merged;
}

void StartSuspensionWatch(double limit_s, const std::string& failure_timeout) {
  static std::atomic<bool> started{false};
  if (limit_s <= 0 || started.exchange(true)) return;
  std::thread([limit_s, failure_timeout] {
    using Clock = std::chrono::steady_clock;  // runs on while the process is stopped
    const auto tick = std::chrono::milliseconds(100);
    auto last = Clock::now();
    for (;;) {
      std::this_thread::sleep_for(tick);
      const auto now = Clock::now();
      const double missed = std::chrono::duration<double>(now - last - tick).count();
      last = now;
      if (missed <= limit_s) continue;
      char host[256] = {0};
      gethostname(host, sizeof(host) - 1);
      std::fprintf(stderr,
                   "hvdlite: the worker with pid %d on %s was stopped for %.1f s, too long for the failure "
                   "timeout (%s s): the other workers have counted it failed and go on without it; it exits\n",
                   static_cast<int>(getpid()), host, missed, failure_timeout.c_str());
      std::fflush(stderr);
      // As a failed process: Open MPI's fault tolerance takes a killed process in its
      // stride, where a non-zero exit status would end the whole job.
      std::raise(SIGKILL);
    }
  }).detach();
}

}  // namespace hvdlite
