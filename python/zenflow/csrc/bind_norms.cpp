#include <pybind11/pybind11.h>

#include "bindings.hpp"
#include "tensor_convert.hpp"

namespace zf_py {

// column_stats(grads, col_sq, total_sq, nonfinite, accumulate, workspace, query, stream)
// With query=True nothing runs: returns the workspace bytes a CUDA call needs.
void register_norms(py::module_& m) {
  m.def(
      "column_stats",
      [](const py::sequence& grads, const py::sequence& col_sq, const py::object& total_sq, const py::object& nonfinite,
         bool accumulate, const py::object& workspace, bool query, intptr_t stream) {
        const auto grad_args = to_tensor_list(grads, "grads", Access::kRead, stream);
        const auto out_args = to_tensor_list(col_sq, "out_col_sq", Access::kWrite, stream);
        if (grad_args.size() != out_args.size()) {
          throw py::value_error("out_col_sq: has " + std::to_string(out_args.size()) + " tensors for " +
                                std::to_string(grad_args.size()) + " gradients");
        }
        const TensorArg total_arg = to_tensor(total_sq, "total_sq", Access::kWrite, stream);
        const TensorArg flag_arg = to_tensor(nonfinite, "nonfinite", Access::kWrite, stream);
        Workspace ws = to_workspace(workspace, query, stream);
        const auto grad_desc = descriptors(grad_args);
        const auto out_desc = descriptors(out_args);
        zf_status status;
        {
          py::gil_scoped_release release;
          status = zf_column_stats(grad_desc.data(), out_desc.data(), grad_desc.size(), &total_arg.tensor,
                                   &flag_arg.tensor, accumulate ? ZF_COLUMN_STATS_ACCUMULATE : 0u, ws.c_data(),
                                   ws.c_bytes(), reinterpret_cast<zf_stream>(stream));
        }
        check(status);
        return query ? ws.bytes : size_t{0};
      },
      py::arg("grads"), py::arg("col_sq"), py::arg("total_sq"), py::arg("nonfinite"), py::arg("accumulate") = false,
      py::arg("workspace") = py::none(), py::arg("query") = false, py::arg("stream") = 0);
}

}  // namespace zf_py
