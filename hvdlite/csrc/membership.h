// Membership: what hvdlite does when the set of ranks changes under it.
//
// A peer process that dies is reported by MPI itself where the MPI has the
// user-level fault mitigation interface (ULFM: Open MPI 5 run with
// `--with-ft ulfm`): every call that involves the dead process, or waits on a
// receive from anyone, returns an error of class "process failed", and a
// communicator that one rank revokes fails every call on it everywhere. These few
// functions wrap that interface, so that the engine and the backends only throw
// PeerFailure, and the engine, having caught it, revokes its communicators (so that
// every survivor hears of it at once) and stops. The survivors then agree on a new
// world (ShrinkWorld) and build a new engine on it, in the same processes.
//
// Without ULFM (another MPI, or Open MPI run without fault tolerance) none of the
// failure classes is ever returned: a dead rank ends the job through the launcher,
// as before.
#pragma once

#include <mpi.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace hvdlite {

// An MPI call failed because a process of its communicator died, or because a rank
// revoked the communicator after seeing such a failure.
class PeerFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// `rc` says a peer died or the communicator was revoked.
bool IsPeerFailure(int rc);
// Throws PeerFailure (a failure class) or std::runtime_error (any other error) for
// an MPI return code other than MPI_SUCCESS; `what` names the call.
void CheckMpi(int rc, const std::string& what);
// Makes every pending and future call on `comm` fail on every rank (ULFM revoke);
// nothing without ULFM.
void Revoke(MPI_Comm comm);
// The ranks of `comm` known to have failed, in `comm`'s numbering (empty without ULFM).
std::vector<int> FailedRanks(MPI_Comm comm);
// Collective over the live processes of `comm`: a new communicator of them, in the
// same order, with errors returned rather than fatal. Throws std::runtime_error where
// the build has no ULFM.
MPI_Comm ShrinkWorld(MPI_Comm comm);
// The ranks of `before` that are not in `after` (`before`'s numbering): who a shrink
// left out, as every survivor agreed (unlike FailedRanks, which is this rank's view).
std::vector<int> MissingRanks(MPI_Comm before, MPI_Comm after);
// Collective over the live processes of `comm`: the bitwise AND of every rank's
// `value`, the same on every rank. Throws PeerFailure on every survivor alike when a
// process of `comm` has failed (ULFM's agreement); without ULFM, an MPI_Allreduce.
int Agree(MPI_Comm comm, int value);

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
