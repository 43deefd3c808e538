// Hooks for the engine's tests; not part of the C ABI.
#pragma once

#include "zenflow/engine.h"

namespace zf {
namespace testing {

// The next chunk the engine's host lane starts throws zf::Error(ZF_ERROR_INTERNAL, message).
void inject_host_lane_fault(zf_engine* engine, const char* message);
// The engine's pool sizes: compute lane, host lane.
int compute_lane_threads(const zf_engine* engine);
int host_lane_threads(const zf_engine* engine);

}  // namespace testing
}  // namespace zf
