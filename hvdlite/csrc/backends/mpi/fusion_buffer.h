// A reusable host buffer: allocated once at its largest size and reused every cycle.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>

namespace hvdlite {

class FusionBuffer {
 public:
  uint8_t* Get(int64_t bytes) {
    if (bytes > capacity_) {
      void* p = nullptr;
      if (posix_memalign(&p, 64, static_cast<size_t>(bytes)) != 0) throw std::bad_alloc();
      data_.reset(static_cast<uint8_t*>(p));
      capacity_ = bytes;
    }
    return data_.get();
  }

 private:
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  std::unique_ptr<uint8_t, Free> data_;
  int64_t capacity_ = 0;
};

}  // namespace hvdlite
