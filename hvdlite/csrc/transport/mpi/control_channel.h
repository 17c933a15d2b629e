// The control plane's transport over MPI (control_transport.h): byte messages, point to
// point, on a private duplicate of hvdlite's communicator. Sends never block: a message
// is handed to MPI and reaped once it has left. The cycles' agreement runs on a
// duplicate of its own (BitAllreduce).
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include "transport/control_transport.h"

namespace hvdlite {

class ControlChannel : public ControlTransport {
 public:
  // Collective: duplicates `base`. `one_host`: every rank runs on this host (the
  // cycles' messages are then cut to Open MPI's shared-memory eager size).
  ControlChannel(MPI_Comm base, bool one_host);
  ~ControlChannel() override;
  ControlChannel(const ControlChannel&) = delete;
  ControlChannel& operator=(const ControlChannel&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void Revoke() override;

  void SendToCoordinator(Bytes bytes) override;
  // One buffer, sent size-1 times.
  void SendToWorkers(Bytes bytes) override;
  bool ReceiveRequest(std::vector<uint8_t>* out, int* from) override;
  bool ReceiveResponse(std::vector<uint8_t>* out) override;
  void Reap(bool wait_all) override;

  void Share(void* bytes, int count, int root) override;
  std::vector<std::string> GatherNotes(const std::string& note) override;
  std::unique_ptr<BitAgreement> NewBitAgreement(int words, int64_t max_payload_bytes) override;

  int64_t bytes_sent() const override { return bytes_sent_; }
  int64_t bytes_received() const override { return bytes_received_; }

 private:
  void Send(int dest, int tag, const Bytes& bytes);
  bool Receive(int source, int tag, std::vector<uint8_t>* out, int* from);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  bool one_host_ = false;
  struct PendingSend {
    MPI_Request request;
    Bytes bytes;
  };
  std::list<PendingSend> sends_;
  std::atomic<int64_t> bytes_sent_{0};
  std::atomic<int64_t> bytes_received_{0};
};

}  // namespace hvdlite
