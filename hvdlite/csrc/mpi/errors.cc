#include "mpi/errors.h"

#include "mpi/ulfm.h"

namespace hvdlite {

bool IsPeerFailure(int rc) {
#if HVDLITE_HAVE_ULFM
  if (rc == MPI_SUCCESS) return false;
  int cls = rc;
  MPI_Error_class(rc, &cls);
  return cls == MPIX_ERR_PROC_FAILED || cls == MPIX_ERR_REVOKED
#if defined(MPIX_ERR_PROC_FAILED_PENDING)
         || cls == MPIX_ERR_PROC_FAILED_PENDING
#endif
      ;
#else
  (void)rc;
  return false;
#endif
}

void CheckMpi(int rc, const std::string& what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  const std::string text = what + " failed: " + std::string(msg, static_cast<size_t>(len));
  if (IsPeerFailure(rc)) throw PeerFailure(text);
  throw std::runtime_error(text);
}

void Revoke(MPI_Comm comm) {
#if HVDLITE_HAVE_ULFM
  if (comm != MPI_COMM_NULL) MPIX_Comm_revoke(comm);
#else
  (void)comm;
#endif
}

std::vector<int> FailedRanks(MPI_Comm comm) {
  std::vector<int> out;
#if HVDLITE_HAVE_ULFM
  if (comm == MPI_COMM_NULL) return out;
  MPI_Group failed = MPI_GROUP_NULL, all = MPI_GROUP_NULL;
  if (MPIX_Comm_get_failed(comm, &failed) != MPI_SUCCESS) return out;
  int n = 0;
  MPI_Group_size(failed, &n);
  if (n > 0 && MPI_Comm_group(comm, &all) == MPI_SUCCESS) {
    std::vector<int> in(static_cast<size_t>(n));
    out.resize(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) in[static_cast<size_t>(i)] = i;
    MPI_Group_translate_ranks(failed, n, in.data(), all, out.data());
    MPI_Group_free(&all);
  }
  MPI_Group_free(&failed);
#else
  (void)comm;
#endif
  return out;
}

void FreeCommunicator(MPI_Comm* comm) {
  if (*comm == MPI_COMM_NULL) return;
  int finalized = 0, revoked = 0;
  MPI_Finalized(&finalized);
#if HVDLITE_HAVE_ULFM
  if (!finalized) MPIX_Comm_is_revoked(*comm, &revoked);
#endif
  // A revoked one is left allocated (MPI_Finalize releases it with the rest).
  if (!finalized && !revoked) MPI_Comm_free(comm);
  *comm = MPI_COMM_NULL;
}

}  // namespace hvdlite
