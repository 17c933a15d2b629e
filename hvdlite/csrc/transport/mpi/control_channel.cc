#include "transport/mpi/control_channel.h"

#include <stdexcept>

#include "mpi/errors.h"
#include "transport/mpi/bit_allreduce.h"

namespace hvdlite {
namespace {

constexpr int kTagRequest = 101;
constexpr int kTagResponse = 102;
// On one host, Open MPI sends a message of up to 4 KiB (headers included) through shared
// memory eagerly, and a larger one by a rendezvous and a copy across processes
// (process_vm_readv): a cycle carrying a 4 KiB tensor would be just over, and two eager
// pieces cost less. Across hosts (TCP's eager limit is 64 KiB) one message costs less.
constexpr int kSharedMemoryPieceWords = 496;

}  // namespace

ControlChannel::ControlChannel(MPI_Comm base, bool one_host) : one_host_(one_host) {
  CheckMpi(MPI_Comm_dup(base, &comm_), "MPI_Comm_dup (control channel)");
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

std::unique_ptr<BitAgreement> ControlChannel::NewBitAgreement(int words, int64_t max_payload_bytes) {
  return std::make_unique<BitAllreduce>(comm_, words, max_payload_bytes, one_host_ ? kSharedMemoryPieceWords : 1 << 20);
}

ControlChannel::~ControlChannel() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  Reap(true);
  FreeCommunicator(&comm_);
}

void ControlChannel::Send(int dest, int tag, const Bytes& bytes) {
  bytes_sent_ += static_cast<int64_t>(bytes->size());
  PendingSend s;
  s.bytes = bytes;
  CheckMpi(MPI_Isend(s.bytes->data(), static_cast<int>(s.bytes->size()), MPI_BYTE, dest, tag, comm_, &s.request),
           "MPI_Isend (control channel)");
  sends_.push_back(std::move(s));
}

void ControlChannel::SendToCoordinator(Bytes bytes) { Send(0, kTagRequest, bytes); }

void ControlChannel::SendToWorkers(Bytes bytes) {
  for (int r = 1; r < size_; ++r) Send(r, kTagResponse, bytes);
}

bool ControlChannel::Receive(int source, int tag, std::vector<uint8_t>* out, int* from) {
  int flag = 0;
  MPI_Message msg;
  MPI_Status status;
  CheckMpi(MPI_Improbe(source, tag, comm_, &flag, &msg, &status), "MPI_Improbe (control channel)");
  if (!flag) return false;
  int count = 0;
  MPI_Get_count(&status, MPI_BYTE, &count);
  out->resize(static_cast<size_t>(count));
  CheckMpi(MPI_Mrecv(out->data(), count, MPI_BYTE, &msg, MPI_STATUS_IGNORE), "MPI_Mrecv (control channel)");
  if (from) *from = status.MPI_SOURCE;
  bytes_received_ += count;
  return true;
}

bool ControlChannel::ReceiveRequest(std::vector<uint8_t>* out, int* from) {
  return Receive(MPI_ANY_SOURCE, kTagRequest, out, from);
}

bool ControlChannel::ReceiveResponse(std::vector<uint8_t>* out) { return Receive(0, kTagResponse, out, nullptr); }

void ControlChannel::Reap(bool wait_all) {
  for (auto it = sends_.begin(); it != sends_.end();) {
    int done = 0;
    if (wait_all) {
      // At the end: a send that failed (its peer died, the channel was revoked) is
      // over too, and nothing is left to report it to.
      MPI_Wait(&it->request, MPI_STATUS_IGNORE);
      done = 1;
    } else {
      CheckMpi(MPI_Test(&it->request, &done, MPI_STATUS_IGNORE), "MPI_Test (control channel send)");
    }
    it = done ? sends_.erase(it) : std::next(it);
  }
}

void ControlChannel::Revoke() { hvdlite::Revoke(comm_); }

void ControlChannel::Share(void* bytes, int count, int root) {
  CheckMpi(MPI_Bcast(bytes, count, MPI_BYTE, root, comm_), "MPI_Bcast (control channel)");
}

std::vector<std::string> ControlChannel::GatherNotes(const std::string& note) {
  int mine = static_cast<int>(note.size());
  std::vector<int> lengths(size_);
  CheckMpi(MPI_Allgather(&mine, 1, MPI_INT, lengths.data(), 1, MPI_INT, comm_), "MPI_Allgather (control channel)");
  std::vector<int> displs(size_, 0);
  int total = 0;
  for (int r = 0; r < size_; ++r) {
    displs[r] = total;
    total += lengths[r];
  }
  std::string all(static_cast<size_t>(total), '\0');
  CheckMpi(MPI_Allgatherv(note.data(), mine, MPI_CHAR, all.data(), lengths.data(), displs.data(), MPI_CHAR, comm_),
           "MPI_Allgatherv (control channel)");
  std::vector<std::string> out(size_);
  for (int r = 0; r < size_; ++r) out[r] = all.substr(displs[r], lengths[r]);
  return out;
}

}  // namespace hvdlite
