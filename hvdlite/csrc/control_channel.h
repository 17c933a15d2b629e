// The control plane's transport. Every rank other than 0 sends its requests to rank 0
// (the coordinator) and receives rank 0's response lists, as byte messages, point to
// point, on a private duplicate of hvdlite's communicator -- so neither the data plane
// nor a user's own MPI traffic ever crosses it. Sends never block: a message is handed
// to MPI and reaped once it has left.
//
// Backends use the same channel for the little setup they need from every rank at
// once (an NCCL unique id from rank 0, whether every rank could load a library): those
// calls are collective, and made while every rank executes the same response.
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <vector>

namespace hvdlite {

class ControlChannel {
 public:
  explicit ControlChannel(MPI_Comm base);  // collective: duplicates `base`
  ~ControlChannel();
  ControlChannel(const ControlChannel&) = delete;
  ControlChannel& operator=(const ControlChannel&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // After a peer failed: every call on the channel fails on every rank.
  void Revoke();

  using Bytes = std::shared_ptr<const std::vector<uint8_t>>;
  // A worker's message to the coordinator.
  void SendToCoordinator(Bytes bytes);
  // The coordinator's message to every other rank (one buffer, sent size-1 times).
  void SendToWorkers(Bytes bytes);
  // Coordinator: the next message from any rank, if one has arrived.
  bool ReceiveRequest(std::vector<uint8_t>* out, int* from);
  // Worker: the next message from the coordinator, if one has arrived.
  bool ReceiveResponse(std::vector<uint8_t>* out);
  // Forgets sends that have left; with `wait_all`, first waits for every one.
  void Reap(bool wait_all);

  // Collective setup calls (every rank, same order).
  // `bytes` from rank `root` to every rank.
  void Share(void* bytes, int count, int root);
  // Every rank's `note` (empty: all is well), indexed by rank.
  std::vector<std::string> GatherNotes(const std::string& note);

  int64_t bytes_sent() const { return bytes_sent_; }
  int64_t bytes_received() const { return bytes_received_; }

 private:
  void Send(int dest, int tag, const Bytes& bytes);
  bool Receive(int source, int tag, std::vector<uint8_t>* out, int* from);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  struct PendingSend {
    MPI_Request request;
    Bytes bytes;
  };
  std::list<PendingSend> sends_;
  std::atomic<int64_t> bytes_sent_{0};
  std::atomic<int64_t> bytes_received_{0};
};

}  // namespace hvdlite
