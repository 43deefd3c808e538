// zenflow._C.Engine.set_collectives: the Python callables behind the engine's data-parallel
// collectives (engine.h: zf_engine_collectives). The engine decides what to reduce, scatter
// and gather, and when; these trampolines only carry each call to Python and its failure back.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <exception>
#include <string>
#include <utility>

#include "bind_engine.hpp"
#include "zenflow/engine.h"

namespace zf_py {

namespace {

const char* dtype_name(zf_dtype dtype) {
  switch (dtype) {
    case ZF_DTYPE_F32:
      return "float32";
    case ZF_DTYPE_F16:
      return "float16";
    case ZF_DTYPE_BF16:
      return "bfloat16";
    case ZF_DTYPE_I32:
      return "int32";
    case ZF_DTYPE_I64:
      return "int64";
  }
  return "unknown";
}

bool interpreter_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

uintptr_t address(const void* data) { return reinterpret_cast<uintptr_t>(data); }
uintptr_t stream_handle(zf_stream stream) { return reinterpret_cast<uintptr_t>(stream); }

}  // namespace

PyCollectives::PyCollectives(const py::object& rank, const py::object& world_size, py::object all_reduce_sum,
                             py::object reduce_scatter_sum, py::object all_gather) {
  const int64_t rank_value = integer(rank, "rank");
  const int64_t size_value = integer(world_size, "world_size");
  if (size_value < 1 || size_value > INT32_MAX)
    throw py::value_error("world_size: must be >= 1, got " + std::to_string(size_value));
  if (rank_value < 0 || rank_value >= size_value) {
    throw py::value_error("rank: must be in [0, world_size) = [0, " + std::to_string(size_value) + "), got " +
                          std::to_string(rank_value));
  }
  const std::pair<const char*, const py::object*> functions[] = {
      {"all_reduce_sum", &all_reduce_sum}, {"reduce_scatter_sum", &reduce_scatter_sum}, {"all_gather", &all_gather}};
  for (const auto& function : functions) {
    if (!PyCallable_Check(function.second->ptr())) {
      throw py::type_error(std::string(function.first) + ": expected a callable, got " +
                           std::string(py::str(py::type::of(*function.second).attr("__name__"))));
    }
  }
  all_reduce_sum_ = std::move(all_reduce_sum);
  reduce_scatter_sum_ = std::move(reduce_scatter_sum);
  all_gather_ = std::move(all_gather);
  table_.user = this;
  table_.rank = static_cast<int32_t>(rank_value);
  table_.world_size = static_cast<int32_t>(size_value);
  table_.all_reduce_sum = &PyCollectives::all_reduce_trampoline;
  table_.reduce_scatter_sum = &PyCollectives::reduce_scatter_trampoline;
  table_.all_gather = &PyCollectives::all_gather_trampoline;
  table_.last_error = &PyCollectives::last_error_trampoline;
}

// Runs `fn` (which calls one Python callable) with the GIL held; never lets an exception out.
template <typename Fn>
zf_status PyCollectives::invoke(const char* which, Fn&& fn) noexcept {
  if (!Py_IsInitialized() || interpreter_finalizing()) {
    error_ = std::string(which) + ": the Python interpreter is shutting down";
    return ZF_ERROR_INTERNAL;
  }
  py::gil_scoped_acquire gil;
  try {
    fn();
    return ZF_SUCCESS;
  } catch (py::error_already_set& e) {
    std::string type = "Exception";
    try {
      type = py::str(e.type().attr("__name__"));
      error_ = std::string(which) + " raised " + type + ": " + std::string(py::str(e.value()));
    } catch (...) {
      error_ = std::string(which) + " raised " + type;
    }
  } catch (const std::exception& e) {
    error_ = std::string(which) + " raised " + e.what();
  } catch (...) {
    error_ = std::string(which) + " raised an unknown C++ exception";
  }
  return ZF_ERROR_INTERNAL;
}

zf_status PyCollectives::all_reduce_trampoline(void* user, void* data, size_t count, zf_dtype dtype, zf_stream stream) {
  auto* self = static_cast<PyCollectives*>(user);
  return self->invoke("all_reduce_sum",
                      [&] { self->all_reduce_sum_(address(data), count, dtype_name(dtype), stream_handle(stream)); });
}

zf_status PyCollectives::reduce_scatter_trampoline(void* user, const void* in, void* out, size_t count, zf_dtype dtype,
                                                   zf_stream stream) {
  auto* self = static_cast<PyCollectives*>(user);
  return self->invoke("reduce_scatter_sum", [&] {
    self->reduce_scatter_sum_(address(in), address(out), count, dtype_name(dtype), stream_handle(stream));
  });
}

zf_status PyCollectives::all_gather_trampoline(void* user, const void* in, void* out, size_t count, zf_dtype dtype,
                                               zf_stream stream) {
  auto* self = static_cast<PyCollectives*>(user);
  return self->invoke("all_gather", [&] {
    self->all_gather_(address(in), address(out), count, dtype_name(dtype), stream_handle(stream));
  });
}

const char* PyCollectives::last_error_trampoline(void* user) {
  return static_cast<PyCollectives*>(user)->error_.c_str();
}

}  // namespace zf_py
