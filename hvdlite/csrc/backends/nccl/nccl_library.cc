#include "backends/nccl/nccl_library.h"

#include <mutex>

#include "gpu/library_loader.h"
#include "logging.h"

namespace hvdlite {
namespace nccl {
namespace {

std::once_flag g_once;
Library* g_library = nullptr;  // kept for the life of the process
std::string g_error;

template <typename F>
void Bind(const SharedLibrary& lib, const char* name, F* slot, std::string* missing) {
  *slot = reinterpret_cast<F>(lib.Symbol(name));
  if (!*slot && missing) *missing += std::string(missing->empty() ? "" : ", ") + name;
}

}  // namespace

Library* Library::TryGet(std::string* error) {
  std::call_once(g_once, [] {
    std::string why;
    auto lib = SharedLibrary::Open("nccl", "NCCL (libnccl)", "HVDLITE_NCCL_LIBRARY", {"libnccl.so.2", "libnccl.so"},
                                   "ncclGetErrorString", &why);
    if (!lib) {
      g_error = why;
      return;
    }
    std::unique_ptr<Library> l(new Library());
    Api& a = l->api_;
    std::string missing;
    Bind(*lib, "ncclGetVersion", &a.GetVersion, &missing);
    Bind(*lib, "ncclGetUniqueId", &a.GetUniqueId, &missing);
    Bind(*lib, "ncclCommInitRank", &a.CommInitRank, &missing);
    Bind(*lib, "ncclCommDestroy", &a.CommDestroy, &missing);
    Bind(*lib, "ncclCommAbort", &a.CommAbort, &missing);
    Bind(*lib, "ncclCommGetAsyncError", &a.CommGetAsyncError, &missing);
    Bind(*lib, "ncclGetErrorString", &a.GetErrorString, &missing);
    Bind(*lib, "ncclGetLastError", &a.GetLastError, nullptr);
    Bind(*lib, "ncclAllReduce", &a.AllReduce, &missing);
    Bind(*lib, "ncclBroadcast", &a.Broadcast, &missing);
    Bind(*lib, "ncclReduceScatter", &a.ReduceScatter, &missing);
    Bind(*lib, "ncclAllGather", &a.AllGather, &missing);
    Bind(*lib, "ncclSend", &a.Send, &missing);
    Bind(*lib, "ncclRecv", &a.Recv, &missing);
    Bind(*lib, "ncclGroupStart", &a.GroupStart, &missing);
    Bind(*lib, "ncclGroupEnd", &a.GroupEnd, &missing);
    Bind(*lib, "ncclRedOpCreatePreMulSum", &a.RedOpCreatePreMulSum, &missing);
    Bind(*lib, "ncclRedOpDestroy", &a.RedOpDestroy, &missing);
    if (!missing.empty()) {
      g_error = "hvdlite: " + lib->path() + " lacks " + missing + " (hvdlite needs NCCL 2.11 or newer)";
      return;
    }
    a.GetVersion(&l->version_);
    l->lib_ = std::move(lib);
    HVD_INFO("NCCL " << l->VersionString() << " loaded from " << l->lib_->path());
    g_library = l.release();
  });
  if (!g_library && error) *error = g_error;
  return g_library;
}

const std::string& Library::path() const { return lib_->path(); }

std::string Library::VersionString() const {
  // NCCL >= 2.9 encodes X.Y.Z as X*10000 + Y*100 + Z; older ones as X*1000 + Y*100 + Z.
  const int v = version_;
  const int major = v >= 10000 ? v / 10000 : v / 1000;
  const int minor = v >= 10000 ? (v / 100) % 100 : (v / 100) % 10;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(v % 100);
}

std::string Library::ErrorString(Result r, Comm comm) const {
  std::string s = api_.GetErrorString ? api_.GetErrorString(r) : "unknown NCCL error";
  s += " (" + std::to_string(r) + ")";
  if (comm && api_.GetLastError) {
    const char* last = api_.GetLastError(comm);
    if (last && *last) s += ": " + std::string(last);
  }
  return s;
}

}  // namespace nccl
}  // namespace hvdlite
