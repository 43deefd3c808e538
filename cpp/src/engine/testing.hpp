// Hooks for the engine's tests; not part of the C ABI.
#pragma once

#include <memory>
#include <vector>

#include "engine/backend.hpp"
#include "zenflow/engine.h"

namespace zf {
namespace testing {

// The next chunk the engine's host lane starts throws zf::Error(ZF_ERROR_INTERNAL, message).
void inject_host_lane_fault(zf_engine* engine, const char* message);
// The engine's pool sizes: compute lane, host lane.
int compute_lane_threads(const zf_engine* engine);
int host_lane_threads(const zf_engine* engine);
// Runs the engine on `backend` (before its first step or load, no device memory attached).
void use_backend(zf_engine* engine, std::unique_ptr<Backend> backend);
// Waits for every lane of the engine's backend (the host lane excluded).
void synchronize_backend(zf_engine* engine);
// The engine's staging buckets: [first, last) in matrix order (matrices are the
// parameters with ndim >= 2 outside dense groups, in parameter order), dtype, and the
// packed bytes of a bucket with nothing selected.
struct BucketSpan {
  size_t first, last;
  zf_dtype dtype;
  size_t max_bytes;
};
std::vector<BucketSpan> buckets(const zf_engine* engine);

}  // namespace testing
}  // namespace zf
