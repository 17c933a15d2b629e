// What the negotiation hands on: the collectives every rank has agreed to run, one at a
// time, in the one order every rank follows. The executor (engine/executor.h) runs them
// on the backends; the unit tests record them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/message.h"

namespace hvdlite {

class AgreedWork {
 public:
  virtual ~AgreedWork() = default;
  // Runs response `r` (a collective, a barrier, a join, or a failure every rank
  // reports), for this rank's tensors of those names.
  virtual void Run(const Response& r) = 0;
  // A tensor the cycle itself reduced (CacheCycle::CanCarry): its request's signature
  // and its sum over all ranks, before postscale.
  virtual void RunCarried(const Request& sig, const void* sum) = 0;
  // This rank has device work in flight (rank 0 then holds GPU tensors back, so that
  // those that become ready meanwhile go out fused).
  virtual bool DeviceBusy() const = 0;
  // A failure: stop device work queued for peers that will not join it.
  virtual void Abort(const std::string& why) = 0;
  // The tunables in the configuration changed: what follows from them (the fusion
  // limits) is brought up to date before anything else runs.
  virtual void TunablesChanged() = 0;
};

}  // namespace hvdlite
