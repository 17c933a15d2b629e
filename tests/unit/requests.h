// Builders for the plain data the unit tests feed the engine's parts.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/message.h"

namespace unit {

inline hvdlite::Request MakeRequest(hvdlite::RequestType type, const std::string& name, std::vector<int64_t> shape,
                                    hvdlite::DataType dtype = hvdlite::DataType::kFloat32, int32_t rank = 0) {
  hvdlite::Request r;
  r.rank = rank;
  r.type = type;
  r.name = name;
  r.shape = std::move(shape);
  r.dtype = dtype;
  return r;
}

inline hvdlite::Request Allreduce(const std::string& name, std::vector<int64_t> shape,
                                  hvdlite::DataType dtype = hvdlite::DataType::kFloat32) {
  return MakeRequest(hvdlite::RequestType::kAllreduce, name, std::move(shape), dtype);
}

inline hvdlite::Request Allgather(const std::string& name, std::vector<int64_t> shape,
                                  hvdlite::DataType dtype = hvdlite::DataType::kFloat32) {
  return MakeRequest(hvdlite::RequestType::kAllgather, name, std::move(shape), dtype);
}

inline hvdlite::Request Broadcast(const std::string& name, std::vector<int64_t> shape, int32_t root) {
  hvdlite::Request r = MakeRequest(hvdlite::RequestType::kBroadcast, name, std::move(shape));
  r.root = root;
  return r;
}

inline hvdlite::Request OnRank(hvdlite::Request r, int32_t rank) {
  r.rank = rank;
  return r;
}

// Fusion limits large enough that only the test's own limit matters.
inline hvdlite::FusionLimits Limits(int64_t allreduce_bytes, int64_t allgather_tensor_bytes = 0,
                                    int64_t allgather_bytes = 0, int64_t reducescatter_bytes = 0) {
  hvdlite::FusionLimits f;
  f.allreduce_bytes = allreduce_bytes;
  f.allgather_tensor_bytes = allgather_tensor_bytes;
  f.allgather_bytes = allgather_bytes;
  f.reducescatter_bytes = reducescatter_bytes;
  return f;
}

// A Config for `params` whose host and CUDA fusion limits are `host` and `cuda`.
inline std::unique_ptr<hvdlite::Config> MakeConfig(const hvdlite::Parameters& params,
                                                   const hvdlite::FusionLimits& host,
                                                   const hvdlite::FusionLimits& cuda = hvdlite::FusionLimits{}) {
  auto config = std::make_unique<hvdlite::Config>(params);
  config->SetFusion(host, cuda);
  return config;
}

}  // namespace unit
