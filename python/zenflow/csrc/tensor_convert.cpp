#include "tensor_convert.hpp"

#include <cstring>

namespace zf_py {
namespace {

// DLPack ABI (the public specification, v1.0), declared here to avoid a build dependency.
struct DLDevice {
  int32_t device_type;
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor*);
};
struct DLPackVersion {
  uint32_t major;
  uint32_t minor;
};
struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned*);
  uint64_t flags;
  DLTensor dl_tensor;
};
constexpr int32_t kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLCUDAManaged = 13;
constexpr uint8_t kDLInt = 0, kDLFloat = 2, kDLBfloat = 4;
constexpr uint64_t kDLFlagReadOnly = 1;

[[noreturn]] void type_error(const std::string& message) { throw py::type_error(message); }
[[noreturn]] void value_error(const std::string& message) { throw py::value_error(message); }

zf_dtype dtype_from_dlpack(const DLDataType& t, const std::string& name) {
  if (t.lanes == 1) {
    if (t.code == kDLFloat && t.bits == 32) return ZF_DTYPE_F32;
    if (t.code == kDLFloat && t.bits == 16) return ZF_DTYPE_F16;
    if (t.code == kDLBfloat && t.bits == 16) return ZF_DTYPE_BF16;
    if (t.code == kDLInt && t.bits == 32) return ZF_DTYPE_I32;
    if (t.code == kDLInt && t.bits == 64) return ZF_DTYPE_I64;
  }
  type_error(name + ": unsupported dtype (DLPack code " + std::to_string(t.code) + ", " + std::to_string(t.bits) +
             " bits); zenflow takes float32, float16, bfloat16, int32 and int64");
}

zf_tensor from_dltensor(const DLTensor& dl, const std::string& name) {
  zf_tensor t{};
  if (dl.ndim > ZF_MAX_DIMS) value_error(name + ": more than " + std::to_string(ZF_MAX_DIMS) + " dimensions");
  t.dtype = dtype_from_dlpack(dl.dtype, name);
  switch (dl.device.device_type) {
    case kDLCPU:
    case kDLCUDAHost:
      t.device = zf_device{ZF_DEVICE_CPU, 0};
      break;
    case kDLCUDA:
    case kDLCUDAManaged:
      t.device = zf_device{ZF_DEVICE_CUDA, dl.device.device_id};
      break;
    default:
      type_error(name + ": unsupported device (DLPack device type " + std::to_string(dl.device.device_type) + ")");
  }
  t.data = dl.data ? static_cast<char*>(dl.data) + dl.byte_offset : nullptr;
  t.ndim = dl.ndim;
  int64_t stride = 1;
  for (int d = dl.ndim - 1; d >= 0; --d) {
    t.shape[d] = dl.shape[d];
    t.strides[d] = dl.strides ? dl.strides[d] : stride;
    stride *= dl.shape[d];
  }
  return t;
}

// Capsules are left unconsumed: their own destructor calls the producer's deleter.
TensorArg from_dlpack(const py::handle& obj, const std::string& name, Access access, intptr_t stream) {
  bool on_cuda = false;
  if (py::hasattr(obj, "__dlpack_device__")) {
    const py::tuple device = obj.attr("__dlpack_device__")();
    const int device_type = device[0].cast<int>();
    on_cuda = device_type == kDLCUDA || device_type == kDLCUDAManaged;
  }
  py::object capsule;
  py::dict kwargs;
  if (on_cuda) kwargs["stream"] = stream == 0 ? py::int_(1) : py::int_(stream);  // 1: legacy default stream
  try {
    py::dict versioned = kwargs;
    versioned["max_version"] = py::make_tuple(1, 0);
    capsule = obj.attr("__dlpack__")(**versioned);
  } catch (py::error_already_set& e) {
    if (!e.matches(PyExc_TypeError)) throw;
    capsule = obj.attr("__dlpack__")(**kwargs);  // producer predates DLPack 1.0
  }
  TensorArg arg;
  arg.keep_alive = capsule;
  PyObject* raw = capsule.ptr();
  if (PyCapsule_IsValid(raw, "dltensor_versioned")) {
    auto* managed = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(raw, "dltensor_versioned"));
    if (access == Access::kWrite && (managed->flags & kDLFlagReadOnly)) {
      value_error(name + ": is read-only, but zenflow writes its result there");
    }
    arg.tensor = from_dltensor(managed->dl_tensor, name);
  } else if (PyCapsule_IsValid(raw, "dltensor")) {
    auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(raw, "dltensor"));
    arg.tensor = from_dltensor(managed->dl_tensor, name);
  } else {
    type_error(name + ": __dlpack__ did not return a DLPack capsule");
  }
  return arg;
}

zf_dtype dtype_from_typestr(const std::string& typestr, const std::string& name) {
  if (typestr == "<f4") return ZF_DTYPE_F32;
  if (typestr == "<f2") return ZF_DTYPE_F16;
  if (typestr == "<i4") return ZF_DTYPE_I32;
  if (typestr == "<i8") return ZF_DTYPE_I64;
  type_error(name + ": unsupported array-interface dtype '" + typestr +
             "'; zenflow takes float32, float16, int32 and int64 (bfloat16 through DLPack)");
}

TensorArg from_array_interface(const py::handle& obj, const std::string& name, Access access) {
  const py::dict info = obj.attr("__array_interface__");
  TensorArg arg;
  arg.keep_alive = py::reinterpret_borrow<py::object>(obj);
  zf_tensor& t = arg.tensor;
  t.dtype = dtype_from_typestr(info["typestr"].cast<std::string>(), name);
  t.device = zf_device{ZF_DEVICE_CPU, 0};
  const py::tuple data = info["data"];
  if (access == Access::kWrite && data[1].cast<bool>()) value_error(name + ": is read-only, but zenflow writes there");
  t.data = reinterpret_cast<void*>(data[0].cast<uintptr_t>());
  const py::tuple shape = info["shape"];
  if (shape.size() > ZF_MAX_DIMS) value_error(name + ": too many dimensions");
  t.ndim = static_cast<int32_t>(shape.size());
  const int64_t item = static_cast<int64_t>(zf_dtype_size(t.dtype));
  const bool has_strides = info.contains("strides") && !info["strides"].is_none();
  int64_t stride = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    t.shape[d] = shape[static_cast<size_t>(d)].cast<int64_t>();
    if (has_strides) {
      const int64_t bytes = info["strides"].cast<py::tuple>()[static_cast<size_t>(d)].cast<int64_t>();
      if (bytes % item != 0) value_error(name + ": stride is not a multiple of the element size");
      t.strides[d] = bytes / item;
    } else {
      t.strides[d] = stride;
    }
    stride *= t.shape[d];
  }
  return arg;
}

}  // namespace

TensorArg to_tensor(const py::handle& obj, const std::string& name, Access access, intptr_t stream) {
  if (py::hasattr(obj, "__dlpack__")) return from_dlpack(obj, name, access, stream);
  if (py::hasattr(obj, "__array_interface__")) return from_array_interface(obj, name, access);
  type_error(name + ": expected an array (torch, numpy or cupy, via DLPack or the array interface), got " +
             std::string(py::str(py::type::handle_of(obj).attr("__name__"))));
}

std::vector<TensorArg> to_tensor_list(const py::handle& seq, const std::string& name, Access access, intptr_t stream) {
  if (!py::isinstance<py::sequence>(seq) || py::isinstance<py::str>(seq)) {
    type_error(name + ": expected a list of arrays");
  }
  std::vector<TensorArg> args;
  const py::sequence items = py::reinterpret_borrow<py::sequence>(seq);
  args.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    args.push_back(to_tensor(items[i], name + "[" + std::to_string(i) + "]", access, stream));
  }
  return args;
}

std::vector<zf_tensor> descriptors(const std::vector<TensorArg>& args) {
  std::vector<zf_tensor> out;
  out.reserve(args.size());
  for (const auto& arg : args) out.push_back(arg.tensor);
  return out;
}

void throw_status(zf_status status) {
  const std::string message = zf_last_error();
  switch (status) {
    case ZF_ERROR_INVALID_VALUE:
      throw py::value_error(message);
    case ZF_ERROR_INVALID_TYPE:
    case ZF_ERROR_NOT_SUPPORTED:
      throw py::type_error(message);
    case ZF_ERROR_OUT_OF_MEMORY:
      throw std::bad_alloc();
    default:
      throw std::runtime_error(std::string(zf_status_string(status)) + ": " + message);
  }
}

}  // namespace zf_py

namespace zf_py {

Workspace to_workspace(const py::object& obj, bool query, intptr_t stream) {
  Workspace ws;
  ws.query = query;
  if (query || obj.is_none()) return ws;
  ws.arg = to_tensor(obj, "workspace", Access::kWrite, stream);
  ws.data = ws.arg.tensor.data;
  ws.bytes = zf_dtype_size(ws.arg.tensor.dtype);
  for (int d = 0; d < ws.arg.tensor.ndim; ++d) ws.bytes *= static_cast<size_t>(ws.arg.tensor.shape[d]);
  return ws;
}

}  // namespace zf_py
