#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <vector>

#include "bindings.hpp"
#include "tensor_convert.hpp"

namespace zf_py {

namespace {

// An optional list argument: None becomes an empty list (a NULL array at the C ABI).
std::vector<TensorArg> optional_list(const py::object& seq, const std::string& name, Access access) {
  if (seq.is_none()) return {};
  return to_tensor_list(seq, name, access, 0);
}

void require_length(size_t expected, size_t got, const std::string& name) {
  if (got != expected) {
    throw py::value_error(name + ": has " + std::to_string(got) + " entries for " + std::to_string(expected) +
                          " params");
  }
}

const zf_tensor* optional_data(const std::vector<zf_tensor>& list) { return list.empty() ? nullptr : list.data(); }

zf_adam_hparams make_hparams(double lr, double beta1, double beta2, double eps, double weight_decay, bool adamw) {
  return zf_adam_hparams{lr, beta1, beta2, eps, weight_decay, adamw ? ZF_ADAM_MODE_ADAMW : ZF_ADAM_MODE_ADAM};
}

// The four state lists every step takes, converted and checked for equal lengths.
struct StepLists {
  std::vector<TensorArg> params, exp_avgs, exp_avg_sqs, grads, out_params;
  StepLists(const py::sequence& p, const py::sequence& m, const py::sequence& v, const py::sequence& g,
            const py::object& out, bool zero_grad)
      : params(to_tensor_list(p, "params", Access::kWrite, 0)),
        exp_avgs(to_tensor_list(m, "exp_avgs", Access::kWrite, 0)),
        exp_avg_sqs(to_tensor_list(v, "exp_avg_sqs", Access::kWrite, 0)),
        grads(to_tensor_list(g, "grads", zero_grad ? Access::kWrite : Access::kRead, 0)),
        out_params(optional_list(out, "out_params", Access::kWrite)) {
    require_length(params.size(), exp_avgs.size(), "exp_avgs");
    require_length(params.size(), exp_avg_sqs.size(), "exp_avg_sqs");
    require_length(params.size(), grads.size(), "grads");
    if (!out_params.empty()) require_length(params.size(), out_params.size(), "out_params");
  }
};

}  // namespace

// The host optimizer (zenflow/cpu_adam.h). CPU tensors only; the GIL is released while the
// pool computes.
void register_cpu_adam(py::module_& m) {
  m.def(
      "cpu_adamw_step",
      [](const py::sequence& params, const py::sequence& exp_avgs, const py::sequence& exp_avg_sqs,
         const py::sequence& grads, const py::object& out_params, const std::vector<int64_t>& steps, double lr,
         double beta1, double beta2, double eps, double weight_decay, bool adamw, float grad_scale, bool zero_grad) {
        const StepLists lists(params, exp_avgs, exp_avg_sqs, grads, out_params, zero_grad);
        require_length(lists.params.size(), steps.size(), "steps");
        const auto p = descriptors(lists.params), mo = descriptors(lists.exp_avgs), v = descriptors(lists.exp_avg_sqs),
                   g = descriptors(lists.grads), out = descriptors(lists.out_params);
        const zf_adam_hparams h = make_hparams(lr, beta1, beta2, eps, weight_decay, adamw);
        zf_status status;
        {
          py::gil_scoped_release release;
          status = zf_cpu_adamw_step(p.data(), mo.data(), v.data(), g.data(), optional_data(out), steps.data(),
                                     p.size(), &h, grad_scale, zero_grad ? ZF_CPU_ADAM_ZERO_GRAD : 0u);
        }
        check(status);
      },
      py::arg("params"), py::arg("exp_avgs"), py::arg("exp_avg_sqs"), py::arg("grads"), py::arg("out_params"),
      py::arg("steps"), py::arg("lr"), py::arg("beta1"), py::arg("beta2"), py::arg("eps"), py::arg("weight_decay"),
      py::arg("adamw"), py::arg("grad_scale"), py::arg("zero_grad"));

  m.def(
      "cpu_adamw_step_skip_columns",
      [](const py::sequence& params, const py::sequence& exp_avgs, const py::sequence& exp_avg_sqs,
         const py::sequence& grads, const py::object& out_params, const py::object& selected,
         const py::object& column_steps, const std::optional<std::vector<int64_t>>& steps, double lr, double beta1,
         double beta2, double eps, double weight_decay, bool adamw, float grad_scale, bool zero_grad,
         bool increment_steps) {
        const StepLists lists(params, exp_avgs, exp_avg_sqs, grads, out_params, zero_grad);
        const auto selected_args = optional_list(selected, "selected", Access::kRead);
        const auto count_args = optional_list(column_steps, "column_steps", Access::kWrite);
        const size_t count = lists.params.size();
        if (!selected_args.empty()) require_length(count, selected_args.size(), "selected");
        if (!count_args.empty()) require_length(count, count_args.size(), "column_steps");
        if (steps) require_length(count, steps->size(), "steps");
        const auto p = descriptors(lists.params), mo = descriptors(lists.exp_avgs), v = descriptors(lists.exp_avg_sqs),
                   g = descriptors(lists.grads), out = descriptors(lists.out_params), sel = descriptors(selected_args),
                   counts = descriptors(count_args);
        const zf_adam_hparams h = make_hparams(lr, beta1, beta2, eps, weight_decay, adamw);
        const uint32_t flags =
            (zero_grad ? ZF_CPU_ADAM_ZERO_GRAD : 0u) | (increment_steps ? ZF_CPU_ADAM_INCREMENT_STEPS : 0u);
        zf_status status;
        {
          py::gil_scoped_release release;
          status = zf_cpu_adamw_step_skip_columns(p.data(), mo.data(), v.data(), g.data(), optional_data(out),
                                                  optional_data(sel), optional_data(counts),
                                                  steps ? steps->data() : nullptr, count, &h, grad_scale, flags);
        }
        check(status);
      },
      py::arg("params"), py::arg("exp_avgs"), py::arg("exp_avg_sqs"), py::arg("grads"), py::arg("out_params"),
      py::arg("selected"), py::arg("column_steps"), py::arg("steps"), py::arg("lr"), py::arg("beta1"), py::arg("beta2"),
      py::arg("eps"), py::arg("weight_decay"), py::arg("adamw"), py::arg("grad_scale"), py::arg("zero_grad"),
      py::arg("increment_steps"));

  m.def(
      "cpu_accumulate",
      [](const py::sequence& accumulators, const py::sequence& blocks, const py::object& selected, float scale) {
        const auto acc_args = to_tensor_list(accumulators, "accumulators", Access::kWrite, 0);
        const auto block_args = to_tensor_list(blocks, "blocks", Access::kRead, 0);
        const auto selected_args = optional_list(selected, "selected", Access::kRead);
        require_length(acc_args.size(), block_args.size(), "blocks");
        if (!selected_args.empty()) require_length(acc_args.size(), selected_args.size(), "selected");
        const auto acc = descriptors(acc_args), block = descriptors(block_args), sel = descriptors(selected_args);
        zf_status status;
        {
          py::gil_scoped_release release;
          status = zf_cpu_accumulate(acc.data(), block.data(), optional_data(sel), acc.size(), scale);
        }
        check(status);
      },
      py::arg("accumulators"), py::arg("blocks"), py::arg("selected"), py::arg("scale"));
}

}  // namespace zf_py
