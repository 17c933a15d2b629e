#include "backends/mpi/host_memory.h"

#if defined(__linux__)
#include <sys/mman.h>

#include <cerrno>
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25  // Linux 6.1; older headers lack the name
#endif
#endif

namespace hvdlite {
namespace {

// Extents tracked at most (32 GiB of buffers): beyond that, new ones are left alone.
constexpr size_t kMaxExtents = size_t{1} << 14;

}  // namespace

HugePages::HugePages(bool enabled) : enabled_(enabled) {
#if !defined(__linux__)
  enabled_ = false;
#endif
}

void HugePages::Prepare(const void* p, int64_t bytes) {
  if (!enabled_ || bytes < kMinBytes) return;
#if defined(__linux__)
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p) & ~static_cast<uintptr_t>(kExtent - 1);
  const uintptr_t end = reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(bytes);
  for (uintptr_t e = begin; e < end && enabled_; e += kExtent) {
    auto it = extents_.find(e);
    if (it == extents_.end()) {
      if (extents_.size() < kMaxExtents) extents_.emplace(e, 1);
      continue;
    }
    if (it->second >= kDone) continue;
    if (madvise(reinterpret_cast<void*>(e), kExtent, MADV_COLLAPSE) == 0) {
      collapsed_.fetch_add(1, std::memory_order_relaxed);
      it->second = kDone;
      continue;
    }
    const int err = errno;
    // EAGAIN: a page was busy (pinned by a peer's copy, or by an RDMA registration); try
    // again on later sightings, a few times. Anything else: the extent is not eligible
    // (not all mapped, not anonymous, no memory).
    it->second = err == EAGAIN ? static_cast<uint8_t>(it->second + 1) : kDone;
    // A kernel without MADV_COLLAPSE (before 6.1) or without THP rejects every call.
    if (err == EINVAL && collapsed() == 0) enabled_ = false;
  }
#endif
}

}  // namespace hvdlite
