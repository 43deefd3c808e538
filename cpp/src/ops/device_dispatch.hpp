// Shared pieces of every op's C entry point: which device the call runs on and the
// query-then-run workspace protocol.
#pragma once

#include <cstddef>
#include <string>

#include "common/tensor.hpp"

namespace zf {

// Fails with NOT_SUPPORTED for CUDA tensors in a build without CUDA.
void check_device_compiled(const zf_device& device, const std::string& name);

// Query-then-run: returns true when the call is only a size query (workspace == NULL and
// workspace_bytes != NULL), after storing `required` there. Otherwise checks that a
// non-zero requirement is met by the workspace given.
bool workspace_query(void* workspace, size_t* workspace_bytes, size_t required);

}  // namespace zf
