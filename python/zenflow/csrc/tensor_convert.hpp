// Python objects -> zf_tensor descriptors, through DLPack (torch, numpy, cupy, jax, ...)
// or, for CPU arrays without DLPack, the NumPy array interface. A TensorArg keeps the
// exporting capsule alive for the duration of the call.
#pragma once

#include <pybind11/pybind11.h>

#include <string>
#include <vector>

#include "zenflow/zenflow.h"

namespace zf_py {

namespace py = pybind11;

struct TensorArg {
  zf_tensor tensor{};
  py::object keep_alive;  // the DLPack capsule (or the source object)
};

enum class Access { kRead, kWrite };

// `name` is the Python argument name used in error messages ("grads[2]"). `stream` is the
// CUDA stream the call will run on (0: legacy default), handed to __dlpack__ so the
// producer orders its pending work before ours.
TensorArg to_tensor(const py::handle& obj, const std::string& name, Access access, intptr_t stream);
std::vector<TensorArg> to_tensor_list(const py::handle& seq, const std::string& name, Access access, intptr_t stream);
std::vector<zf_tensor> descriptors(const std::vector<TensorArg>& args);

// Raises the Python exception for a failed zenflow status (ValueError, TypeError, ...).
void throw_status(zf_status status);
inline void check(zf_status status) {
  if (status != ZF_SUCCESS) throw_status(status);
}

}  // namespace zf_py

namespace zf_py {

// The optional scratch buffer of the query-then-run protocol. In query mode the C call
// only stores the size it needs; otherwise it gets the buffer (or none) and its size.
struct Workspace {
  TensorArg arg;
  void* data = nullptr;
  size_t bytes = 0;
  bool query = false;
  void* c_data() const { return query ? nullptr : data; }
  size_t* c_bytes() { return (query || data != nullptr) ? &bytes : nullptr; }
};
Workspace to_workspace(const py::object& obj, bool query, intptr_t stream);

}  // namespace zf_py
