#include "backends/mpi/exchange.h"

#include <string>

#include "mpi/errors.h"

namespace hvdlite {

void Exchange(const void* sendbuf, int send_count, int dest, void* recvbuf, int recv_count, int source,
              MPI_Datatype type, int tag, MPI_Comm comm, const char* what) {
  MPI_Request requests[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  int rc = MPI_Isend(sendbuf, send_count, type, dest, tag, comm, &requests[0]);
  if (rc == MPI_SUCCESS) rc = MPI_Irecv(recvbuf, recv_count, type, source, tag, comm, &requests[1]);
  MPI_Status statuses[2];
  // After a failed post the other request (if any) is still waited for: MPI must be
  // done with both buffers before this returns.
  const int waited = MPI_Waitall(2, requests, statuses);
  if (rc == MPI_SUCCESS) rc = waited;
  if (rc == MPI_ERR_IN_STATUS) {
    for (const MPI_Status& s : statuses)
      if (s.MPI_ERROR != MPI_SUCCESS && s.MPI_ERROR != MPI_ERR_PENDING) {
        rc = s.MPI_ERROR;
        break;
      }
  }
  CheckMpi(rc, what);
}

}  // namespace hvdlite
