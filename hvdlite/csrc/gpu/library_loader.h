// Finding and opening a vendor library (the CUDA runtime, NCCL) at run time, so that
// hvdlite is built without it and a machine without it runs the CPU path unchanged.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace hvdlite {

// Folders to search before the system's, per library ("cudart", "nccl"), set once by
// the Python layer, which knows where pip put the NVIDIA wheels and PyTorch's bundled
// copies (hvdlite/common/gpu_libraries.py).
void SetLibrarySearchFolders(const std::string& library, const std::vector<std::string>& folders);
std::vector<std::string> LibrarySearchFolders(const std::string& library);

// An open shared library; closed when the last owner lets go. Vendor libraries are
// kept open for the life of the process once loaded (they start threads and register
// atexit handlers), so in practice this is never closed.
class SharedLibrary {
 public:
  ~SharedLibrary();
  // The library the way `library` is configured: the file named by environment
  // variable `env` if set; else one of `sonames` already loaded in this process (by a
  // framework); else the first of `sonames` found in the search folders; else the
  // system's loader search. `probe_symbol`, one of its exports, tells which file was
  // opened. Null with `error` listing everything tried on failure.
  // `library` is the key of the search folders ("cudart", "nccl"); `display` names it
  // in messages.
  static std::shared_ptr<SharedLibrary> Open(const std::string& library, const std::string& display, const char* env,
                                             const std::vector<std::string>& sonames, const char* probe_symbol,
                                             std::string* error);
  // The address of `symbol`, or null.
  void* Symbol(const char* symbol) const;
  const std::string& path() const { return path_; }

 private:
  SharedLibrary(void* handle, std::string path) : handle_(handle), path_(std::move(path)) {}
  void* handle_;
  std::string path_;
};

// Looks `name` up in `lib` into `*slot` (a function pointer of the table a library is
// called through). When it is missing and `missing` is given, adds the name to the
// comma-separated list there, for the message that says the library is unusable.
template <typename F>
bool BindSymbol(const SharedLibrary& lib, const char* name, F* slot, std::string* missing) {
  *slot = reinterpret_cast<F>(lib.Symbol(name));
  if (!*slot && missing) *missing += std::string(missing->empty() ? "" : ", ") + name;
  return *slot != nullptr;
}

}  // namespace hvdlite
