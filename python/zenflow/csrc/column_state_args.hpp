// zf_column_state arguments from Python: a 4-tuple (master or None, exp_avg, exp_avg_sq,
// steps) per matrix. Used by the optim and pack bindings.
#pragma once

#include <string>
#include <vector>

#include "tensor_convert.hpp"
#include "zenflow/optim.h"

namespace zf_py {

struct StateArgs {
  std::vector<TensorArg> keep;  // keeps every DLPack capsule alive for the call
  std::vector<zf_column_state> states;
};

// A None master becomes an empty descriptor ("no master").
StateArgs to_state_list(const py::sequence& seq, const std::string& name, Access access, intptr_t stream);

}  // namespace zf_py
