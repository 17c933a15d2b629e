#include "backends/nccl/nccl_library.h"

#include <mutex>

#include "common/logging.h"
#include "gpu/library_loader.h"

namespace hvdlite {
namespace nccl {
namespace {

std::once_flag g_once;
Library* g_library = nullptr;  // kept for the life of the process
std::string g_error;

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
    BindSymbol(*lib, "ncclGetVersion", &a.GetVersion, &missing);
    BindSymbol(*lib, "ncclGetUniqueId", &a.GetUniqueId, &missing);
    BindSymbol(*lib, "ncclCommInitRank", &a.CommInitRank, &missing);
    BindSymbol(*lib, "ncclCommDestroy", &a.CommDestroy, &missing);
    BindSymbol(*lib, "ncclCommAbort", &a.CommAbort, &missing);
    BindSymbol(*lib, "ncclCommGetAsyncError", &a.CommGetAsyncError, &missing);
    BindSymbol(*lib, "ncclGetErrorString", &a.GetErrorString, &missing);
    BindSymbol(*lib, "ncclGetLastError", &a.GetLastError, nullptr);
    BindSymbol(*lib, "ncclAllReduce", &a.AllReduce, &missing);
    BindSymbol(*lib, "ncclBroadcast", &a.Broadcast, &missing);
    BindSymbol(*lib, "ncclReduceScatter", &a.ReduceScatter, &missing);
    BindSymbol(*lib, "ncclAllGather", &a.AllGather, &missing);
    BindSymbol(*lib, "ncclSend", &a.Send, &missing);
    BindSymbol(*lib, "ncclRecv", &a.Recv, &missing);
    BindSymbol(*lib, "ncclGroupStart", &a.GroupStart, &missing);
    BindSymbol(*lib, "ncclGroupEnd", &a.GroupEnd, &missing);
    BindSymbol(*lib, "ncclRedOpCreatePreMulSum", &a.RedOpCreatePreMulSum, &missing);
    BindSymbol(*lib, "ncclRedOpDestroy", &a.RedOpDestroy, &missing);
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
