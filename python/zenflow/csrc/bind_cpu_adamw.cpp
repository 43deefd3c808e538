#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <vector>

#include "bindings.hpp"
#include "tensor_convert.hpp"

namespace zf_py {

namespace {

const zf_tensor* optional_data(const std::vector<zf_tensor>& list) { return list.empty() ? nullptr : list.data(); }

}  // namespace

// The host optimizer (zenflow/cpu_adamw.h). CPU tensors only; the GIL is released while the
// pool computes. lr and weight_decay are one double per tensor/matrix; mode is a zf_adam_mode;
// flags are the ZF_CPU_ADAMW_* bits.
void register_cpu_adamw(py::module_& m) {
  m.attr("CPU_ADAMW_ZERO_GRAD") = ZF_CPU_ADAMW_ZERO_GRAD;
  m.attr("CPU_ADAMW_INCREMENT_STEPS") = ZF_CPU_ADAMW_INCREMENT_STEPS;
  m.attr("ADAM_MODE_ADAMW") = static_cast<int>(ZF_ADAM_MODE_ADAMW);
  m.attr("ADAM_MODE_ADAM") = static_cast<int>(ZF_ADAM_MODE_ADAM);

  m.def(
      "cpu_adamw_step",
      [](const py::object& params, const py::object& exp_avgs, const py::object& exp_avg_sqs, const py::object& grads,
         const py::object& out_params, const std::vector<int64_t>& steps, const std::vector<double>& lr,
         const std::vector<double>& weight_decay, double beta1, double beta2, double eps, int mode, float grad_scale,
         uint32_t flags) {
        Converter conv;
        const auto p = conv.list(params, "params", Access::kWrite);
        const auto mo = conv.list(exp_avgs, "exp_avgs", Access::kWrite);
        const auto v = conv.list(exp_avg_sqs, "exp_avg_sqs", Access::kWrite);
        const auto g =
            conv.list(grads, "grads", (flags & ZF_CPU_ADAMW_ZERO_GRAD) != 0 ? Access::kWrite : Access::kRead);
        const auto out = conv.optional_list(out_params, "out_params", Access::kWrite);
        const size_t count = p.size();
        require_length(count, mo.size(), "exp_avgs", "params");
        require_length(count, v.size(), "exp_avg_sqs", "params");
        require_length(count, g.size(), "grads", "params");
        if (!out_params.is_none()) require_length(count, out.size(), "out_params", "params");
        require_length(count, steps.size(), "steps", "params");
        require_length(count, lr.size(), "lr", "params");
        require_length(count, weight_decay.size(), "weight_decay", "params");
        const zf_adam_hparams h{beta1, beta2, eps, static_cast<zf_adam_mode>(mode)};
        conv.run([&] {
          return zf_cpu_adamw_step(p.data(), mo.data(), v.data(), g.data(), out_params.is_none() ? nullptr : out.data(),
                                   count, steps.data(), lr.data(), weight_decay.data(), &h, grad_scale, flags);
        });
      },
      py::arg("params"), py::arg("exp_avgs"), py::arg("exp_avg_sqs"), py::arg("grads"), py::arg("out_params"),
      py::arg("steps"), py::arg("lr"), py::arg("weight_decay"), py::arg("beta1"), py::arg("beta2"), py::arg("eps"),
      py::arg("mode"), py::arg("grad_scale"), py::arg("flags"));

  // The flat-state step: params or master is None; offsets, sizes, steps, lr and weight_decay
  // are one value per gradient. step_counts (CPUAdamW's steady state): instead of `steps`
  // (then empty), a float32 CPU tensor of one count per gradient, torch's state["step"]
  // values; each step uses its count + 1, and only after success are the counts incremented
  // in place (and the tensor's version bumped), in the same call.
  m.def(
      "cpu_adamw_step_flat",
      [](const py::object& params, const py::object& master, const py::object& exp_avg, const py::object& exp_avg_sq,
         const std::vector<int64_t>& offsets, const std::vector<int64_t>& sizes, const py::object& grads,
         const py::object& out_params, std::vector<int64_t> steps, const std::vector<double>& lr,
         const std::vector<double>& weight_decay, double beta1, double beta2, double eps, int mode, float grad_scale,
         uint32_t flags, const py::object& step_counts) {
        Converter conv;
        const auto g =
            conv.list(grads, "grads", (flags & ZF_CPU_ADAMW_ZERO_GRAD) != 0 ? Access::kWrite : Access::kRead);
        const size_t count = g.size();
        const auto p = conv.optional_list(params, "params", Access::kWrite);
        if (!params.is_none()) require_length(count, p.size(), "params", "grads");
        zf_tensor master_desc{};
        if (!master.is_none()) master_desc = conv.tensor(master, ArgName{"master"}, Access::kWrite);
        const zf_tensor m_desc = conv.tensor(exp_avg, ArgName{"exp_avg"}, Access::kWrite);
        const zf_tensor v_desc = conv.tensor(exp_avg_sq, ArgName{"exp_avg_sq"}, Access::kWrite);
        const auto out = conv.optional_list(out_params, "out_params", Access::kWrite);
        if (!out_params.is_none()) require_length(count, out.size(), "out_params", "grads");
        require_length(count, offsets.size(), "offsets", "grads");
        require_length(count, sizes.size(), "sizes", "grads");
        float* counts = nullptr;
        if (!step_counts.is_none()) {
          require_length(0, steps.size(), "steps", "step_counts (give one or the other)");
          const zf_tensor c = conv.tensor(step_counts, ArgName{"step_counts"}, Access::kWrite);
          int64_t numel = 1;
          for (int d = 0; d < c.ndim; ++d) numel *= c.shape[d];
          if (c.dtype != ZF_DTYPE_F32) {
            throw py::type_error(std::string("step_counts: expected float32 counts (torch's state[\"step\"]), got ") +
                                 zf_dtype_name(c.dtype));
          }
          if (c.device.type != ZF_DEVICE_CPU || c.ndim != 1 || c.strides[0] != 1 ||
              numel != static_cast<int64_t>(count)) {
            throw py::value_error("step_counts: expected a contiguous 1-D float32 CPU tensor of " +
                                  std::to_string(count) + " counts (one per gradient)");
          }
          counts = static_cast<float*>(c.data);
          steps.resize(count);
          for (size_t i = 0; i < count; ++i) {
            // As torch's int(step): truncated. Out-of-range counts become a step the C call
            // rejects (steps[i] >= 1), never an undefined float-to-integer conversion.
            const float value = counts[i];
            steps[i] = (value >= 0.0f && value < 2147483647.0f) ? static_cast<int64_t>(value) + 1 : 0;
          }
        }
        require_length(count, steps.size(), "steps", "grads");
        require_length(count, lr.size(), "lr", "grads");
        require_length(count, weight_decay.size(), "weight_decay", "grads");
        const zf_adam_hparams h{beta1, beta2, eps, static_cast<zf_adam_mode>(mode)};
        conv.run([&] {
          return zf_cpu_adamw_step_flat(params.is_none() ? nullptr : p.data(),
                                        master.is_none() ? nullptr : &master_desc, &m_desc, &v_desc, offsets.data(),
                                        sizes.data(), g.data(), out_params.is_none() ? nullptr : out.data(), count,
                                        steps.data(), lr.data(), weight_decay.data(), &h, grad_scale, flags);
        });
        // Succeeded (run() raises otherwise): the counts advance, as torch's step does.
        for (size_t i = 0; counts != nullptr && i < count; ++i) counts[i] = static_cast<float>(steps[i]);
      },
      py::arg("params"), py::arg("master"), py::arg("exp_avg"), py::arg("exp_avg_sq"), py::arg("offsets"),
      py::arg("sizes"), py::arg("grads"), py::arg("out_params"), py::arg("steps"), py::arg("lr"),
      py::arg("weight_decay"), py::arg("beta1"), py::arg("beta2"), py::arg("eps"), py::arg("mode"),
      py::arg("grad_scale"), py::arg("flags"), py::arg("step_counts") = py::none());

  m.def(
      "cpu_adamw_step_skip_columns",
      [](const py::object& state, const py::object& selected, const py::object& grads, const py::object& packed_grads,
         const py::object& packed_out, const std::vector<double>& lr, const std::vector<double>& weight_decay,
         double beta1, double beta2, double eps, int mode, float grad_scale, uint32_t flags) {
        Converter conv;
        const Access grad_access = (flags & ZF_CPU_ADAMW_ZERO_GRAD) != 0 ? Access::kWrite : Access::kRead;
        const auto states = conv.states(state, "state", Access::kWrite);
        const size_t count = states.size();
        const auto sel = conv.optional_list(selected, "selected", Access::kRead);
        if (!selected.is_none()) require_length(count, sel.size(), "selected", "matrices");
        const auto g = conv.optional_list(grads, "grads", grad_access);
        if (!grads.is_none()) require_length(count, g.size(), "grads", "matrices");
        zf_tensor packed_g{}, packed_o{};
        if (!packed_grads.is_none()) packed_g = conv.tensor(packed_grads, ArgName{"packed_grads"}, grad_access);
        if (!packed_out.is_none()) packed_o = conv.tensor(packed_out, ArgName{"packed_out"}, Access::kWrite);
        require_length(count, lr.size(), "lr", "matrices");
        require_length(count, weight_decay.size(), "weight_decay", "matrices");
        const zf_adam_hparams h{beta1, beta2, eps, static_cast<zf_adam_mode>(mode)};
        conv.run([&] {
          return zf_cpu_adamw_step_skip_columns(
              states.data(), selected.is_none() ? nullptr : sel.data(), count, grads.is_none() ? nullptr : g.data(),
              packed_grads.is_none() ? nullptr : &packed_g, packed_out.is_none() ? nullptr : &packed_o, lr.data(),
              weight_decay.data(), &h, grad_scale, flags);
        });
      },
      py::arg("state"), py::arg("selected"), py::arg("grads"), py::arg("packed_grads"), py::arg("packed_out"),
      py::arg("lr"), py::arg("weight_decay"), py::arg("beta1"), py::arg("beta2"), py::arg("eps"), py::arg("mode"),
      py::arg("grad_scale"), py::arg("flags"));

  m.def(
      "cpu_accumulate",
      [](const py::object& accumulators, const py::object& selected, const py::object& packed, float scale) {
        Converter conv;
        const auto acc = conv.list(accumulators, "accumulators", Access::kWrite);
        const auto sel = conv.optional_list(selected, "selected", Access::kRead);
        if (!selected.is_none()) require_length(acc.size(), sel.size(), "selected", "accumulators");
        const zf_tensor packed_desc = conv.tensor(packed, ArgName{"packed"}, Access::kRead);
        conv.run([&] {
          return zf_cpu_accumulate(acc.data(), selected.is_none() ? nullptr : sel.data(), acc.size(), &packed_desc,
                                   scale);
        });
      },
      py::arg("accumulators"), py::arg("selected"), py::arg("packed"), py::arg("scale"));

  m.def(
      "cpu_gather_columns",
      [](const py::object& host, const py::object& columns, const py::object& out) {
        Converter conv;
        const auto host_s = conv.states(host, "host", Access::kRead);
        const auto cols = conv.list(columns, "columns", Access::kRead);
        const auto out_s = conv.states(out, "out", Access::kWrite);
        require_length(host_s.size(), cols.size(), "columns", "matrices");
        require_length(host_s.size(), out_s.size(), "out", "matrices");
        conv.run([&] { return zf_cpu_gather_columns(host_s.data(), cols.data(), host_s.size(), out_s.data()); });
      },
      py::arg("host"), py::arg("columns"), py::arg("out"));

  m.def(
      "cpu_scatter_columns",
      [](const py::object& in, const py::object& columns, const py::object& host) {
        Converter conv;
        const auto in_s = conv.states(in, "columns_state", Access::kRead);
        const auto cols = conv.list(columns, "columns", Access::kRead);
        const auto host_s = conv.states(host, "host", Access::kWrite);
        require_length(host_s.size(), cols.size(), "columns", "matrices");
        require_length(host_s.size(), in_s.size(), "columns_state", "matrices");
        conv.run([&] { return zf_cpu_scatter_columns(in_s.data(), cols.data(), host_s.size(), host_s.data()); });
      },
      py::arg("columns_state"), py::arg("columns"), py::arg("host"));
}

}  // namespace zf_py
