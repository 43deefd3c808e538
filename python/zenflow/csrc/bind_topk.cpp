#include <pybind11/pybind11.h>

#include "bindings.hpp"
#include "tensor_convert.hpp"

namespace zf_py {

// select_topk_columns(scores, out_indices, workspace, query, stream): see zenflow/topk.h.
void register_topk(py::module_& m) {
  m.def(
      "select_topk_columns",
      [](const py::sequence& scores, const py::sequence& out_indices, const py::object& workspace, bool query,
         intptr_t stream) {
        const auto score_args = to_tensor_list(scores, "col_sq", Access::kRead, stream);
        const auto out_args = to_tensor_list(out_indices, "out_indices", Access::kWrite, stream);
        if (score_args.size() != out_args.size()) {
          throw py::value_error("out_indices: has " + std::to_string(out_args.size()) + " tensors for " +
                                std::to_string(score_args.size()) + " score vectors");
        }
        Workspace ws = to_workspace(workspace, query, stream);
        const auto score_desc = descriptors(score_args);
        const auto out_desc = descriptors(out_args);
        zf_status status;
        {
          py::gil_scoped_release release;
          status = zf_select_topk_columns(score_desc.data(), out_desc.data(), score_desc.size(), ws.c_data(),
                                          ws.c_bytes(), reinterpret_cast<zf_stream>(stream));
        }
        check(status);
        return query ? ws.bytes : size_t{0};
      },
      py::arg("scores"), py::arg("out_indices"), py::arg("workspace") = py::none(), py::arg("query") = false,
      py::arg("stream") = 0);
}

}  // namespace zf_py
