#include "control_channel.h"

#include <stdexcept>

namespace hvdlite {
namespace {

constexpr int kTagRequest = 101;
constexpr int kTagResponse = 102;

}  // namespace

ControlChannel::ControlChannel(MPI_Comm base) {
  MPI_Comm_dup(base, &comm_);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

ControlChannel::~ControlChannel() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  Reap(true);
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void ControlChannel::Send(int dest, int tag, const Bytes& bytes) {
  bytes_sent_ += static_cast<int64_t>(bytes->size());
  PendingSend s;
  s.bytes = bytes;
  MPI_Isend(s.bytes->data(), static_cast<int>(s.bytes->size()), MPI_BYTE, dest, tag, comm_, &s.request);
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
  MPI_Improbe(source, tag, comm_, &flag, &msg, &status);
  if (!flag) return false;
  int count = 0;
  MPI_Get_count(&status, MPI_BYTE, &count);
  out->resize(static_cast<size_t>(count));
  MPI_Mrecv(out->data(), count, MPI_BYTE, &msg, MPI_STATUS_IGNORE);
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
      MPI_Wait(&it->request, MPI_STATUS_IGNORE);
      done = 1;
    } else {
      MPI_Test(&it->request, &done, MPI_STATUS_IGNORE);
    }
    it = done ? sends_.erase(it) : std::next(it);
  }
}

void ControlChannel::Share(void* bytes, int count, int root) {
  if (MPI_Bcast(bytes, count, MPI_BYTE, root, comm_) != MPI_SUCCESS)
    throw std::runtime_error("hvdlite: MPI_Bcast on the control channel failed");
}

std::vector<std::string> ControlChannel::GatherNotes(const std::string& note) {
  int mine = static_cast<int>(note.size());
  std::vector<int> lengths(size_);
  MPI_Allgather(&mine, 1, MPI_INT, lengths.data(), 1, MPI_INT, comm_);
  std::vector<int> displs(size_, 0);
  int total = 0;
  for (int r = 0; r < size_; ++r) {
    displs[r] = total;
    total += lengths[r];
  }
  std::string all(static_cast<size_t>(total), '\0');
  MPI_Allgatherv(note.data(), mine, MPI_CHAR, all.data(), lengths.data(), displs.data(), MPI_CHAR, comm_);
  std::vector<std::string> out(size_);
  for (int r = 0; r < size_; ++r) out[r] = all.substr(displs[r], lengths[r]);
  return out;
}

}  // namespace hvdlite
