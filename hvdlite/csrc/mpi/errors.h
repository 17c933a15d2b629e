// MPI's errors as hvdlite sees them, for every part that calls MPI (the backends, the
// control transport, the engine's communicators, the world).
//
// A peer process that dies is reported by MPI itself where the MPI has ULFM
// (mpi/ulfm.h): every call that involves the dead process, or waits on a receive from
// anyone, returns an error of class "process failed", and a communicator that one rank
// revokes fails every call on it everywhere. These functions wrap that interface, so
// that MPI's callers only throw PeerFailure, and the engine, having caught it, revokes
// its communicators (so that every survivor hears of it at once) and stops. The
// survivors then agree on a new world (world/membership.h).
//
// Without ULFM (another MPI, or Open MPI run without fault tolerance) none of the
// failure classes is ever returned: a dead rank ends the job through the launcher.
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
// Frees `*comm` and sets it to MPI_COMM_NULL; nothing once MPI is finalized. A revoked
// communicator is kept instead, for the life of the process: freed, its context id
// would be given to the next communicator made, and a message a peer sent on it just
// before the failure, still on its way, would be taken in by that new communicator
// (Open MPI queues messages for a context id it does not know yet), where it uses up
// the sequence number of the sender's next real message, which is then never received.
void FreeCommunicator(MPI_Comm* comm);

}  // namespace hvdlite
