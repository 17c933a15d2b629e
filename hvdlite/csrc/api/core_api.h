// The engine's C interface (c_api.h) as the core provides it: one table of function
// pointers over the process's engine and handle table, for libraries built apart from
// the core (hvdlite's TensorFlow kernels).
#pragma once

#include <memory>
#include <string>

#include "c_api.h"

namespace hvdlite {

class Engine;
class HandleTable;

// How the table reaches the process's state, which bindings.cc owns.
struct CoreAccess {
  // The engine of a process set (0: the world's), or null with the reason in `why`
  // where there is one (an unknown set, a set without this process); callable
  // without the GIL.
  std::shared_ptr<Engine> (*engine)(int32_t process_set, std::string* why) = nullptr;
  HandleTable* handles = nullptr;                 // outlives every engine
  // Non-empty when no collective can run in this process, and why (a forked copy).
  std::string (*unusable)() = nullptr;
};

// Fills the table (once, when the module loads) and returns it.
const HvdliteCoreApi* InstallCoreApi(const CoreAccess& access);

}  // namespace hvdlite
