// zenflow._C.Engine: the engine (engine.h) for Python. Parameters are given once, at
// construction, and updated in place; each step passes only the gradients. The state
// machine lives in C++: this file only converts arguments and results.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "tensor_convert.hpp"
#include "zenflow/engine.h"

namespace zf_py {

namespace {

double number(py::handle value, const std::string& name) {
  if (PyBool_Check(value.ptr()) || !PyNumber_Check(value.ptr())) {
    throw py::type_error(name + ": expected a number, got " +
                         std::string(py::str(py::type::of(value).attr("__name__"))));
  }
  return py::float_(py::reinterpret_borrow<py::object>(value)).cast<double>();
}

int64_t integer(py::handle value, const std::string& name) {
  if (PyBool_Check(value.ptr())) throw py::type_error(name + ": expected an integer, got bool");
  PyObject* index = PyNumber_Index(value.ptr());
  if (index == nullptr) {
    PyErr_Clear();
    throw py::type_error(name + ": expected an integer, got " +
                         std::string(py::str(py::type::of(value).attr("__name__"))));
  }
  const py::object owned = py::reinterpret_steal<py::object>(index);
  int overflow = 0;
  const long long result = PyLong_AsLongLongAndOverflow(owned.ptr(), &overflow);
  if (overflow != 0) throw py::value_error(name + ": out of range");
  return static_cast<int64_t>(result);
}

bool flag(py::handle value, const std::string& name) {
  if (!PyBool_Check(value.ptr()) && !PyNumber_Check(value.ptr())) throw py::type_error(name + ": expected a bool");
  return py::bool_(py::reinterpret_borrow<py::object>(value)).cast<bool>();
}

std::string type_name(py::handle value) { return py::str(py::type::of(value).attr("__name__")); }

// The configuration table (engine.h: zf_engine_config_key), read once.
const std::vector<zf_engine_config_key>& config_keys() {
  static const std::vector<zf_engine_config_key> keys = [] {
    std::vector<zf_engine_config_key> out(zf_engine_config_key_count());
    for (size_t i = 0; i < out.size(); ++i) check(zf_engine_config_key_at(i, &out[i]));
    return out;
  }();
  return keys;
}

std::vector<std::string> choice_names(const zf_engine_config_key& k) {
  std::vector<std::string> out;
  std::string rest = k.choices;
  for (size_t comma; (comma = rest.find(',')) != std::string::npos; rest = rest.substr(comma + 1))
    out.push_back(rest.substr(0, comma));
  out.push_back(rest);
  return out;
}

// Field access through the table's offsets (the table says each field's type and size).
char* field(zf_engine_config& c, const zf_engine_config_key& k) { return reinterpret_cast<char*>(&c) + k.offset; }

void write_field(zf_engine_config& c, const zf_engine_config_key& k, double real, int64_t whole) {
  if (k.type == ZF_CONFIG_FLOAT) {
    std::memcpy(field(c, k), &real, sizeof real);
  } else if (k.size == sizeof(int32_t)) {
    const auto v = static_cast<int32_t>(whole);
    std::memcpy(field(c, k), &v, sizeof v);
  } else {
    std::memcpy(field(c, k), &whole, sizeof whole);
  }
}

// A field whose 0 stands for a word ("auto", "window"; "none" is None in Python), as opposed
// to a number ("1": ranks_per_host's 0 counts as 1).
bool zero_is_word(const std::string& zero) {
  return !zero.empty() && std::isalpha(static_cast<unsigned char>(zero[0]));
}

// A Python value into field k; the range is the engine's to check (zf_engine_config_check).
// A field whose 0 stands for a word takes the word ("auto", "window"; None for "none"), so a
// plain 0 is refused here: in Python the word says it.
void parse_key(zf_engine_config& c, const zf_engine_config_key& k, py::handle value, const std::string& name) {
  const std::string zero = k.zero_means;
  const bool takes_word = zero_is_word(zero);
  if (takes_word &&
      ((zero == "none" && value.is_none()) || (py::isinstance<py::str>(value) && value.cast<std::string>() == zero))) {
    return write_field(c, k, 0.0, 0);
  }
  const std::string word = zero == "none" ? "None" : "\"" + zero + "\"";
  switch (k.type) {
    case ZF_CONFIG_FLOAT: {
      if (PyBool_Check(value.ptr()) || !PyNumber_Check(value.ptr()) || py::isinstance<py::str>(value)) {
        throw py::type_error(name + ": expected a number" + (takes_word ? " or " + word : "") + ", got " +
                             type_name(value));
      }
      const double v = number(value, name);
      if (takes_word && v == 0.0)
        throw py::value_error(name + ": must be " + k.range_text + ", got 0 (" + zero + " is written " + word + ")");
      return write_field(c, k, v, 0);
    }
    case ZF_CONFIG_INT: {
      if (py::isinstance<py::str>(value)) {
        throw py::value_error(name + ": expected an integer" + (takes_word ? " or " + word : "") + ", got " +
                              std::string(py::repr(value)));
      }
      const int64_t v = integer(value, name);
      if (takes_word && v == 0)
        throw py::value_error(name + ": must be " + k.range_text + ", got 0 (" + zero + " is written " + word + ")");
      if (k.size == sizeof(int32_t) && (v < INT32_MIN || v > INT32_MAX))  // would not fit the field
        throw py::value_error(name + ": must be " + k.range_text + ", got " + std::to_string(v));
      return write_field(c, k, 0.0, v);
    }
    case ZF_CONFIG_BOOL:
      if (!PyBool_Check(value.ptr())) throw py::type_error(name + ": expected a bool, got " + type_name(value));
      return write_field(c, k, 0.0, value.ptr() == Py_True ? 1 : 0);
    case ZF_CONFIG_CHOICE: {
      const std::vector<std::string> names = choice_names(k);
      if (value.is_none() && names[0] == "none") return write_field(c, k, 0.0, 0);  // loss_scaling None
      if (!py::isinstance<py::str>(value)) throw py::type_error(name + ": expected a string, got " + type_name(value));
      {
        const std::string text = value.cast<std::string>();
        for (size_t i = 0; i < names.size(); ++i)
          if (text == names[i]) return write_field(c, k, 0.0, static_cast<int64_t>(i));
      }
      std::string valid;
      for (const std::string& n : names) valid += (valid.empty() ? "\"" : ", \"") + n + "\"";
      throw py::value_error(name + ": expected one of " + valid + ", got " + std::string(py::repr(value)));
    }
  }
}

// Field k of c as Python: the zero word (None for "none"), a bool, a choice's name, a number.
py::object key_value(const zf_engine_config& c, const zf_engine_config_key& k) {
  const char* p = reinterpret_cast<const char*>(&c) + k.offset;
  double real = 0.0;
  int64_t whole = 0;
  if (k.type == ZF_CONFIG_FLOAT) {
    std::memcpy(&real, p, sizeof real);
  } else if (k.size == sizeof(int32_t)) {
    int32_t v;
    std::memcpy(&v, p, sizeof v);
    whole = v;
  } else {
    std::memcpy(&whole, p, sizeof whole);
  }
  const std::string zero = k.zero_means;
  if (zero_is_word(zero) && real == 0.0 && whole == 0) return zero == "none" ? py::none() : py::object(py::str(zero));
  switch (k.type) {
    case ZF_CONFIG_FLOAT:
      return py::float_(real);
    case ZF_CONFIG_BOOL:
      return py::bool_(whole != 0);
    case ZF_CONFIG_CHOICE:
      return py::str(choice_names(k).at(static_cast<size_t>(whole)));
    default:
      return py::int_(whole);
  }
}

// A config dict (engine field names; "betas" sets beta1 and beta2) over the defaults. Unknown
// keys and wrong types raise here, naming the key; then the engine checks every range.
zf_engine_config parse_config(const py::dict& config, bool deepspeed_rules = false) {
  zf_engine_config c = zf_engine_config_default();
  for (const auto& item : config) {
    if (!py::isinstance<py::str>(item.first)) throw py::type_error("config: keys must be strings");
    const std::string key = item.first.cast<std::string>();
    const std::string name = "config[\"" + key + "\"]";
    if (key == "betas") {
      if (!py::isinstance<py::sequence>(item.second) || py::isinstance<py::str>(item.second) ||
          py::len(item.second) != 2) {
        throw py::value_error(name + ": expected a pair (beta1, beta2)");
      }
      const py::sequence betas = py::reinterpret_borrow<py::sequence>(item.second);
      c.beta1 = number(betas[0], name + "[0]");
      c.beta2 = number(betas[1], name + "[1]");
      continue;
    }
    const zf_engine_config_key* found = nullptr;
    for (const zf_engine_config_key& k : config_keys())
      if (key == k.name) found = &k;
    if (found == nullptr) throw py::value_error("config: unknown key \"" + key + "\"");
    parse_key(c, *found, item.second, name);
  }
  check(deepspeed_rules ? zf_engine_config_check_deepspeed(&c) : zf_engine_config_check(&c));
  return c;
}

py::dict config_dict(const zf_engine_config& c) {
  py::dict out;
  for (const zf_engine_config_key& k : config_keys()) out[k.name] = key_value(c, k);
  return out;
}

py::list describe_keys() {
  static const char* kTypes[] = {"float", "int", "bool", "choice"};
  const zf_engine_config defaults = zf_engine_config_default();
  py::list out;
  for (const zf_engine_config_key& k : config_keys()) {
    py::dict d;
    d["name"] = k.name;
    d["type"] = kTypes[k.type];
    d["default"] = key_value(defaults, k);
    d["minimum"] = k.minimum;
    d["maximum"] = k.maximum;
    d["minimum_open"] = k.minimum_open != 0;
    d["maximum_open"] = k.maximum_open != 0;
    d["zero_means"] = k.zero_means;
    d["choices"] = k.type == ZF_CONFIG_CHOICE ? py::cast(choice_names(k)) : py::list();
    d["default_text"] = k.default_text;
    d["range_text"] = k.range_text;
    d["meaning"] = k.meaning;
    d["deepspeed_key"] = k.deepspeed_key;
    d["deepspeed_default"] = k.deepspeed_default;
    d["deepspeed_difference"] = k.deepspeed_difference;
    out.append(d);
  }
  return out;
}

// Data parallel: the Python callables behind the engine's collectives (engine.h:
// zf_engine_collectives). The engine calls them from inside calls that released the GIL, on
// the calling thread; each trampoline takes the GIL back, passes plain integers and a dtype
// name, and turns any Python exception into an error status whose text last_error returns
// (the engine's error message then carries it).
class PyCollectives {
 public:
  PyCollectives(py::object all_reduce_sum, py::object reduce_scatter_sum, py::object all_gather)
      : all_reduce_sum_(std::move(all_reduce_sum)),
        reduce_scatter_sum_(std::move(reduce_scatter_sum)),
        all_gather_(std::move(all_gather)) {}

  zf_engine_collectives table(int32_t rank, int32_t world_size) {
    zf_engine_collectives c{};
    c.user = this;
    c.rank = rank;
    c.world_size = world_size;
    c.all_reduce_sum = &PyCollectives::all_reduce_trampoline;
    c.reduce_scatter_sum = &PyCollectives::reduce_scatter_trampoline;
    c.all_gather = &PyCollectives::all_gather_trampoline;
    c.last_error = &PyCollectives::last_error_trampoline;
    return c;
  }

 private:
  static const char* dtype_name(zf_dtype dtype) {
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

  static bool interpreter_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsFinalizing() != 0;
#else
    return _Py_IsFinalizing() != 0;
#endif
  }

  static uintptr_t address(const void* data) { return reinterpret_cast<uintptr_t>(data); }
  static uintptr_t stream_handle(zf_stream stream) { return reinterpret_cast<uintptr_t>(stream); }

  // Runs `fn` (which calls one Python callable) with the GIL held; never lets an exception out.
  template <typename Fn>
  zf_status invoke(const char* which, Fn&& fn) noexcept {
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

  static zf_status all_reduce_trampoline(void* user, void* data, size_t count, zf_dtype dtype, zf_stream stream) {
    auto* self = static_cast<PyCollectives*>(user);
    return self->invoke("all_reduce_sum",
                        [&] { self->all_reduce_sum_(address(data), count, dtype_name(dtype), stream_handle(stream)); });
  }

  static zf_status reduce_scatter_trampoline(void* user, const void* in, void* out, size_t count, zf_dtype dtype,
                                             zf_stream stream) {
    auto* self = static_cast<PyCollectives*>(user);
    return self->invoke("reduce_scatter_sum", [&] {
      self->reduce_scatter_sum_(address(in), address(out), count, dtype_name(dtype), stream_handle(stream));
    });
  }

  static zf_status all_gather_trampoline(void* user, const void* in, void* out, size_t count, zf_dtype dtype,
                                         zf_stream stream) {
    auto* self = static_cast<PyCollectives*>(user);
    return self->invoke("all_gather", [&] {
      self->all_gather_(address(in), address(out), count, dtype_name(dtype), stream_handle(stream));
    });
  }

  static const char* last_error_trampoline(void* user) { return static_cast<PyCollectives*>(user)->error_.c_str(); }

  py::object all_reduce_sum_, reduce_scatter_sum_, all_gather_;
  std::string error_;
};

// The schedule counters by name, in the order of engine.h's ZF_COUNTER_* positions.
constexpr const char* kScheduleKeys[] = {
    "step", "window", "window_steps", "since_selection", "selections", "has_previous_window"};

class PyEngine {
 public:
  PyEngine(const py::object& params, const py::object& groups, const py::object& config) {
    const py::object param_list = as_fast_sequence(params, "params");
    const py::object group_list = as_fast_sequence(groups, "groups");
    const size_t param_count = static_cast<size_t>(PySequence_Fast_GET_SIZE(param_list.ptr()));
    Converter conv;
    const std::vector<zf_tensor> tensors = conv.list(param_list, "params", Access::kWrite);

    std::vector<int32_t> param_groups(param_count, -1);
    std::vector<zf_engine_group> c_groups;
    const size_t group_count = static_cast<size_t>(PySequence_Fast_GET_SIZE(group_list.ptr()));
    for (size_t g = 0; g < group_count; ++g) {
      const std::string name = "groups[" + std::to_string(g) + "]";
      const py::handle entry = PySequence_Fast_GET_ITEM(group_list.ptr(), static_cast<Py_ssize_t>(g));
      if (!py::isinstance<py::dict>(entry)) throw py::type_error(name + ": expected a dict");
      const py::dict group = py::reinterpret_borrow<py::dict>(entry);
      for (const auto& item : group) {
        const std::string key = py::str(item.first);
        if (key != "params" && key != "lr" && key != "weight_decay" && key != "dense") {
          throw py::value_error(name + ": unknown key \"" + key + "\"");
        }
      }
      if (!group.contains("params") || !group.contains("lr")) {
        throw py::value_error(name + ": needs \"params\" (indices into params) and \"lr\"");
      }
      zf_engine_group c_group{};
      c_group.lr = number(group["lr"], name + "[\"lr\"]");
      c_group.weight_decay =
          group.contains("weight_decay") ? number(group["weight_decay"], name + "[\"weight_decay\"]") : 0.0;
      c_group.dense = group.contains("dense") && flag(group["dense"], name + "[\"dense\"]") ? 1 : 0;
      const py::object indices = as_fast_sequence(group["params"], (name + "[\"params\"]").c_str());
      for (Py_ssize_t j = 0; j < PySequence_Fast_GET_SIZE(indices.ptr()); ++j) {
        const std::string index_name = name + "[\"params\"][" + std::to_string(j) + "]";
        const int64_t index = integer(PySequence_Fast_GET_ITEM(indices.ptr(), j), index_name);
        if (index < 0 || static_cast<size_t>(index) >= param_count) {
          throw py::value_error(index_name + ": " + std::to_string(index) + " is not a parameter index (there are " +
                                std::to_string(param_count) + ")");
        }
        if (param_groups[static_cast<size_t>(index)] != -1) {
          throw py::value_error(index_name + ": parameter " + std::to_string(index) + " is in two groups");
        }
        param_groups[static_cast<size_t>(index)] = static_cast<int32_t>(g);
      }
      c_groups.push_back(c_group);
    }
    for (size_t i = 0; i < param_count; ++i) {
      if (param_groups[i] == -1) throw py::value_error("groups: parameter " + std::to_string(i) + " is in no group");
    }
    if (!config.is_none() && !py::isinstance<py::dict>(config)) throw py::type_error("config: expected a dict");
    const zf_engine_config c_config = config.is_none() ? zf_engine_config_default() : parse_config(config);

    zf_engine* created = nullptr;
    check(release_gil([&] {
      return zf_engine_create(tensors.data(), param_groups.data(), param_count, c_groups.data(), c_groups.size(),
                              &c_config, &created);
    }));
    engine_ = created;
    params_ = py::list(param_list);
    group_count_ = group_count;
    torch_params_ =
        !tensors.empty() && std::string(py::str(py::type::of(params_[0]).attr("__module__"))).rfind("torch", 0) == 0;
  }

  ~PyEngine() { close(); }

  void close() {
    if (engine_ == nullptr) return;
    zf_engine* engine = engine_;
    engine_ = nullptr;
    {
      py::gil_scoped_release release;
      zf_engine_destroy(engine);
    }
    // Only now: the engine no longer uses the attached memory (destroy waits for its lanes)
    // nor calls the collectives.
    memory_ = py::list();
    collectives_.reset();
  }

  // The compute stream of every later call (engine.h: zf_engine_set_stream): a cudaStream_t
  // as an integer (torch.cuda.Stream.cuda_stream), 0 for the legacy default stream; the host
  // backend takes only 0.
  // Parameters on several CUDA devices: index picks the device (devices()); None, the only one.
  void set_stream(const py::object& handle, const py::object& index) {
    zf_engine* engine = live();
    const int64_t value = integer(handle, "stream");
    if (value < 0)
      throw py::value_error("stream: expected a cudaStream_t handle (an integer >= 0), got " + std::to_string(value));
    const size_t d = device_index(index);
    check(zf_engine_set_stream_at(engine, d, reinterpret_cast<zf_stream>(static_cast<uintptr_t>(value))));
    // The gradients of later calls come from DLPack producers on this stream too.
    zf_device device{};
    size_t bytes = 0;
    check(zf_engine_device_at(engine, d, &device, &bytes));
    if (device.type == ZF_DEVICE_CUDA) {
      const size_t ordinal = static_cast<size_t>(device.index);
      if (streams_.by_device.size() <= ordinal) streams_.by_device.resize(ordinal + 1, -1);
      streams_.by_device[ordinal] = static_cast<intptr_t>(value);
    }
  }

  size_t device_count() const {
    size_t count = 0;
    check(zf_engine_device_count(live(), &count));
    return count;
  }

  // The devices the parameters are on, as torch names them ("cpu", "cuda:1"), in the order of
  // the index argument of device_memory_size, attach_device_memory and set_stream.
  py::list devices() const {
    py::list out;
    const size_t count = device_count();
    for (size_t d = 0; d < count; ++d) {
      zf_device device{};
      size_t bytes = 0;
      check(zf_engine_device_at(live(), d, &device, &bytes));
      out.append(device_name(device));
    }
    return out;
  }

  static std::string device_name(const zf_device& device) {
    return device.type == ZF_DEVICE_CUDA ? "cuda:" + std::to_string(device.index) : std::string("cpu");
  }

  size_t device_index(const py::object& index) const {
    const size_t count = device_count();
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

  // Data parallel (engine.h: zf_engine_set_collectives): this engine is rank `rank` of
  // `world_size`. The callables run the collectives on the engine's buffers:
  //   all_reduce_sum(address, count, dtype, stream)          in place, summed over the ranks
  //   reduce_scatter_sum(in_address, out_address, count, dtype, stream)
  //   all_gather(in_address, out_address, count, dtype, stream)
  // addresses are integers inside the attached device memory, count is in elements, dtype a
  // name ("float32", "bfloat16", "float16", "int32", "int64"), stream the cudaStream_t (0 on
  // the host backend). An exception fails the engine's call with its text. Before the device
  // memory is attached (it changes device_memory_size: query that afterwards); the engine
  // keeps the callables until it is closed.
  void set_collectives(const py::object& rank, const py::object& world_size, const py::object& all_reduce_sum,
                       const py::object& reduce_scatter_sum, const py::object& all_gather) {
    zf_engine* engine = live();
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
    auto collectives = std::make_unique<PyCollectives>(all_reduce_sum, reduce_scatter_sum, all_gather);
    const zf_engine_collectives table =
        collectives->table(static_cast<int32_t>(rank_value), static_cast<int32_t>(size_value));
    check(zf_engine_set_collectives(engine, &table));
    // The previous table (if any) is no longer referenced by the engine.
    collectives_ = std::move(collectives);
  }

  // The engine's device memory from the caller (engine.h: query with device_memory_size,
  // then attach before the first step or load): a contiguous torch.uint8 tensor of at least
  // device_memory_size() elements on the parameters' device. The engine keeps a reference,
  // so the memory lives as long as the engine.
  void attach_device_memory(const py::object& memory, const py::object& index) {
    zf_engine* engine = live();
    const size_t d = device_index(index);
    const py::module_ torch = py::module_::import("torch");
    if (!py::isinstance(memory, torch.attr("Tensor"))) {
      throw py::type_error("memory: expected a torch.Tensor of dtype torch.uint8, got " +
                           std::string(py::str(py::type::of(memory).attr("__name__"))));
    }
    if (!memory.attr("dtype").equal(torch.attr("uint8"))) {
      throw py::value_error("memory: expected dtype torch.uint8, got " + std::string(py::str(memory.attr("dtype"))));
    }
    if (!memory.attr("is_contiguous")().cast<bool>()) throw py::value_error("memory: must be contiguous");
    zf_device want{};
    size_t needed = 0;
    check(zf_engine_device_at(engine, d, &want, &needed));
    const py::object device = memory.attr("device");
    const std::string type = py::str(device.attr("type"));
    const bool on_cuda = type == "cuda";
    const int64_t device_index = device.attr("index").is_none() ? 0 : device.attr("index").cast<int64_t>();
    const bool same_device = want.type == ZF_DEVICE_CUDA ? on_cuda && device_index == want.index : type == "cpu";
    if (!same_device) {
      throw py::value_error("memory: on " + std::string(py::str(device)) + ", the parameters are on " +
                            device_name(want));
    }
    const int64_t bytes = memory.attr("numel")().cast<int64_t>();
    if (bytes < 0 || static_cast<size_t>(bytes) < needed) {
      throw py::value_error("memory: holds " + std::to_string(bytes) + " bytes, the engine needs " +
                            std::to_string(needed) + " (device_memory_size())");
    }
    void* data = PyLong_AsVoidPtr(memory.attr("data_ptr")().ptr());
    if (data == nullptr && PyErr_Occurred()) throw py::error_already_set();
    call([&] { return zf_engine_attach_device_memory_at(engine, d, data, static_cast<size_t>(bytes)); });
    memory_.append(memory);
  }

  void step(const py::object& grads, const py::object& lrs) {
    zf_engine* engine = live();
    check_params_in_place();
    Converter conv(streams_);
    const std::vector<zf_tensor> tensors = conv.list(grads, "grads", Access::kRead);
    const std::vector<double> rates = learning_rates(lrs);
    call([&] {
      return zf_engine_step(engine, tensors.data(), tensors.size(), rates.empty() ? nullptr : rates.data(),
                            rates.size());
    });
    bump_params();
  }

  void begin_step(const py::object& lrs) {
    zf_engine* engine = live();
    check_params_in_place();
    const std::vector<double> rates = learning_rates(lrs);
    call([&] { return zf_engine_begin_step(engine, rates.empty() ? nullptr : rates.data(), rates.size()); });
    // The submitted gradients must stay alive until end_step (engine.h).
    submitted_ = py::list();
  }

  void submit(int64_t first, const py::object& grads) {
    zf_engine* engine = live();
    if (first < 0) throw py::value_error("first: must be >= 0, got " + std::to_string(first));
    Converter conv(streams_);
    const std::vector<zf_tensor> tensors = conv.list(grads, "grads", Access::kRead);
    call([&] { return zf_engine_submit(engine, static_cast<size_t>(first), tensors.data(), tensors.size()); });
    submitted_.append(grads);
  }

  void end_step() {
    zf_engine* engine = live();
    const zf_status status = release_gil([&] { return zf_engine_end_step(engine); });
    submitted_ = py::list();
    check(status);
    bump_params();
  }

  // Readiness (zf_engine_mark_ready): parameter `index`'s gradient is ready; the engine
  // submits runs of ready parameters itself. The gradient is kept alive until the step ends.
  void mark_ready(int64_t index, const py::object& grad) {
    zf_engine* engine = live();
    if (index < 0) throw py::value_error("index: must be >= 0, got " + std::to_string(index));
    Converter conv(streams_);
    const zf_tensor tensor = conv.tensor(grad, ArgName{"grad"}, Access::kRead);
    call([&] { return zf_engine_mark_ready(engine, static_cast<size_t>(index), &tensor); });
    submitted_.append(grad);
  }

  // zf_engine_end_step_with: every parameter's final gradient; ends the split step.
  void end_step_with(const py::object& grads) {
    zf_engine* engine = live();
    Converter conv(streams_);
    const std::vector<zf_tensor> tensors = conv.list(grads, "grads", Access::kRead);
    const zf_status status =
        release_gil([&] { return zf_engine_end_step_with(engine, tensors.data(), tensors.size()); });
    submitted_ = py::list();
    check(status);
    bump_params();
  }

  void abort_step() {
    zf_engine* engine = live();
    call([&] { return zf_engine_abort_step(engine); });
    submitted_ = py::list();
  }

  void flush() {
    zf_engine* engine = live();
    call([&] { return zf_engine_flush(engine); });
    bump_params();
  }

  // The betas, eps and per-group weight decays of later steps (zf_engine_set_hyperparameters):
  // no flush, no rebuild. weight_decays None keeps them.
  void set_hyperparameters(const py::object& betas, const py::object& eps, const py::object& weight_decays) {
    zf_engine* engine = live();
    const py::object pair = as_fast_sequence(betas, "betas");
    if (PySequence_Fast_GET_SIZE(pair.ptr()) != 2) throw py::value_error("betas: expected (beta1, beta2)");
    const double beta1 = number(PySequence_Fast_GET_ITEM(pair.ptr(), 0), "betas[0]");
    const double beta2 = number(PySequence_Fast_GET_ITEM(pair.ptr(), 1), "betas[1]");
    const double epsilon = number(eps, "eps");
    std::vector<double> decays;
    if (!weight_decays.is_none()) {
      const py::object list = as_fast_sequence(weight_decays, "weight_decays");
      const Py_ssize_t n = PySequence_Fast_GET_SIZE(list.ptr());
      for (Py_ssize_t g = 0; g < n; ++g)
        decays.push_back(number(PySequence_Fast_GET_ITEM(list.ptr(), g), "weight_decays[" + std::to_string(g) + "]"));
    }
    call([&] {
      return zf_engine_set_hyperparameters(engine, beta1, beta2, epsilon,
                                           weight_decays.is_none() ? nullptr : decays.data(), decays.size());
    });
  }

  // Data parallel (zf_engine_refuse): this rank refuses `call` ("step", "flush", "save",
  // "load") before making it, so that every rank's call fails; nothing happens alone.
  void refuse(const std::string& call_name) {
    static const std::pair<const char*, zf_engine_call> calls[] = {{"step", ZF_ENGINE_CALL_STEP},
                                                                   {"flush", ZF_ENGINE_CALL_FLUSH},
                                                                   {"save", ZF_ENGINE_CALL_SAVE},
                                                                   {"load", ZF_ENGINE_CALL_LOAD}};
    for (const auto& entry : calls) {
      if (call_name != entry.first) continue;
      zf_engine* engine = live();
      const zf_engine_call c = entry.second;
      zf_status status;
      {
        py::gil_scoped_release release;
        status = zf_engine_refuse(engine, c);
      }
      if (status != ZF_SUCCESS && status != ZF_ERROR_INVALID_VALUE) throw_status(status);
      return;
    }
    throw py::value_error("call: expected 'step', 'flush', 'save' or 'load', got '" + call_name + "'");
  }

  // Testing (engine.h): the host lane's next piece of work fails with `message`.
  void inject_host_lane_fault(const std::string& message) {
    check(zf_engine_inject_host_lane_fault_for_testing(live(), message.c_str()));
  }

  py::dict stats() const {
    zf_engine_stats s{};
    check(zf_engine_get_stats(live(), &s));
    py::dict out;
    out["steps"] = s.steps;
    out["windows"] = s.windows;
    out["reselections"] = s.reselections;
    out["skipped_steps"] = s.skipped_steps;
    out["last_global_norm"] = s.last_global_norm;
    out["stall_seconds_window_close"] = s.stall_seconds_window_close;
    out["stall_seconds_back_pressure"] = s.stall_seconds_back_pressure;
    out["stall_seconds_flush"] = s.stall_seconds_flush;
    out["host_update_seconds"] = s.host_update_seconds;
    out["accumulate_seconds"] = s.accumulate_seconds;
    out["bytes_down"] = s.bytes_down;
    out["bytes_up"] = s.bytes_up;
    out["selected_fraction"] = s.selected_fraction;
    out["device_state_bytes"] = s.device_state_bytes;
    out["host_state_bytes"] = s.host_state_bytes;
    out["stall_seconds_readback"] = s.stall_seconds_readback;
    out["device_bytes"] = s.device_bytes;
    out["pinned_host_bytes"] = s.pinned_host_bytes;
    out["collective_bytes_statistics"] = s.collective_bytes_statistics;
    out["collective_bytes_gradients"] = s.collective_bytes_gradients;
    out["collective_bytes_upload"] = s.collective_bytes_upload;
    out["host_lane_bytes_read"] = s.host_lane_bytes_read;
    out["host_lane_bytes_written"] = s.host_lane_bytes_written;
    return out;
  }

  double loss_scale() const {
    double scale = 0.0;
    check(zf_engine_loss_scale(live(), &scale));
    return scale;
  }

  size_t device_memory_size(const py::object& index) const {
    zf_device device{};
    size_t bytes = 0;
    check(zf_engine_device_at(live(), device_index(index), &device, &bytes));
    return bytes;
  }

  py::dict state_dict() {
    zf_engine* engine = live();
    const std::vector<zf_engine_state_entry> entries = layout();
    py::list buffers;
    for (const zf_engine_state_entry& entry : entries) buffers.append(empty(entry));
    Converter conv;
    const std::vector<zf_tensor> tensors = conv.list(buffers, "state", Access::kWrite);
    std::vector<int64_t> counters(ZF_ENGINE_STATE_COUNTERS, 0);
    double scale = 0.0;
    call([&] { return zf_engine_save_state(engine, tensors.data(), tensors.size(), counters.data(), &scale); });

    py::list per_param;
    for (size_t i = 0; i < entries.size(); ++i) {
      const size_t param = static_cast<size_t>(entries[i].param);
      while (py::len(per_param) <= param) per_param.append(py::dict());
      py::dict entry = per_param[param];
      entry[zf_engine_state_kind_name(entries[i].kind)] = buffers[i];
    }
    py::dict schedule;
    for (size_t c = 0; c < sizeof(kScheduleKeys) / sizeof(kScheduleKeys[0]); ++c)
      schedule[kScheduleKeys[c]] = counters[c];
    schedule["skipped"] = counters[ZF_COUNTER_SKIPPED];
    schedule["steps_accumulated"] = counters[ZF_COUNTER_STEPS_ACCUMULATED];
    schedule["update_pending"] = counters[ZF_COUNTER_UPDATE_PENDING];
    py::dict scaler;
    scaler["scale"] = scale;
    scaler["growth_tracker"] = counters[ZF_COUNTER_GROWTH_TRACKER];
    scaler["hysteresis"] = counters[ZF_COUNTER_HYSTERESIS];
    py::dict out;
    out["params"] = per_param;
    out["schedule"] = schedule;
    out["loss_scaler"] = scaler;
    return out;
  }

  void load_state_dict(const py::object& state) {
    zf_engine* engine = live();
    if (!py::isinstance<py::dict>(state)) throw py::type_error("state: expected a dict from state_dict()");
    const py::dict d = py::reinterpret_borrow<py::dict>(state);
    for (const char* key : {"params", "schedule", "loss_scaler"}) {
      if (!d.contains(key)) throw py::value_error(std::string("state: missing \"") + key + "\"");
    }
    const std::vector<zf_engine_state_entry> entries = layout();
    const py::object per_param = as_fast_sequence(d["params"], "state[\"params\"]");
    const size_t saved_params = static_cast<size_t>(PySequence_Fast_GET_SIZE(per_param.ptr()));
    const size_t params = static_cast<size_t>(py::len(params_));
    if (saved_params != params) {
      throw py::value_error("state: holds " + std::to_string(saved_params) + " parameters, this engine has " +
                            std::to_string(params) + " (the state of another model)");
    }
    py::list buffers;
    for (const zf_engine_state_entry& entry : entries) {
      const std::string name = "state[\"params\"][" + std::to_string(entry.param) + "]";
      const py::handle saved = PySequence_Fast_GET_ITEM(per_param.ptr(), entry.param);
      if (!py::isinstance<py::dict>(saved)) throw py::type_error(name + ": expected a dict");
      const py::dict saved_dict = py::reinterpret_borrow<py::dict>(saved);
      const char* key = zf_engine_state_kind_name(entry.kind);
      if (!saved_dict.contains(key)) {
        if (entry.kind == ZF_STATE_ACCUMULATOR) {  // a state saved before it was one: a flushed one
          buffers.append(empty(entry).attr("zero_")());
          continue;
        }
        throw py::value_error(name + ": missing \"" + key + "\" (the state of another model or configuration)");
      }
      buffers.append(saved_dict[key]);
    }
    Converter conv;
    const std::vector<zf_tensor> tensors = conv.list(buffers, "state", Access::kRead);
    std::vector<int64_t> counters(ZF_ENGINE_STATE_COUNTERS, 0);
    const py::dict schedule = d["schedule"].cast<py::dict>();
    for (size_t c = 0; c < sizeof(kScheduleKeys) / sizeof(kScheduleKeys[0]); ++c) {
      if (!schedule.contains(kScheduleKeys[c])) {
        throw py::value_error(std::string("state[\"schedule\"]: missing \"") + kScheduleKeys[c] + "\"");
      }
      counters[c] =
          integer(schedule[kScheduleKeys[c]], std::string("state[\"schedule\"][\"") + kScheduleKeys[c] + "\"]");
    }
    if (!schedule.contains("skipped")) throw py::value_error("state[\"schedule\"]: missing \"skipped\"");
    counters[ZF_COUNTER_SKIPPED] = integer(schedule["skipped"], "state[\"schedule\"][\"skipped\"]");
    // Absent from a state saved before they existed (a flushed state): 0.
    if (schedule.contains("steps_accumulated"))
      counters[ZF_COUNTER_STEPS_ACCUMULATED] =
          integer(schedule["steps_accumulated"], "state[\"schedule\"][\"steps_accumulated\"]");
    if (schedule.contains("update_pending"))
      counters[ZF_COUNTER_UPDATE_PENDING] =
          integer(schedule["update_pending"], "state[\"schedule\"][\"update_pending\"]");
    const py::dict scaler = d["loss_scaler"].cast<py::dict>();
    if (!scaler.contains("scale") || !scaler.contains("growth_tracker")) {
      throw py::value_error("state[\"loss_scaler\"]: needs \"scale\" and \"growth_tracker\"");
    }
    counters[ZF_COUNTER_GROWTH_TRACKER] =
        integer(scaler["growth_tracker"], "state[\"loss_scaler\"][\"growth_tracker\"]");
    // Absent from a state saved before the counter existed: no overflow absorbed.
    if (scaler.contains("hysteresis"))
      counters[ZF_COUNTER_HYSTERESIS] = integer(scaler["hysteresis"], "state[\"loss_scaler\"][\"hysteresis\"]");
    const double scale = number(scaler["scale"], "state[\"loss_scaler\"][\"scale\"]");
    call([&] { return zf_engine_load_state(engine, tensors.data(), tensors.size(), counters.data(), scale); });
  }

 private:
  zf_engine* live() const {
    if (engine_ == nullptr) throw py::value_error("engine: closed");
    return engine_;
  }

  template <typename Fn>
  static zf_status release_gil(Fn&& fn) {
    py::gil_scoped_release release;
    return fn();
  }

  template <typename Fn>
  static void call(Fn&& fn) {
    check(release_gil(std::forward<Fn>(fn)));
  }

  std::vector<double> learning_rates(const py::object& lrs) const {
    std::vector<double> rates;
    if (lrs.is_none()) return rates;
    const py::object seq = as_fast_sequence(lrs, "lrs");
    const size_t count = static_cast<size_t>(PySequence_Fast_GET_SIZE(seq.ptr()));
    require_length(group_count_, count, "lrs", "learning rates (one per group)");
    for (size_t g = 0; g < count; ++g) {
      rates.push_back(
          number(PySequence_Fast_GET_ITEM(seq.ptr(), static_cast<Py_ssize_t>(g)), "lrs[" + std::to_string(g) + "]"));
    }
    return rates;
  }

  std::vector<zf_engine_state_entry> layout() const {
    size_t count = 0;
    check(zf_engine_state_layout(engine_, nullptr, &count));
    std::vector<zf_engine_state_entry> entries(count);
    check(zf_engine_state_layout(engine_, entries.data(), &count));
    entries.resize(count);
    return entries;
  }

  // A buffer of the parameters' array family (torch or numpy) for one state entry.
  py::object empty(const zf_engine_state_entry& entry) const {
    py::tuple shape(entry.ndim);
    for (int d = 0; d < entry.ndim; ++d) shape[d] = entry.shape[d];
    const char* dtype = entry.dtype == ZF_DTYPE_I32 ? "int32" : "float32";
    if (torch_params_) {
      const py::module_ torch = py::module_::import("torch");
      return torch.attr("empty")(shape, py::arg("dtype") = torch.attr(dtype));
    }
    return py::module_::import("numpy").attr("empty")(shape, py::arg("dtype") = dtype);
  }

  // The engine wrote the parameters in place: bump their autograd versions, as torch's own
  // optimizers do, so a backward through a graph built before the step raises.
  // zf_engine_check_params before a step: a parameter whose storage was replaced since
  // creation is an error, not a write into freed memory (torch parameters; others are
  // held alive by params_ and cannot be swapped under the engine).
  void check_params_in_place() {
    if (!torch_params_) return;
    std::vector<const void*> data;
    data.reserve(static_cast<size_t>(py::len(params_)));
    for (const py::handle p : params_)
      data.push_back(reinterpret_cast<const void*>(p.attr("data_ptr")().cast<uintptr_t>()));
    check(zf_engine_check_params(engine_, data.data(), data.size()));
  }

  void bump_params() {
    if (!torch_params_) return;
    static py::object increment_version = py::module_::import("torch").attr("_C").attr("_increment_version");
    increment_version(params_);
  }

  zf_engine* engine_ = nullptr;
  py::list params_;                             // keeps the parameters alive at the addresses the engine holds
  ConsumerStreams streams_;                     // the compute streams set_stream gave, per CUDA device
  py::list memory_;                             // the attached device memory, released after destroy
  std::unique_ptr<PyCollectives> collectives_;  // data parallel: the engine calls them until destroyed
  py::list submitted_;
  size_t group_count_ = 0;
  bool torch_params_ = false;
};

}  // namespace

void register_engine(py::module_& m) {
  m.def("config_keys", &describe_keys,
        "The engine's configuration table (engine.h: zf_engine_config_key_at), one dict per field: name, type, "
        "default (as Python: None / \"auto\" for a zero sentinel), range, zero_means, choices, meaning, "
        "deepspeed_key, deepspeed_default (a JSON literal), deepspeed_difference.");
  m.def(
      "check_config",
      [](const py::dict& config, bool deepspeed_rules) { return config_dict(parse_config(config, deepspeed_rules)); },
      py::arg("config"), py::arg("deepspeed_rules") = false,
      "Parses and checks a config dict as Engine() does (zf_engine_config_check; with deepspeed_rules, "
      "zf_engine_config_check_deepspeed) and returns every field's value "
      "(defaults filled in). Unknown key: ValueError; wrong type: TypeError; out of range: the engine's "
      "ValueError; each names the key.");
  m.def(
      "engine_thread_plan",
      [](const py::object& config) {
        const zf_engine_config c = config.is_none() ? zf_engine_config_default() : parse_config(config);
        zf_engine_thread_plan plan{};
        check(zf_engine_thread_plan_for(&c, &plan));
        py::dict out;
        out["cores"] = plan.cores;
        out["compute_threads"] = plan.compute_threads;
        out["host_threads"] = plan.host_threads;
        out["framework_threads"] = plan.framework_threads;
        return out;
      },
      py::arg("config") = py::none(),
      "The engine's thread plan for a config dict (engine.h: zf_engine_thread_plan_for): this rank's cores, "
      "the compute and host lanes' threads, and the framework's intra-op threads beside them.");

  m.def(
      "param_state_layout",
      [](const py::handle& param, bool dense_group) {
        Converter conv;
        const zf_tensor tensor = conv.tensor(param, ArgName{"param"}, Access::kRead);
        size_t count = 0;
        check(zf_engine_param_state_layout(&tensor, dense_group ? 1 : 0, nullptr, &count));
        std::vector<zf_engine_state_entry> entries(count);
        check(zf_engine_param_state_layout(&tensor, dense_group ? 1 : 0, entries.data(), &count));
        py::list out;
        for (const zf_engine_state_entry& e : entries) {
          py::tuple shape(static_cast<size_t>(e.ndim));
          for (int32_t d = 0; d < e.ndim; ++d) shape[static_cast<size_t>(d)] = e.shape[d];
          out.append(
              py::make_tuple(zf_engine_state_kind_name(e.kind), e.dtype == ZF_DTYPE_I32 ? "int32" : "float32", shape));
        }
        return out;
      },
      py::arg("param"), py::arg("dense_group"),
      "The engine's state entries of one parameter (engine.h: zf_engine_param_state_layout): a list of (name, "
      "dtype name, shape), 4 for a dense parameter, 8 for a matrix; the checkpoint schema, from the engine.");

  py::class_<PyEngine>(m, "Engine", R"doc(
The zenflow engine: the whole stall-free pipeline as one object (see docs/design.md).

Engine(params, groups, config=None)
  params: list of tensors (fp32, bf16 or fp16, contiguous), updated in place, all on the CPU
          (the host backend) or all on CUDA devices (the CUDA backend, in a build with CUDA;
          one device or several). Keep them alive and at the same address for the engine's
          lifetime.

CUDA parameters: call set_stream(torch.cuda.current_stream(device).cuda_stream) before the
calls that run work (step, begin_step, submit, end_step, abort_step, flush, state_dict,
load_state_dict), and attach_device_memory(torch.empty(device_memory_size(),
dtype=torch.uint8, device=device)) before the first step or load. With parameters on several
devices, devices() lists them and each of the three calls takes the device's index. The
state_dict buffers are CPU tensors for every backend, so a checkpoint loads across them.
  groups: list of dicts {"params": [indices into params], "lr": float,
          "weight_decay": float (0), "dense": bool (False)}; each parameter in exactly one.
  config: dict of engine settings (topk_ratio, update_interval, overlap_step, ...); missing
          keys take their defaults (zf_engine_config_default in engine.h).
)doc")
      .def(py::init<const py::object&, const py::object&, const py::object&>(), py::arg("params"), py::arg("groups"),
           py::arg("config") = py::none())
      .def("step", &PyEngine::step, py::arg("grads"), py::arg("lrs") = py::none(),
           "One step with gradients aligned with params; lrs: one learning rate per group (None: the groups' own).")
      .def("begin_step", &PyEngine::begin_step, py::arg("lrs") = py::none())
      .def("submit", &PyEngine::submit, py::arg("first"), py::arg("grads"),
           "Gradients of params[first : first + len(grads)]; they must stay unchanged until end_step.")
      .def("end_step", &PyEngine::end_step)
      .def("mark_ready", &PyEngine::mark_ready, py::arg("index"), py::arg("grad"),
           "In a split step: params[index]'s gradient is ready (backward hooks); the engine submits runs of ready "
           "parameters itself. The gradient must stay alive until the step ends.")
      .def("end_step_with", &PyEngine::end_step_with, py::arg("grads"),
           "Ends a split step with every parameter's final gradient (those not yet submitted are; a gradient marked "
           "again after its submit retakes the step whole).")
      .def("abort_step", &PyEngine::abort_step,
           "Discards an open split step (a failed backward): the engine is as before begin_step.")
      .def("flush", &PyEngine::flush, "Applies every pending host update: the parameters are then exact.")
      .def("set_hyperparameters", &PyEngine::set_hyperparameters, py::arg("betas"), py::arg("eps"),
           py::arg("weight_decays") = py::none(),
           "Adam's betas and eps and each group's weight decay for every later step (engine.h: "
           "zf_engine_set_hyperparameters): nothing is flushed or rebuilt; a window's host update uses its last "
           "step's values.")
      .def("refuse", &PyEngine::refuse, py::arg("call"),
           "Data parallel: this rank refuses `call` ('step', 'flush', 'save', 'load') before making it; "
           "every rank's call fails. Does nothing without collectives.")
      .def("_inject_host_lane_fault", &PyEngine::inject_host_lane_fault, py::arg("message"),
           "Testing: the host lane's next piece of work fails with `message`.")
      .def("stats", &PyEngine::stats)
      .def_property_readonly("loss_scale", &PyEngine::loss_scale)
      .def("device_count", &PyEngine::device_count, "The number of devices the parameters are on.")
      .def("devices", &PyEngine::devices,
           "The parameters' devices ('cpu', 'cuda:1', ...), in the order of the index arguments.")
      .def("device_memory_size", &PyEngine::device_memory_size, py::arg("index") = py::none(),
           "Bytes of device memory the engine needs on device `index` (attach_device_memory), known at creation; "
           "index None: the only device.")
      .def("attach_device_memory", &PyEngine::attach_device_memory, py::arg("memory"), py::arg("index") = py::none(),
           "Gives the engine its device memory before the first step or load: a contiguous torch.uint8 "
           "tensor of at least device_memory_size(index) elements on that device; the engine keeps it.")
      .def("set_collectives", &PyEngine::set_collectives, py::arg("rank"), py::arg("world_size"),
           py::arg("all_reduce_sum"), py::arg("reduce_scatter_sum"), py::arg("all_gather"),
           "Data parallel: this engine is rank `rank` of `world_size`. all_reduce_sum(address, count, dtype, "
           "stream) sums in place over the ranks; reduce_scatter_sum(in_address, out_address, count, dtype, "
           "stream) and all_gather(in_address, out_address, count, dtype, stream) as engine.h describes. "
           "Addresses (integers) lie in the attached device memory, count is in elements, dtype a name "
           "('float32', 'bfloat16', 'float16', 'int32', 'int64'), stream the cudaStream_t (0 on the host). An "
           "exception fails the engine call with its text. Before attach_device_memory (query device_memory_size after "
           "it).")
      .def("set_stream", &PyEngine::set_stream, py::arg("stream"), py::arg("index") = py::none(),
           "The CUDA stream (an integer cudaStream_t, 0: the legacy default stream) of every later call on "
           "device `index` (None: the only device); the host backend takes only 0.")
      .def("state_dict", &PyEngine::state_dict,
           "Flushes, then returns the optimizer state (independent of the selection).")
      .def("load_state_dict", &PyEngine::load_state_dict, py::arg("state"))
      .def("close", &PyEngine::close, "Joins the host lane and frees the engine; later calls raise.");
}

}  // namespace zf_py
