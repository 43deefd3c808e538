#include <pybind11/pybind11.h>

#include <vector>

#include "bindings.hpp"
#include "column_state_args.hpp"
#include "tensor_convert.hpp"

namespace zf_py {

namespace {
std::vector<TensorArg> optional_list(const py::object& obj, const std::string& name, intptr_t stream) {
  if (obj.is_none()) return {};
  return to_tensor_list(obj, name, Access::kRead, stream);
}
}  // namespace

// pack_columns / scatter_columns / exchange_selected_columns: see zenflow/pack.h.
void register_pack(py::module_& m) {
  m.def(
      "pack_columns",
      [](const py::sequence& grads, const py::object& selected, const py::object& packed, const py::object& scale,
         intptr_t stream) {
        const auto grad_args = to_tensor_list(grads, "grads", Access::kRead, stream);
        const auto selected_args = optional_list(selected, "selected", stream);
        if (!selected.is_none() && selected_args.size() != grad_args.size())
          throw py::value_error("selected: length differs from grads");
        const TensorArg packed_arg = to_tensor(packed, "packed", Access::kWrite, stream);
        TensorArg scale_arg;
        if (!scale.is_none()) scale_arg = to_tensor(scale, "scale", Access::kRead, stream);
        const auto grad_desc = descriptors(grad_args), selected_desc = descriptors(selected_args);
        zf_status status;
        {
          py::gil_scoped_release release;
          status = zf_pack_columns(grad_desc.data(), selected.is_none() ? nullptr : selected_desc.data(),
                                   grad_desc.size(), &packed_arg.tensor, scale.is_none() ? nullptr : &scale_arg.tensor,
                                   reinterpret_cast<zf_stream>(stream));
        }
        check(status);
      },
      py::arg("grads"), py::arg("selected"), py::arg("packed"), py::arg("scale") = py::none(), py::arg("stream") = 0);

  m.def(
      "scatter_columns",
      [](const py::object& packed, const py::sequence& params, const py::object& selected, intptr_t stream) {
        const TensorArg packed_arg = to_tensor(packed, "packed", Access::kRead, stream);
        const auto param_args = to_tensor_list(params, "params", Access::kWrite, stream);
        const auto selected_args = optional_list(selected, "selected", stream);
        if (!selected.is_none() && selected_args.size() != param_args.size())
          throw py::value_error("selected: length differs from params");
        const auto param_desc = descriptors(param_args), selected_desc = descriptors(selected_args);
        zf_status status;
        {
          py::gil_scoped_release release;
          status = zf_scatter_columns(&packed_arg.tensor, param_desc.data(),
                                      selected.is_none() ? nullptr : selected_desc.data(), param_desc.size(),
                                      reinterpret_cast<zf_stream>(stream));
        }
        check(status);
      },
      py::arg("packed"), py::arg("params"), py::arg("selected"), py::arg("stream") = 0);

  m.def(
      "exchange_selected_columns",
      [](const py::sequence& old_selected, const py::sequence& new_selected, const py::sequence& old_state,
         const py::sequence& new_state, const py::sequence& entering, const py::sequence& leaving,
         const py::object& workspace, bool query, intptr_t stream) {
        const auto old_args = to_tensor_list(old_selected, "old_selected", Access::kRead, stream);
        const auto new_args = to_tensor_list(new_selected, "new_selected", Access::kRead, stream);
        const StateArgs old_s = to_state_list(old_state, "old_state", Access::kRead, stream);
        const StateArgs new_s = to_state_list(new_state, "new_state", Access::kWrite, stream);
        const StateArgs in_s = to_state_list(entering, "entering", Access::kRead, stream);
        const StateArgs out_s = to_state_list(leaving, "leaving", Access::kWrite, stream);
        const size_t count = old_args.size();
        if (new_args.size() != count || old_s.states.size() != count || new_s.states.size() != count ||
            in_s.states.size() != count || out_s.states.size() != count) {
          throw py::value_error("exchange_selected_columns: argument lists differ in length");
        }
        Workspace ws = to_workspace(workspace, query, stream);
        const auto old_desc = descriptors(old_args), new_desc = descriptors(new_args);
        zf_status status;
        {
          py::gil_scoped_release release;
          status = zf_exchange_selected_columns(old_desc.data(), new_desc.data(), old_s.states.data(),
                                                new_s.states.data(), in_s.states.data(), out_s.states.data(), count,
                                                ws.c_data(), ws.c_bytes(), reinterpret_cast<zf_stream>(stream));
        }
        check(status);
        return query ? ws.bytes : size_t{0};
      },
      py::arg("old_selected"), py::arg("new_selected"), py::arg("old_state"), py::arg("new_state"), py::arg("entering"),
      py::arg("leaving"), py::arg("workspace") = py::none(), py::arg("query") = false, py::arg("stream") = 0);
}

}  // namespace zf_py
