#include "tensor_convert.hpp"

#include <cstring>
#include <new>
#include <stdexcept>

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

std::string type_name(py::handle obj) { return Py_TYPE(obj.ptr())->tp_name; }

// The pending Python exception's text (cleared), for wrapping it with the argument name.
std::string take_python_error() {
  py::error_already_set error;
  return error.what();
}

// ---- torch tensors, read directly --------------------------------------------------------

PyObject* intern(const char* text) { return PyUnicode_InternFromString(text); }

// torch's objects, looked up once torch has been imported (no torch tensor can exist before).
struct TorchObjects {
  bool ready = false;
  PyTypeObject* tensor_type = nullptr;
  PyObject* dtypes[5] = {};  // indexed by zf_dtype
  PyObject* increment_version = nullptr;
  PyObject *s_dtype, *s_is_cuda, *s_is_cpu, *s_is_neg, *s_data_ptr, *s_shape, *s_stride, *s_get_device;

  TorchObjects() {
    s_dtype = intern("dtype");
    s_is_cuda = intern("is_cuda");
    s_is_cpu = intern("is_cpu");
    s_is_neg = intern("is_neg");
    s_data_ptr = intern("data_ptr");
    s_shape = intern("shape");
    s_stride = intern("stride");
    s_get_device = intern("get_device");
  }

  // Called with the GIL held; cheap when torch is not (yet) imported: one dict lookup.
  bool load() {
    if (ready) return true;
    PyObject* torch = PyDict_GetItemString(PyImport_GetModuleDict(), "torch");  // borrowed
    if (torch == nullptr) return false;
    try {
      const py::handle module(torch);
      py::object tensor = module.attr("Tensor");
      const char* names[5] = {"float32", "float16", "bfloat16", "int32", "int64"};
      static_assert(
          ZF_DTYPE_F32 == 0 && ZF_DTYPE_F16 == 1 && ZF_DTYPE_BF16 == 2 && ZF_DTYPE_I32 == 3 && ZF_DTYPE_I64 == 4,
          "dtype table order");
      for (int i = 0; i < 5; ++i) dtypes[i] = py::object(module.attr(names[i])).release().ptr();
      increment_version = py::object(module.attr("_C").attr("_increment_version")).release().ptr();
      tensor_type = reinterpret_cast<PyTypeObject*>(tensor.release().ptr());
    } catch (py::error_already_set&) {
      return false;  // torch is still being imported: its tensors cannot reach us yet
    }
    ready = true;
    return true;
  }

  bool is_tensor(PyObject* obj) const { return ready && PyObject_TypeCheck(obj, tensor_type); }
};

TorchObjects& torch_objects() {
  static TorchObjects* objects = new TorchObjects();  // never destroyed: used until exit
  return *objects;
}

// New reference, or throws a TypeError naming the argument with torch's message.
PyObject* checked(PyObject* result, const ArgName& name, const char* what) {
  if (result == nullptr) {
    const std::string reason = take_python_error();
    type_error(name.str() + ": cannot read its " + what + " (" + reason +
               "); zenflow takes dense (strided) CPU or CUDA tensors");
  }
  return result;
}

int64_t as_int64(PyObject* value, const ArgName& name, const char* what) {
  const long long v = PyLong_AsLongLong(value);
  if (v == -1 && PyErr_Occurred()) {
    const std::string reason = take_python_error();
    type_error(name.str() + ": bad " + what + " (" + reason + ")");
  }
  return static_cast<int64_t>(v);
}

zf_tensor from_torch(PyObject* obj, const ArgName& name) {
  TorchObjects& t = torch_objects();
  zf_tensor out{};
  {
    py::object dtype = py::reinterpret_steal<py::object>(checked(PyObject_GetAttr(obj, t.s_dtype), name, "dtype"));
    int code = -1;
    for (int i = 0; i < 5; ++i) {
      if (dtype.ptr() == t.dtypes[i]) code = i;
    }
    if (code < 0) {
      type_error(name.str() + ": unsupported dtype " + std::string(py::str(dtype)) +
                 "; zenflow takes float32, float16, bfloat16, int32 and int64");
    }
    out.dtype = static_cast<zf_dtype>(code);
  }
  // The device: calls take lists of tensors on one device, so the device of the previous
  // tensor is asked about first (one attribute read per tensor instead of two on the CPU).
  static thread_local bool last_on_cpu = false;
  if (last_on_cpu) {
    py::object is_cpu = py::reinterpret_steal<py::object>(checked(PyObject_GetAttr(obj, t.s_is_cpu), name, "device"));
    if (is_cpu.ptr() == Py_True) {
      out.device = zf_device{ZF_DEVICE_CPU, 0};
    } else {
      last_on_cpu = false;
    }
  }
  if (!last_on_cpu) {
    py::object is_cuda = py::reinterpret_steal<py::object>(checked(PyObject_GetAttr(obj, t.s_is_cuda), name, "device"));
    if (is_cuda.ptr() == Py_True) {
      py::object index =
          py::reinterpret_steal<py::object>(checked(PyObject_CallMethodNoArgs(obj, t.s_get_device), name, "device"));
      out.device = zf_device{ZF_DEVICE_CUDA, static_cast<int32_t>(as_int64(index.ptr(), name, "device index"))};
    } else {
      py::object is_cpu = py::reinterpret_steal<py::object>(checked(PyObject_GetAttr(obj, t.s_is_cpu), name, "device"));
      if (is_cpu.ptr() != Py_True) {
        const std::string device = py::str(py::handle(obj).attr("device"));
        type_error(name.str() + ": a tensor on device '" + device + "'; zenflow takes CPU and CUDA tensors");
      }
      out.device = zf_device{ZF_DEVICE_CPU, 0};
      last_on_cpu = true;
    }
  }
  py::object shape = py::reinterpret_steal<py::object>(checked(PyObject_GetAttr(obj, t.s_shape), name, "shape"));
  py::object strides =
      py::reinterpret_steal<py::object>(checked(PyObject_CallMethodNoArgs(obj, t.s_stride), name, "strides"));
  if (!PyTuple_Check(shape.ptr()) || !PyTuple_Check(strides.ptr())) type_error(name.str() + ": unexpected shape type");
  const Py_ssize_t ndim = PyTuple_GET_SIZE(shape.ptr());
  if (ndim > ZF_MAX_DIMS) value_error(name.str() + ": more than " + std::to_string(ZF_MAX_DIMS) + " dimensions");
  if (PyTuple_GET_SIZE(strides.ptr()) != ndim) type_error(name.str() + ": strides do not match the shape");
  out.ndim = static_cast<int32_t>(ndim);
  bool empty = false;
  for (Py_ssize_t d = 0; d < ndim; ++d) {
    out.shape[d] = as_int64(PyTuple_GET_ITEM(shape.ptr(), d), name, "shape");
    out.strides[d] = as_int64(PyTuple_GET_ITEM(strides.ptr(), d), name, "strides");
    empty = empty || out.shape[d] == 0;
  }
  // An empty tensor has no elements to read or write: neither its sign bit nor its memory
  // matters, and calls that pass many (a selection change where no column moves) skip two
  // reads of each. Its data stays NULL, which the C layer accepts for empty tensors.
  if (empty) return out;
  if (out.dtype != ZF_DTYPE_I32 && out.dtype != ZF_DTYPE_I64) {  // the lazy sign bit exists on float views only
    py::object neg =
        py::reinterpret_steal<py::object>(checked(PyObject_CallMethodNoArgs(obj, t.s_is_neg), name, "sign bit"));
    if (neg.ptr() == Py_True) {
      value_error(name.str() +
                  ": has torch's lazy negative bit set (a view such as x.conj().imag); call .resolve_neg() first");
    }
  }
  py::object data =
      py::reinterpret_steal<py::object>(checked(PyObject_CallMethodNoArgs(obj, t.s_data_ptr), name, "memory"));
  out.data = PyLong_AsVoidPtr(data.ptr());
  if (out.data == nullptr && PyErr_Occurred()) {
    const std::string reason = take_python_error();
    type_error(name.str() + ": bad data pointer (" + reason + ")");
  }
  return out;
}

// ---- DLPack ------------------------------------------------------------------------------

zf_dtype dtype_from_dlpack(const DLDataType& t, const ArgName& name) {
  if (t.lanes == 1) {
    if (t.code == kDLFloat && t.bits == 32) return ZF_DTYPE_F32;
    if (t.code == kDLFloat && t.bits == 16) return ZF_DTYPE_F16;
    if (t.code == kDLBfloat && t.bits == 16) return ZF_DTYPE_BF16;
    if (t.code == kDLInt && t.bits == 32) return ZF_DTYPE_I32;
    if (t.code == kDLInt && t.bits == 64) return ZF_DTYPE_I64;
  }
  type_error(name.str() + ": unsupported dtype (DLPack code " + std::to_string(t.code) + ", " + std::to_string(t.bits) +
             " bits); zenflow takes float32, float16, bfloat16, int32 and int64");
}

zf_tensor from_dltensor(const DLTensor& dl, const ArgName& name) {
  zf_tensor t{};
  if (dl.ndim > ZF_MAX_DIMS) value_error(name.str() + ": more than " + std::to_string(ZF_MAX_DIMS) + " dimensions");
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
      type_error(name.str() + ": unsupported device (DLPack device type " + std::to_string(dl.device.device_type) +
                 ")");
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
// Producers refuse some arrays with BufferError (big-endian numpy, ...): that becomes a
// TypeError naming the argument.
zf_tensor from_dlpack(const py::handle& obj, const ArgName& name, Access access, const ConsumerStreams& streams,
                      py::object& keep_alive) {
  try {
    bool on_cuda = false;
    int device_id = -1;
    if (py::hasattr(obj, "__dlpack_device__")) {
      const py::tuple device = obj.attr("__dlpack_device__")();
      const int device_type = device[0].cast<int>();
      on_cuda = device_type == kDLCUDA || device_type == kDLCUDAManaged;
      device_id = device[1].cast<int>();
    }
    py::object capsule;
    py::dict kwargs;
    const intptr_t stream = streams.of(device_id);
    if (on_cuda) kwargs["stream"] = stream == 0 ? py::int_(1) : py::int_(stream);  // 1: legacy default stream
    try {
      py::dict versioned = kwargs;
      versioned["max_version"] = py::make_tuple(1, 0);
      capsule = obj.attr("__dlpack__")(**versioned);
    } catch (py::error_already_set& e) {
      if (!e.matches(PyExc_TypeError)) throw;
      capsule = obj.attr("__dlpack__")(**kwargs);  // producer predates DLPack 1.0
    }
    keep_alive = capsule;
    PyObject* raw = capsule.ptr();
    if (PyCapsule_IsValid(raw, "dltensor_versioned")) {
      auto* managed = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(raw, "dltensor_versioned"));
      if (access == Access::kWrite && (managed->flags & kDLFlagReadOnly)) {
        value_error(name.str() + ": is read-only, but zenflow writes its result there");
      }
      return from_dltensor(managed->dl_tensor, name);
    }
    if (PyCapsule_IsValid(raw, "dltensor")) {
      auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(raw, "dltensor"));
      return from_dltensor(managed->dl_tensor, name);
    }
    type_error(name.str() + ": __dlpack__ did not return a DLPack capsule");
  } catch (py::error_already_set& e) {
    if (!e.matches(PyExc_BufferError)) throw;
    type_error(name.str() + ": cannot be exported (" + std::string(e.what()) +
               "); zenflow takes native-endian, dense float32/float16/bfloat16/int32/int64 arrays");
  }
}

// ---- NumPy array interface -----------------------------------------------------------------

zf_dtype dtype_from_typestr(const std::string& typestr, const ArgName& name) {
  if (typestr == "<f4") return ZF_DTYPE_F32;
  if (typestr == "<f2") return ZF_DTYPE_F16;
  if (typestr == "<i4") return ZF_DTYPE_I32;
  if (typestr == "<i8") return ZF_DTYPE_I64;
  type_error(name.str() + ": unsupported array-interface dtype '" + typestr +
             "'; zenflow takes native little-endian float32, float16, int32 and int64 (bfloat16 through DLPack)");
}

zf_tensor from_array_interface(const py::handle& obj, const ArgName& name, Access access) {
  const py::dict info = obj.attr("__array_interface__");
  zf_tensor t{};
  t.dtype = dtype_from_typestr(info["typestr"].cast<std::string>(), name);
  t.device = zf_device{ZF_DEVICE_CPU, 0};
  const py::tuple data = info["data"];
  if (access == Access::kWrite && data[1].cast<bool>())
    value_error(name.str() + ": is read-only, but zenflow writes there");
  t.data = reinterpret_cast<void*>(data[0].cast<uintptr_t>());
  const py::tuple shape = info["shape"];
  if (shape.size() > ZF_MAX_DIMS) value_error(name.str() + ": too many dimensions");
  t.ndim = static_cast<int32_t>(shape.size());
  const int64_t item = static_cast<int64_t>(zf_dtype_size(t.dtype));
  const bool has_strides = info.contains("strides") && !info["strides"].is_none();
  int64_t stride = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    t.shape[d] = shape[static_cast<size_t>(d)].cast<int64_t>();
    if (has_strides) {
      const int64_t bytes = info["strides"].cast<py::tuple>()[static_cast<size_t>(d)].cast<int64_t>();
      if (bytes % item != 0) value_error(name.str() + ": stride is not a multiple of the element size");
      t.strides[d] = bytes / item;
    } else {
      t.strides[d] = stride;
    }
    stride *= t.shape[d];
  }
  return t;
}

// Any array kind; `written` is set when obj is a torch tensor (its version must be bumped
// after a write), `keep_alive` when something must outlive the call.
zf_tensor convert(py::handle obj, const ArgName& name, Access access, const ConsumerStreams& streams, bool& is_torch,
                  py::object& keep_alive) {
  TorchObjects& torch = torch_objects();
  torch.load();
  is_torch = torch.is_tensor(obj.ptr());
  if (is_torch) return from_torch(obj.ptr(), name);
  if (obj.is_none()) type_error(name.str() + ": expected an array, got None");
  if (py::hasattr(obj, "__dlpack__")) return from_dlpack(obj, name, access, streams, keep_alive);
  if (py::hasattr(obj, "__array_interface__")) {
    keep_alive = py::reinterpret_borrow<py::object>(obj);
    return from_array_interface(obj, name, access);
  }
  type_error(name.str() + ": expected an array (torch, numpy or cupy, via DLPack or the array interface), got " +
             type_name(obj));
}

}  // namespace

std::string ArgName::str() const {
  if (owned != nullptr) return *owned;
  std::string out = list;
  if (index >= 0) out += "[" + std::to_string(index) + "]";
  if (field != nullptr) {
    out += ".";
    out += field;
  }
  return out;
}

// ---- Converter ----------------------------------------------------------------------------

zf_tensor Converter::tensor(py::handle obj, const ArgName& name, Access access) {
  bool is_torch = false;
  py::object keep;
  const zf_tensor t = convert(obj, name, access, streams_, is_torch, keep);
  if (keep) keep_.push_back(std::move(keep));
  if (is_torch && access == Access::kWrite) written_.push_back(obj.ptr());
  return t;
}

py::object as_fast_sequence(py::handle seq, const char* name) {
  if (!PyList_Check(seq.ptr()) && !PyTuple_Check(seq.ptr())) {
    type_error(std::string(name) + ": expected a list of arrays, got " + type_name(seq));
  }
  return py::reinterpret_borrow<py::object>(seq);
}

std::vector<zf_tensor> Converter::list(py::handle seq, const char* name, Access access) {
  const py::object items = as_fast_sequence(seq, name);
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(items.ptr());
  PyObject** raw = PySequence_Fast_ITEMS(items.ptr());
  std::vector<zf_tensor> out(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = tensor(raw[i], ArgName{name, i}, access);
  return out;
}

std::vector<zf_tensor> Converter::optional_list(py::handle seq, const char* name, Access access) {
  if (seq.is_none()) return {};
  return list(seq, name, access);
}

zf_column_state Converter::state(py::handle entry, const char* name, ptrdiff_t index, Access access) {
  if ((!PyTuple_Check(entry.ptr()) && !PyList_Check(entry.ptr())) || PySequence_Fast_GET_SIZE(entry.ptr()) != 4) {
    type_error(ArgName{name, index}.str() +
               ": expected a ColumnState (master or None, exp_avg, exp_avg_sq, steps), got " + type_name(entry));
  }
  PyObject** parts = PySequence_Fast_ITEMS(entry.ptr());
  zf_column_state s{};
  s.exp_avg = tensor(parts[1], ArgName{name, index, "exp_avg"}, access);
  s.exp_avg_sq = tensor(parts[2], ArgName{name, index, "exp_avg_sq"}, access);
  s.steps = tensor(parts[3], ArgName{name, index, "steps"}, access);
  if (parts[0] == Py_None) {
    s.master = zf_tensor{};  // shape [0]: "no master"
    s.master.dtype = ZF_DTYPE_F32;
    s.master.device = s.exp_avg.device;
    s.master.ndim = 1;
    s.master.strides[0] = 1;
  } else {
    s.master = tensor(parts[0], ArgName{name, index, "master"}, access);
  }
  return s;
}

std::vector<zf_column_state> Converter::states(py::handle seq, const char* name, Access access) {
  const py::object items = as_fast_sequence(seq, name);
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(items.ptr());
  PyObject** raw = PySequence_Fast_ITEMS(items.ptr());
  std::vector<zf_column_state> out(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = state(raw[i], name, i, access);
  return out;
}

void Converter::bump_versions() {
  if (written_.empty()) return;
  TorchObjects& torch = torch_objects();
  py::list tensors(written_.size());
  for (size_t i = 0; i < written_.size(); ++i) {
    PyList_SET_ITEM(tensors.ptr(), static_cast<Py_ssize_t>(i), py::handle(written_[i]).inc_ref().ptr());
  }
  py::handle(torch.increment_version)(tensors);
  written_.clear();
}

void bump_versions(const std::vector<const TensorArg*>& args) {
  py::list tensors;
  for (const TensorArg* arg : args) {
    if (arg != nullptr && arg->is_torch_write) tensors.append(arg->keep_alive);
  }
  if (tensors.empty()) return;
  py::handle(torch_objects().increment_version)(tensors);
}

void require_length(size_t expected, size_t got, const char* name, const char* what) {
  if (got != expected) {
    value_error(std::string(name) + ": has " + std::to_string(got) + " entries for " + std::to_string(expected) + " " +
                what);
  }
}

// ---- the helpers with full-string names (kept for other binding files) ----------------------

TensorArg to_tensor(const py::handle& obj, const std::string& name, Access access, intptr_t stream) {
  ArgName arg_name;
  arg_name.owned = &name;
  TensorArg arg;
  bool is_torch = false;
  ConsumerStreams streams;
  streams.stream = stream;
  arg.tensor = convert(obj, arg_name, access, streams, is_torch, arg.keep_alive);
  if (is_torch) {
    arg.keep_alive = py::reinterpret_borrow<py::object>(obj);
    arg.is_torch_write = access == Access::kWrite;
  }
  return arg;
}

std::vector<TensorArg> to_tensor_list(const py::handle& seq, const std::string& name, Access access, intptr_t stream) {
  if (!py::isinstance<py::sequence>(seq) || py::isinstance<py::str>(seq)) {
    type_error(name + ": expected a list of arrays, got " + type_name(seq));
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

void throw_status(zf_status status) { throw_error(status, zf_last_error()); }

void throw_error(zf_status status, const std::string& message) {
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
