// Hooks for the engine's tests; not part of the C ABI.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "engine/backend.hpp"
#include "zenflow/engine.h"

namespace zf {
namespace testing {

// The next chunk each of the engine's host lanes starts throws zf::Error(ZF_ERROR_INTERNAL, message).
void inject_host_lane_fault(zf_engine* engine, const char* message);
// The engine's pool sizes (of its device `device`): compute lane, host lane.
int compute_lane_threads(const zf_engine* engine, size_t device = 0);
int host_lane_threads(const zf_engine* engine, size_t device = 0);
// Runs the engine (its device `device`) on `backend` (before its first step or load, no
// device memory attached).
void use_backend(zf_engine* engine, std::unique_ptr<Backend> backend, size_t device = 0);
// Waits for every lane of the engine's backends (the host lanes excluded).
void synchronize_backend(zf_engine* engine);
// fuse false: every device's engine accumulates a window's closing step as any other step
// and reads A back in the update (the unfused passes), instead of packing that step into U.
void set_fuse_window_close(zf_engine* engine, bool fuse);
// Bytes of host memory the engine's host state and pinned buffers hold (their capacity),
// over its devices: 0 before the first step or load, this rank's share after.
size_t host_memory_capacity(const zf_engine* engine);
// Where every host array the host lanes stream starts (Engine::host_stream_bases_for_testing),
// over the engine's devices.
std::vector<const void*> host_stream_bases(const zf_engine* engine);
// The blocks of host memory the engine allocated for its host lanes to stream
// (Engine::host_stream_blocks_for_testing), over the engine's devices, as (start, bytes).
std::vector<std::pair<const void*, size_t>> host_stream_blocks(const zf_engine* engine);
// The engine's staging buckets: [first, last) in matrix order (matrices are the
// parameters with ndim >= 2 outside dense groups, in parameter order), dtype, and the
// packed bytes of a bucket with nothing selected.
struct BucketSpan {
  size_t first, last;
  zf_dtype dtype;
  size_t max_bytes;
};
std::vector<BucketSpan> buckets(const zf_engine* engine);
// An engine over CPU parameters split into parts as if they were on several devices:
// parts[i] is params[i]'s (parts 0..N-1, each used). Each part runs on its own host backend
// (or the one use_backend gives it) and the engine drives them as it drives several GPUs.
// Destroy it with zf_engine_destroy.
zf_engine* create_engine_in_parts(const std::vector<zf_tensor>& params, const std::vector<int32_t>& param_groups,
                                  const std::vector<zf_engine_group>& groups, const zf_engine_config& config,
                                  const std::vector<size_t>& parts);

}  // namespace testing
}  // namespace zf
