// A two-way exchange with peers: what the ring and Adasum steps run instead of
// MPI_Sendrecv.
#pragma once

#include <mpi.h>

namespace hvdlite {

// Sends `send_count` elements of `type` to `dest` and receives `recv_count` from
// `source` (the same tag both ways), posting the send first, and waits for both. Errors
// throw as CheckMpi's do (PeerFailure where a peer died), naming `what`.
//
// Why not MPI_Sendrecv: Open MPI's posts the receive first. Where two ranks exchange
// large messages over one TCP connection, a rank that arrives late finds its peer's
// rendezvous request waiting, answers it at once, and only then announces its own
// message. The peer, free to go, writes its whole message into the connection, and the
// late rank's announcement (and so its whole message) waits behind it: on emulated
// 1 Gbit/s hosts, 2 hosts x 1 rank, 40 % of a ring's 2 MiB exchanges took two
// messages' time. Announcing first puts this rank's request ahead of its answer, and
// none did (docs/scale.md, "One connection, both ways").
void Exchange(const void* sendbuf, int send_count, int dest, void* recvbuf, int recv_count, int source,
              MPI_Datatype type, int tag, MPI_Comm comm, const char* what);

}  // namespace hvdlite
