#include "host_memory.h"

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
      if (extents_.size() < kMaxExtents) extents_.emplace(e, kSeenOnce);
      continue;
    }
    if (it->second == kDone) continue;
    if (madvise(reinterpret_cast<void*>(e), kExtent, MADV_COLLAPSE) == 0) {
      collapsed_.fetch_add(1, std::memory_order_relaxed);
      it->second = kDone;
      continue;
    }
    const int err = errno;
    if (err == EAGAIN) continue;  // transient (a page busy, e.g. pinned by a peer's copy): next time
    it->second = kDone;           // not eligible (not all mapped, not anonymous, no memory)
    // A kernel without MADV_COLLAPSE (before 6.1) or without THP rejects every call.
    if (err == EINVAL && collapsed() == 0) enabled_ = false;
  }
#endif
}

}  // namespace hvdlite
