#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <vector>

#include "bindings.hpp"
#include "column_state_args.hpp"
#include "tensor_convert.hpp"

namespace zf_py {

namespace {

zf_tensor empty_descriptor(const zf_tensor& like) {
  zf_tensor t{};
  t.dtype = ZF_DTYPE_F32;
  t.device = like.device;
  t.ndim = 1;
  t.strides[0] = 1;
  return t;  // shape [0]: "no master"
}

}  // namespace

StateArgs to_state_list(const py::sequence& seq, const std::string& name, Access access, intptr_t stream) {
  StateArgs out;
  out.keep.reserve(seq.size() * 4);
  for (size_t i = 0; i < seq.size(); ++i) {
    const std::string item = name + "[" + std::to_string(i) + "]";
    const py::sequence parts = py::reinterpret_borrow<py::sequence>(seq[i]);
    if (parts.size() != 4) throw py::value_error(item + ": expected (master, exp_avg, exp_avg_sq, steps)");
    zf_column_state s{};
    out.keep.push_back(to_tensor(parts[1], item + ".exp_avg", access, stream));
    s.exp_avg = out.keep.back().tensor;
    out.keep.push_back(to_tensor(parts[2], item + ".exp_avg_sq", access, stream));
    s.exp_avg_sq = out.keep.back().tensor;
    out.keep.push_back(to_tensor(parts[3], item + ".steps", access, stream));
    s.steps = out.keep.back().tensor;
    if (parts[0].is_none()) {
      s.master = empty_descriptor(s.exp_avg);
    } else {
      out.keep.push_back(to_tensor(parts[0], item + ".master", access, stream));
      s.master = out.keep.back().tensor;
    }
    out.states.push_back(s);
  }
  return out;
}

// adamw_selected_columns(params, grads, selected, state, lr, weight_decay, beta1, beta2,
// eps, grad_scale, noop, stream): see zenflow/optim.h. selected=None: dense.
void register_optim(py::module_& m) {
  m.def(
      "adamw_selected_columns",
      [](const py::sequence& params, const py::sequence& grads, const py::object& selected, const py::sequence& state,
         const std::vector<double>& lr, const std::vector<double>& weight_decay, double beta1, double beta2, double eps,
         const py::object& grad_scale, const py::object& noop, intptr_t stream) {
        const auto param_args = to_tensor_list(params, "params", Access::kWrite, stream);
        const auto grad_args = to_tensor_list(grads, "grads", Access::kRead, stream);
        std::vector<TensorArg> selected_args;
        if (!selected.is_none()) selected_args = to_tensor_list(selected, "selected", Access::kRead, stream);
        const StateArgs state_args = to_state_list(state, "state", Access::kWrite, stream);
        const size_t count = param_args.size();
        if (grad_args.size() != count || state_args.states.size() != count || lr.size() != count ||
            weight_decay.size() != count || (!selected.is_none() && selected_args.size() != count)) {
          throw py::value_error(
              "adamw_selected_columns: params, grads, selected, state, lr and weight_decay differ "
              "in length");
        }
        TensorArg scale_arg, noop_arg;
        if (!grad_scale.is_none()) scale_arg = to_tensor(grad_scale, "grad_scale", Access::kRead, stream);
        if (!noop.is_none()) noop_arg = to_tensor(noop, "noop", Access::kRead, stream);
        const auto param_desc = descriptors(param_args), grad_desc = descriptors(grad_args);
        const auto selected_desc = descriptors(selected_args);
        zf_status status;
        {
          py::gil_scoped_release release;
          status = zf_adamw_selected_columns(
              param_desc.data(), grad_desc.data(), selected.is_none() ? nullptr : selected_desc.data(),
              state_args.states.data(), lr.data(), weight_decay.data(), count, zf_adamw_options{beta1, beta2, eps},
              grad_scale.is_none() ? nullptr : &scale_arg.tensor, noop.is_none() ? nullptr : &noop_arg.tensor,
              reinterpret_cast<zf_stream>(stream));
        }
        check(status);
      },
      py::arg("params"), py::arg("grads"), py::arg("selected"), py::arg("state"), py::arg("lr"),
      py::arg("weight_decay"), py::arg("beta1"), py::arg("beta2"), py::arg("eps"), py::arg("grad_scale") = py::none(),
      py::arg("noop") = py::none(), py::arg("stream") = 0);
}

}  // namespace zf_py
