// zenflow._C.Engine's devices for Python: their torch names, the index argument of the
// per-device calls (device_memory_size, attach_device_memory, set_stream), and the device
// memory a caller attaches (a torch.uint8 tensor, checked against the device and the size the
// engine asked for). Which devices, and how much memory, is the engine's (zf_engine_device_at).
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "bind_engine.hpp"
#include "zenflow/engine.h"

namespace zf_py {

EngineDevice device_at(zf_engine* engine, size_t d) {
  EngineDevice out;
  check(zf_engine_device_at(engine, d, &out.device, &out.memory_bytes));
  return out;
}

size_t device_count(zf_engine* engine) {
  size_t count = 0;
  check(zf_engine_device_count(engine, &count));
  return count;
}

std::string device_name(const zf_device& device) {
  return device.type == ZF_DEVICE_CUDA ? "cuda:" + std::to_string(device.index) : std::string("cpu");
}

size_t device_index(zf_engine* engine, const py::object& index) {
  const size_t count = device_count(engine);
  if (index.is_none()) {
    if (count > 1) {
      throw py::value_error("index: the parameters are on " + std::to_string(count) +
                            " devices (devices()); give the device's index");
    }
    return 0;
  }
  const int64_t value = integer(index, "index");
  if (value < 0 || static_cast<size_t>(value) >= count) {
    throw py::value_error("index: must be in [0, " + std::to_string(count) + ") (devices()), got " +
                          std::to_string(value));
  }
  return static_cast<size_t>(value);
}

void* device_memory(zf_engine* engine, size_t d, const py::object& memory, size_t* bytes) {
  const py::module_ torch = py::module_::import("torch");
  if (!py::isinstance(memory, torch.attr("Tensor"))) {
    throw py::type_error("memory: expected a torch.Tensor of dtype torch.uint8, got " +
                         std::string(py::str(py::type::of(memory).attr("__name__"))));
  }
  if (!memory.attr("dtype").equal(torch.attr("uint8"))) {
    throw py::value_error("memory: expected dtype torch.uint8, got " + std::string(py::str(memory.attr("dtype"))));
  }
  if (!memory.attr("is_contiguous")().cast<bool>()) throw py::value_error("memory: must be contiguous");
  const EngineDevice want = device_at(engine, d);
  const py::object device = memory.attr("device");
  const std::string type = py::str(device.attr("type"));
  const bool on_cuda = type == "cuda";
  const int64_t ordinal = device.attr("index").is_none() ? 0 : device.attr("index").cast<int64_t>();
  const bool same_device = want.device.type == ZF_DEVICE_CUDA ? on_cuda && ordinal == want.device.index : type == "cpu";
  if (!same_device) {
    throw py::value_error("memory: on " + std::string(py::str(device)) + ", the parameters are on " +
                          device_name(want.device));
  }
  const int64_t numel = memory.attr("numel")().cast<int64_t>();
  if (numel < 0 || static_cast<size_t>(numel) < want.memory_bytes) {
    throw py::value_error("memory: holds " + std::to_string(numel) + " bytes, the engine needs " +
                          std::to_string(want.memory_bytes) + " (device_memory_size())");
  }
  void* data = PyLong_AsVoidPtr(memory.attr("data_ptr")().ptr());
  if (data == nullptr && PyErr_Occurred()) throw py::error_already_set();
  *bytes = static_cast<size_t>(numel);
  return data;
}

}  // namespace zf_py
