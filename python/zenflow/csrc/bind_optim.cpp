#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <vector>

#include "bindings.hpp"
#include "tensor_convert.hpp"

namespace zf_py {

// adamw_selected_columns(params, grads, selected, state, lr, weight_decay, lr_tensor, beta1,
// beta2, eps, mode, grad_scale, noop, stream): see zenflow/optim.h. selected=None: dense.
// lr and weight_decay: one double per matrix (lr may be empty when lr_tensor is given);
// lr_tensor: None or f32 [count] on the device.
void register_optim(py::module_& m) {
  m.def(
      "adamw_selected_columns",
      [](const py::object& params, const py::object& grads, const py::object& selected, const py::object& state,
         const std::vector<double>& lr, const std::vector<double>& weight_decay, const py::object& lr_tensor,
         double beta1, double beta2, double eps, int mode, const py::object& grad_scale, const py::object& noop,
         intptr_t stream) {
        Converter conv(stream);
        const auto param_desc = conv.list(params, "params", Access::kWrite);
        const auto grad_desc = conv.list(grads, "grads", Access::kRead);
        const auto selected_desc = conv.optional_list(selected, "selected", Access::kRead);
        const auto states = conv.states(state, "state", Access::kWrite);
        const size_t count = param_desc.size();
        require_length(count, grad_desc.size(), "grads", "params");
        if (!selected.is_none()) require_length(count, selected_desc.size(), "selected", "params");
        require_length(count, states.size(), "state", "params");
        // An empty lr with an lr_tensor: the device array alone gives the learning rates.
        const bool lr_from_tensor = lr.empty() && !lr_tensor.is_none();
        if (!lr_from_tensor) require_length(count, lr.size(), "lr", "params");
        require_length(count, weight_decay.size(), "weight_decay", "params");
        zf_tensor lr_desc{}, scale_desc{}, noop_desc{};
        if (!lr_tensor.is_none()) lr_desc = conv.tensor(lr_tensor, ArgName{"lr_tensor"}, Access::kRead);
        if (!grad_scale.is_none()) scale_desc = conv.tensor(grad_scale, ArgName{"grad_scale"}, Access::kRead);
        if (!noop.is_none()) noop_desc = conv.tensor(noop, ArgName{"noop"}, Access::kRead);
        const zf_adam_hparams hparams{beta1, beta2, eps, static_cast<zf_adam_mode>(mode)};
        conv.run([&] {
          return zf_adamw_selected_columns(
              param_desc.data(), grad_desc.data(), selected.is_none() ? nullptr : selected_desc.data(), states.data(),
              count, lr_from_tensor ? nullptr : lr.data(), weight_decay.data(),
              lr_tensor.is_none() ? nullptr : &lr_desc, &hparams, grad_scale.is_none() ? nullptr : &scale_desc,
              noop.is_none() ? nullptr : &noop_desc, reinterpret_cast<zf_stream>(stream));
        });
      },
      py::arg("params"), py::arg("grads"), py::arg("selected"), py::arg("state"), py::arg("lr"),
      py::arg("weight_decay"), py::arg("lr_tensor"), py::arg("beta1"), py::arg("beta2"), py::arg("eps"),
      py::arg("mode"), py::arg("grad_scale") = py::none(), py::arg("noop") = py::none(), py::arg("stream") = 0);
}

}  // namespace zf_py
