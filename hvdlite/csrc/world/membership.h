// Membership: how the world's set of processes changes. After a peer died (a
// PeerFailure, mpi/errors.h) the survivors agree on a new world (ShrinkWorld) and build
// a new engine on it, in the same processes; at each commit they agree that no one has
// failed (Agree); and new processes join a running job (SpawnAndMerge,
// MergeWithParent). These need ULFM (mpi/ulfm.h) or MPI's dynamic processes.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

#include "mpi/errors.h"

namespace hvdlite {

// Collective over the live processes of `comm`: a new communicator of them, in the
// same order, with errors returned rather than fatal. Throws std::runtime_error where
// the build has no ULFM.
MPI_Comm ShrinkWorld(MPI_Comm comm);
// Collective over every process of `comm`: a new communicator of the processes that
// do not leave, in the same order, with errors returned rather than fatal;
// MPI_COMM_NULL where `leaves`. For a planned departure: every process takes part.
MPI_Comm SplitWorld(MPI_Comm comm, bool leaves);
// The ranks of `before` that are not in `after` (`before`'s numbering): who a shrink
// left out, as every survivor agreed (unlike FailedRanks, which is this rank's view).
std::vector<int> MissingRanks(MPI_Comm before, MPI_Comm after);
// Collective over the live processes of `comm`: the bitwise AND of every rank's
// `value`, the same on every rank. Throws PeerFailure on every survivor alike when a
// process of `comm` has failed (ULFM's agreement); without ULFM, an MPI_Allreduce.
int Agree(MPI_Comm comm, int value);

// Elastic training: ends this process (SIGKILL, as a failed one) when it finds that it
// was stopped (SIGSTOP then SIGCONT, a debugger, a swap storm) for longer than
// `limit_s`: by then the other workers' failure detectors counted it failed and went on,
// and its own detector, left running, would soon count them failed in turn and pass
// that verdict on to them. A thread of its own (no Python lock, which a long call may
// hold) wakes every 0.1 s and sees the time it missed. Started once; later calls do
// nothing.
void StartSuspensionWatch(double limit_s, const std::string& failure_timeout);

// Workers joining a running job (MPI dynamic processes).
struct SpawnRequest {
  std::string command;            // the program
  std::vector<std::string> args;  // its arguments
  std::vector<std::string> hosts;  // one entry per new process: where it runs
  std::string wdir;                // its working directory ("" : the launcher's choice)
  bool oversubscribe = false;      // the hosts' slots may be exceeded (one machine)
};
// Collective over `comm` (the request matters on rank 0 only): starts the processes
// and returns one communicator of `comm`'s processes, in order, then the new ones.
// Throws std::runtime_error, on every rank alike, when they could not all start.
MPI_Comm SpawnAndMerge(MPI_Comm comm, const SpawnRequest& request);
// In a process that SpawnAndMerge started: the joined job's communicator (this
// process among the last ranks). MPI_COMM_NULL in any other process.
MPI_Comm MergeWithParent();

}  // namespace hvdlite
