// Python objects -> zf_tensor descriptors.
//
// torch tensors take a direct path: data_ptr, shape, strides, dtype and device are read
// through cheap attribute access (no DLPack capsule, no detach for tensors that require
// grad), about a microsecond per tensor. Other arrays go through DLPack (numpy, cupy, jax,
// ...) or, for CPU arrays without DLPack, the NumPy array interface; a TensorArg keeps the
// exporting capsule alive for the duration of the call.
//
// Argument names for error messages are built only when a conversion fails (ArgName).
#pragma once

#include <pybind11/pybind11.h>

#include <string>
#include <vector>

#include "zenflow/zenflow.h"

namespace zf_py {

namespace py = pybind11;

struct TensorArg {
  zf_tensor tensor{};
  py::object keep_alive;        // the DLPack capsule (or the source object)
  bool is_torch_write = false;  // a torch tensor the call writes: its version is bumped after success
};

enum class Access { kRead, kWrite };

// "list[index].field", formatted only on the error path. index < 0: no index; field may be null.
struct ArgName {
  const char* list = "";
  ptrdiff_t index = -1;
  const char* field = nullptr;
  const std::string* owned = nullptr;  // a full name given as a string (the legacy helpers)
  std::string str() const;
};

// `name` is the Python argument name used in error messages ("grads[2]"). `stream` is the
// CUDA stream the call will run on (0: legacy default), handed to __dlpack__ so the
// producer orders its pending work before ours.
TensorArg to_tensor(const py::handle& obj, const std::string& name, Access access, intptr_t stream);
std::vector<TensorArg> to_tensor_list(const py::handle& seq, const std::string& name, Access access, intptr_t stream);
std::vector<zf_tensor> descriptors(const std::vector<TensorArg>& args);
// After a successful call through these helpers: bumps the autograd version of every torch
// tensor among `args` that was converted for writing (TensorArg::is_torch_write).
void bump_versions(const std::vector<const TensorArg*>& args);

// Raises the Python exception for a failed zenflow status (ValueError, TypeError, ...).
[[noreturn]] void throw_status(zf_status status);
// The same for a status and its message (a zenflow::Error's, from the C++ layer).
[[noreturn]] void throw_error(zf_status status, const std::string& message);
inline void check(zf_status status) {
  if (status != ZF_SUCCESS) throw_status(status);
}

// The CUDA stream a call consumes its arrays on, handed to a DLPack producer (cupy, ...) so
// that it orders its pending work before ours: one stream for every device, or, for an
// engine over several devices, one per CUDA device ordinal (where set).
struct ConsumerStreams {
  intptr_t stream = 0;              // a cudaStream_t; 0: the legacy default stream
  std::vector<intptr_t> by_device;  // by CUDA ordinal; -1: not set (then `stream`)
  intptr_t of(int device) const {
    if (device >= 0 && static_cast<size_t>(device) < by_device.size() && by_device[device] >= 0)
      return by_device[device];
    return stream;
  }
};

// The fast path: one Converter per call converts every argument once, keeps what must stay
// alive, and remembers the torch tensors it will write, so that their autograd version
// counters are bumped (bump_versions) once the C call has succeeded, as torch's own in-place
// ops do.
class Converter {
 public:
  explicit Converter(intptr_t stream = 0) { streams_.stream = stream; }
  explicit Converter(ConsumerStreams streams) : streams_(std::move(streams)) {}

  zf_tensor tensor(py::handle obj, const ArgName& name, Access access);
  // A list or tuple of arrays; anything else (None included) is a TypeError naming it.
  std::vector<zf_tensor> list(py::handle seq, const char* name, Access access);
  // As list(), but None gives an empty vector (a NULL array at the C ABI).
  std::vector<zf_tensor> optional_list(py::handle seq, const char* name, Access access);
  // The zf_column_state of each (master or None, exp_avg, exp_avg_sq, steps) entry.
  std::vector<zf_column_state> states(py::handle seq, const char* name, Access access);
  // One (master or None, exp_avg, exp_avg_sq, steps) entry; index < 0: named `name` alone.
  zf_column_state state(py::handle entry, const char* name, ptrdiff_t index, Access access);

  // Calls the C function with the GIL released, raises on failure, bumps versions on success.
  template <typename Fn>
  void run(Fn&& fn) {
    zf_status status;
    {
      py::gil_scoped_release release;
      status = fn();
    }
    check(status);
    bump_versions();
  }
  void bump_versions();

 private:
  ConsumerStreams streams_;
  std::vector<py::object> keep_;    // DLPack capsules / array-interface sources
  std::vector<PyObject*> written_;  // torch tensors written (borrowed: the caller holds them)
};

// A sequence argument as a fast sequence; raises TypeError naming it for anything but a
// list or tuple.
py::object as_fast_sequence(py::handle seq, const char* name);

// Requires `got == expected` entries, else ValueError naming `name`.
void require_length(size_t expected, size_t got, const char* name, const char* what);

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

// Query-then-run with one conversion. CPU calls need no workspace (the headers say so), so
// they run at once, validated once. CUDA calls: `call(workspace, bytes)` runs once with a
// NULL workspace to learn the size; when it is not 0, `allocate(bytes)` (a Python callable)
// returns the buffer and the call runs again with it. Returns the bytes used.
template <typename Call>
size_t run_with_workspace(Converter& conv, bool on_cuda, const py::object& allocate, Call&& call) {
  if (!on_cuda) {
    conv.run([&] { return call(nullptr, nullptr); });
    return 0;
  }
  size_t bytes = 0;
  {
    zf_status status;
    {
      py::gil_scoped_release release;
      status = call(nullptr, &bytes);
    }
    check(status);
  }
  if (bytes == 0) {
    conv.run([&] { return call(nullptr, nullptr); });
    return 0;
  }
  if (allocate.is_none()) throw py::value_error("workspace: the call needs scratch memory but no allocator was given");
  const py::object buffer = allocate(bytes);
  Workspace ws = to_workspace(buffer, false, 0);
  if (ws.bytes < bytes) throw py::value_error("workspace: the allocator returned fewer bytes than asked for");
  conv.run([&] {
    size_t have = ws.bytes;
    return call(ws.data, &have);
  });
  return bytes;
}

}  // namespace zf_py
