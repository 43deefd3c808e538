// zenflow._C.Engine: the engine (engine.h) for Python. Parameters are given once, at
// construction, and updated in place; each step passes only the gradients. The state
// machine lives in C++: this file only converts arguments and results. The Engine class and
// its registration are here; config dicts and groups, devices, collectives and the state
// dict are converted in the files bind_engine.hpp lists.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bind_engine.hpp"
#include "bindings.hpp"
#include "tensor_convert.hpp"
#include "zenflow/engine.h"

namespace zf_py {

namespace {

// The binding of zenflow::Engine (zenflow.hpp, the C++ layer over engine.h): arguments and
// results converted, nothing decided here. Every call that runs work takes `stream` (None:
// the stream set last; an integer cudaStream_t for every device, or one per device), so the
// Python layer passes its current stream with the call.
class PyEngine {
 public:
  PyEngine(const py::object& params, const py::object& groups, const py::object& config) {
    const py::object param_list = as_fast_sequence(params, "params");
    const py::object group_list = as_fast_sequence(groups, "groups");
    const size_t param_count = static_cast<size_t>(PySequence_Fast_GET_SIZE(param_list.ptr()));
    Converter conv;
    const std::vector<zf_tensor> tensors = conv.list(param_list, "params", Access::kWrite);

    const EngineGroups parsed = parse_groups(group_list, param_count);
    if (!config.is_none() && !py::isinstance<py::dict>(config)) throw py::type_error("config: expected a dict");
    const zf_engine_config c_config = config.is_none() ? zf_engine_config_default() : parse_config(config);

    run([&] { engine_ = zenflow::Engine(tensors, parsed.param_groups, parsed.groups, c_config); });
    params_ = py::list(param_list);
    group_count_ = parsed.groups.size();
    torch_params_ =
        !tensors.empty() && std::string(py::str(py::type::of(params_[0]).attr("__module__"))).rfind("torch", 0) == 0;
  }

  ~PyEngine() { close(); }

  void close() {
    if (engine_.get() == nullptr) return;
    {
      py::gil_scoped_release release;
      engine_.reset();
    }
    // Only now: the engine no longer uses the attached memory (destroy waits for its lanes)
    // nor calls the collectives.
    memory_ = py::list();
    collectives_.reset();
  }

  // zf_engine_set_stream_at: `handle` a cudaStream_t as an integer (0: the legacy default
  // stream, the host backend's only one) for device `index` (None: the only one).
  void set_stream(const py::object& handle, const py::object& index) {
    zf_engine* engine = live().get();
    const int64_t value = integer(handle, "stream");
    if (value < 0)
      throw py::value_error("stream: expected a cudaStream_t handle (an integer >= 0), got " + std::to_string(value));
    const size_t d = device_index(engine, index);
    run([&] { engine_.set_stream_at(d, reinterpret_cast<zf_stream>(static_cast<uintptr_t>(value))); });
    // The gradients of later calls come from DLPack producers on this stream too.
    const zf_device device = device_at(engine, d).device;
    if (device.type == ZF_DEVICE_CUDA) {
      const size_t ordinal = static_cast<size_t>(device.index);
      if (streams_.by_device.size() <= ordinal) streams_.by_device.resize(ordinal + 1, -1);
      streams_.by_device[ordinal] = static_cast<intptr_t>(value);
    }
  }

  // A call's `stream`: None keeps the streams set; an integer is every device's; a sequence
  // gives one per device, in devices() order.
  void set_streams(const py::object& stream) {
    if (stream.is_none()) return;
    const size_t count = zf_py::device_count(live().get());
    if (py::isinstance<py::int_>(stream)) {
      for (size_t d = 0; d < count; ++d) set_stream(stream, py::int_(d));
      return;
    }
    const py::object list = as_fast_sequence(stream, "stream");
    require_length(count, static_cast<size_t>(PySequence_Fast_GET_SIZE(list.ptr())), "stream",
                   "streams (one per device)");
    for (size_t d = 0; d < count; ++d)
      set_stream(py::reinterpret_borrow<py::object>(PySequence_Fast_GET_ITEM(list.ptr(), static_cast<Py_ssize_t>(d))),
                 py::int_(d));
  }

  size_t device_count() const { return zf_py::device_count(live().get()); }

  py::list devices() const {
    py::list out;
    zf_engine* engine = live().get();
    const size_t count = zf_py::device_count(engine);
    for (size_t d = 0; d < count; ++d) out.append(device_name(device_at(engine, d).device));
    return out;
  }

  // Data parallel (zf_engine_set_collectives; the callables' contract is in the docstring
  // below). The engine keeps the callables until it is closed.
  void set_collectives(const py::object& rank, const py::object& world_size, const py::object& all_reduce_sum,
                       const py::object& reduce_scatter_sum, const py::object& all_gather) {
    zenflow::Engine& engine = live();
    auto collectives =
        std::make_unique<PyCollectives>(rank, world_size, all_reduce_sum, reduce_scatter_sum, all_gather);
    const zf_engine_collectives& table = collectives->table();
    run([&] { engine.set_collectives(table); });
    // The previous table (if any) is no longer referenced by the engine.
    collectives_ = std::move(collectives);
  }

  // zf_engine_attach_device_memory_at: a contiguous torch.uint8 tensor, kept as long as the
  // engine lives.
  void attach_device_memory(const py::object& memory, const py::object& index) {
    zenflow::Engine& engine = live();
    const size_t d = device_index(engine.get(), index);
    size_t bytes = 0;
    void* data = device_memory(engine.get(), d, memory, &bytes);
    run([&] { engine.attach_device_memory_at(d, data, bytes); });
    memory_.append(memory);
  }

  void step(const py::object& grads, const py::object& lrs, const py::object& stream) {
    zenflow::Engine& engine = live_on(stream);
    check_params_in_place();
    Converter conv(streams_);
    const std::vector<zf_tensor> tensors = conv.list(grads, "grads", Access::kRead);
    const std::vector<double> rates = learning_rates(lrs);
    run([&] { engine.step(tensors, rates); });
    bump_params();
  }

  void begin_step(const py::object& lrs, const py::object& stream) {
    zenflow::Engine& engine = live_on(stream);
    check_params_in_place();
    const std::vector<double> rates = learning_rates(lrs);
    run([&] { engine.begin_step(rates); });
    // The gradients kept alive for the engine (engine.h) are this step's from here.
    forget_step_gradients();
  }

  void submit(int64_t first, const py::object& grads, const py::object& stream) {
    if (first < 0) throw py::value_error("first: must be >= 0, got " + std::to_string(first));
    zenflow::Engine& engine = live_on(stream);
    Converter conv(streams_);
    const std::vector<zf_tensor> tensors = conv.list(grads, "grads", Access::kRead);
    run([&] { engine.submit(static_cast<size_t>(first), tensors); });
    submitted_.append(grads);
  }

  void end_step(const py::object& stream) {
    zenflow::Engine& engine = live_on(stream);
    finish_step([&] { engine.end_step(); });
  }

  // zf_engine_mark_ready: the gradient is kept alive until the step ends or the engine
  // releases it (take_released).
  void mark_ready(int64_t index, const py::object& grad, const py::object& stream) {
    if (index < 0) throw py::value_error("index: must be >= 0, got " + std::to_string(index));
    zenflow::Engine& engine = live_on(stream);
    Converter conv(streams_);
    const zf_tensor tensor = conv.tensor(grad, ArgName{"grad"}, Access::kRead);
    run([&] { engine.mark_ready(static_cast<size_t>(index), tensor); });
    const py::int_ key(index);
    if (!ready_.contains(key)) ready_[key] = py::list();
    ready_[key].cast<py::list>().append(grad);
  }

  // zf_engine_take_released (our references to those gradients are dropped too).
  py::list take_released() {
    zenflow::Engine& engine = live();
    std::vector<size_t> indices;
    const size_t param_count = static_cast<size_t>(py::len(params_));
    run([&] { indices = engine.take_released(param_count); });
    py::list out;
    for (const size_t i : indices) {
      out.append(i);
      ready_.attr("pop")(py::int_(i), py::none());
    }
    return out;
  }

  // zf_engine_end_step_with (None for a released parameter: its entry is not read).
  void end_step_with(const py::object& grads, const py::object& stream) {
    zenflow::Engine& engine = live_on(stream);
    Converter conv(streams_);
    const py::object items = as_fast_sequence(grads, "grads");
    std::vector<zf_tensor> tensors(static_cast<size_t>(PySequence_Fast_GET_SIZE(items.ptr())));
    for (size_t i = 0; i < tensors.size(); ++i) {
      PyObject* item = PySequence_Fast_GET_ITEM(items.ptr(), static_cast<Py_ssize_t>(i));
      if (item != Py_None) tensors[i] = conv.tensor(item, ArgName{"grads", static_cast<ptrdiff_t>(i)}, Access::kRead);
    }
    finish_step([&] { engine.end_step_with(tensors); });
  }

  void abort_step(const py::object& stream) {
    zenflow::Engine& engine = live_on(stream);
    run([&] { engine.abort_step(); });
    forget_step_gradients();
  }

  void flush(const py::object& stream) {
    zenflow::Engine& engine = live_on(stream);
    run([&] { engine.flush(); });
    bump_params();
  }

  // The betas, eps and per-group weight decays of later steps (zf_engine_set_hyperparameters):
  // no flush, no rebuild. weight_decays None keeps them.
  void set_hyperparameters(const py::object& betas, const py::object& eps, const py::object& weight_decays) {
    zenflow::Engine& engine = live();
    const std::vector<double> pair = numbers(betas, "betas");
    if (pair.size() != 2) throw py::value_error("betas: expected (beta1, beta2)");
    const double epsilon = number(eps, "eps");
    const std::vector<double> decays =
        weight_decays.is_none() ? std::vector<double>{} : numbers(weight_decays, "weight_decays");
    run([&] { engine.set_hyperparameters(pair[0], pair[1], epsilon, decays); });
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
      zenflow::Engine& engine = live();
      const zf_engine_call c = entry.second;
      const Outcome outcome = attempt([&] { engine.refuse(c); });
      // ZF_ERROR_INVALID_VALUE is the refusal itself (engine.h): the caller raises its own error.
      if (outcome.status != ZF_ERROR_INVALID_VALUE) outcome.raise();
      return;
    }
    throw py::value_error("call: expected 'step', 'flush', 'save' or 'load', got '" + call_name + "'");
  }

  // Testing (engine.h): the host lane's next piece of work fails with `message`.
  void inject_host_lane_fault(const std::string& message) {
    zenflow::Engine& engine = live();
    run([&] { engine.inject_host_lane_fault_for_testing(message.c_str()); });
  }

  py::dict stats() const {
    zf_engine_stats s{};
    const zenflow::Engine& engine = live();
    run([&] { s = engine.stats(); });
    return stats_dict(s);
  }

  double loss_scale() const {
    double scale = 0.0;
    const zenflow::Engine& engine = live();
    run([&] { scale = engine.loss_scale(); });
    return scale;
  }

  size_t device_memory_size(const py::object& index) const {
    zf_engine* engine = live().get();
    return device_at(engine, device_index(engine, index)).memory_bytes;
  }

  py::dict state_dict(const py::object& stream) {
    zf_engine* engine = live_on(stream).get();
    return save_state(engine, torch_params_);
  }

  void load_state_dict(const py::object& state, const py::object& stream) {
    zf_engine* engine = live_on(stream).get();
    load_state(engine, state, static_cast<size_t>(py::len(params_)), torch_params_);
  }

 private:
  zenflow::Engine& live() {
    if (engine_.get() == nullptr) throw py::value_error("engine: closed");
    return engine_;
  }
  const zenflow::Engine& live() const {
    if (engine_.get() == nullptr) throw py::value_error("engine: closed");
    return engine_;
  }
  // The engine, on the call's `stream` (set_streams).
  zenflow::Engine& live_on(const py::object& stream) {
    zenflow::Engine& engine = live();
    set_streams(stream);
    return engine;
  }

  // end_step and end_step_with: the step's gradients are forgotten whether it ended or failed.
  template <typename Fn>
  void finish_step(Fn&& fn) {
    const Outcome outcome = attempt(std::forward<Fn>(fn));
    forget_step_gradients();
    outcome.raise();
    bump_params();
  }

  // A sequence of numbers; `name[i]` names a bad item.
  static std::vector<double> numbers(const py::object& values, const std::string& name) {
    const py::object seq = as_fast_sequence(values, name.c_str());
    std::vector<double> out(static_cast<size_t>(PySequence_Fast_GET_SIZE(seq.ptr())));
    for (size_t i = 0; i < out.size(); ++i)
      out[i] =
          number(PySequence_Fast_GET_ITEM(seq.ptr(), static_cast<Py_ssize_t>(i)), name + "[" + std::to_string(i) + "]");
    return out;
  }

  std::vector<double> learning_rates(const py::object& lrs) const {
    if (lrs.is_none()) return {};
    std::vector<double> rates = numbers(lrs, "lrs");
    require_length(group_count_, rates.size(), "lrs", "learning rates (one per group)");
    return rates;
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
    run([&] { engine_.check_params(data); });
  }

  void bump_params() {
    if (!torch_params_) return;
    static py::object increment_version = py::module_::import("torch").attr("_C").attr("_increment_version");
    increment_version(params_);
  }

  zenflow::Engine engine_{nullptr};
  py::list params_;                             // keeps the parameters alive at the addresses the engine holds
  ConsumerStreams streams_;                     // the compute streams set_stream gave, per CUDA device
  py::list memory_;                             // the attached device memory, released after destroy
  std::unique_ptr<PyCollectives> collectives_;  // data parallel: the engine calls them until destroyed
  // The gradients of the open split step, kept alive for the engine: submit's, and
  // mark_ready's by parameter index (until released or the step ends).
  py::list submitted_;
  py::dict ready_;
  void forget_step_gradients() {
    submitted_ = py::list();
    ready_ = py::dict();
  }
  size_t group_count_ = 0;
  bool torch_params_ = false;
};

}  // namespace

void register_engine(py::module_& m) {
  register_engine_config(m);
  register_engine_state(m);

  const py::arg_v stream = py::arg("stream") = py::none();  // the calls that run work: keyword-only
  py::class_<PyEngine>(m, "Engine", R"doc(
The zenflow engine: the whole stall-free pipeline as one object (see docs/design.md).

Engine(params, groups, config=None)
  params: list of tensors (fp32, bf16 or fp16, contiguous), updated in place, all on the CPU
          (the host backend) or all on CUDA devices (the CUDA backend, in a build with CUDA;
          one device or several). Keep them alive and at the same address for the engine's
          lifetime.

CUDA parameters: pass stream=torch.cuda.current_stream(device).cuda_stream (a list, one per
device, with parameters on several) with the calls that run work (step, begin_step, submit,
mark_ready, end_step, end_step_with, abort_step, flush, state_dict, load_state_dict), or set
it for every later call with set_stream / set_streams; and attach_device_memory(
torch.empty(device_memory_size(), dtype=torch.uint8, device=device)) before the first step or
load. With parameters on several
devices, devices() lists them and each of the three calls takes the device's index. The
state_dict buffers are CPU tensors for every backend, so a checkpoint loads across them.
  groups: list of dicts {"params": [indices into params], "lr": float,
          "weight_decay": float (0), "dense": bool (False)}; each parameter in exactly one.
  config: dict of engine settings (topk_ratio, update_interval, overlap_step, ...); missing
          keys take their defaults (zf_engine_config_default in engine.h).
)doc")
      .def(py::init<const py::object&, const py::object&, const py::object&>(), py::arg("params"), py::arg("groups"),
           py::arg("config") = py::none())
      .def("step", &PyEngine::step, py::arg("grads"), py::arg("lrs") = py::none(), py::kw_only(), stream,
           "One step with gradients aligned with params; lrs: one learning rate per group (None: the groups' own).")
      .def("begin_step", &PyEngine::begin_step, py::arg("lrs") = py::none(), py::kw_only(), stream)
      .def("submit", &PyEngine::submit, py::arg("first"), py::arg("grads"), py::kw_only(), stream,
           "Gradients of params[first : first + len(grads)]; they must stay unchanged until end_step.")
      .def("end_step", &PyEngine::end_step, py::kw_only(), stream)
      .def("mark_ready", &PyEngine::mark_ready, py::arg("index"), py::arg("grad"), py::kw_only(), stream,
           "In a split step: params[index]'s gradient is ready (backward hooks); the engine submits runs of ready "
           "parameters itself. The gradient must stay alive until the step ends.")
      .def("take_released", &PyEngine::take_released,
           "release_gradients: the parameters whose gradients the engine released since the last call.")
      .def("end_step_with", &PyEngine::end_step_with, py::arg("grads"), py::kw_only(), stream,
           "Ends a split step with every parameter's final gradient (those not yet submitted are; a gradient marked "
           "again after its submit retakes the step whole).")
      .def("abort_step", &PyEngine::abort_step, py::kw_only(), stream,
           "Discards an open split step (a failed backward): the engine is as before begin_step.")
      .def("flush", &PyEngine::flush, py::kw_only(), stream,
           "Applies every pending host update: the parameters are then exact.")
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
           "stream) sums in place; reduce_scatter_sum and all_gather(in_address, out_address, count, dtype, "
           "stream) as engine.h describes. Addresses (integers) lie in the attached device memory, count is in "
           "elements, dtype a name ('float32', 'bfloat16', 'float16', 'int32', 'int64'), stream the cudaStream_t "
           "(0 on the host). An exception fails the engine call with its text. Before attach_device_memory.")
      .def("set_stream", &PyEngine::set_stream, py::arg("stream"), py::arg("index") = py::none(),
           "The CUDA stream (an integer cudaStream_t, 0: the legacy default stream) of every later call on "
           "device `index` (None: the only device); the host backend takes only 0.")
      .def("set_streams", &PyEngine::set_streams, py::arg("stream"),
           "The CUDA stream of every later call: an integer for every device, or one per device (devices() "
           "order); None changes nothing. The calls that run work take the same value as `stream=`.")
      .def("state_dict", &PyEngine::state_dict, py::kw_only(), stream,
           "The optimizer state (independent of the selection); nothing is flushed (zf_engine_save_state).")
      .def("load_state_dict", &PyEngine::load_state_dict, py::arg("state"), py::kw_only(), stream)
      .def("close", &PyEngine::close, "Joins the host lane and frees the engine; later calls raise.");
}

}  // namespace zf_py
