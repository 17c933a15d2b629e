// One tensor of this rank's, from its submission to its completion: the request, where
// its data is, and its handle. The queue holds it until its collective runs; a backend
// reads and writes its memory.
#pragma once

#include <cstdint>
#include <memory>

#include "common/handle_table.h"
#include "common/message.h"

namespace hvdlite {

struct TensorEntry {
  Request request;
  const void* input = nullptr;
  void* output = nullptr;
  int64_t handle = 0;
  // When it was queued: CoarseNowMicros, or NowMicros while the timeline records.
  int64_t enqueue_us = 0;
  // GPU tensors: an event recorded, at enqueue, on the stream that produces the tensor
  // (the framework's current stream). The collective waits for it on the device.
  std::shared_ptr<ReadyEvent> produced;
};

}  // namespace hvdlite
