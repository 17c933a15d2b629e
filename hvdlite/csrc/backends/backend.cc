#include "backends/backend.h"

#include "common/timeline.h"

namespace hvdlite {

bool Tracer::Active() const { return timeline_ && timeline_->Active(); }

void Tracer::Phase(const std::string& tensor, const char* phase, int64_t start_us, int64_t end_us) const {
  if (timeline_) timeline_->Phase(tensor, phase, start_us, end_us);
}

}  // namespace hvdlite
