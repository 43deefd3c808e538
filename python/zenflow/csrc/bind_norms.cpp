#include <pybind11/pybind11.h>

#include "bindings.hpp"
#include "tensor_convert.hpp"

namespace zf_py {

// column_stats(grads, out_col_sq, total_sq, nonfinite, accumulate, allocate, stream): see
// zenflow/norms.h. Every tensor is converted once; a CUDA call queries its workspace and
// gets it from `allocate(bytes)`.
void register_norms(py::module_& m) {
  m.def(
      "column_stats",
      [](const py::object& grads, const py::object& col_sq, const py::object& total_sq, const py::object& nonfinite,
         bool accumulate, const py::object& allocate, intptr_t stream) {
        Converter conv(stream);
        const auto grad_desc = conv.list(grads, "grads", Access::kRead);
        const auto out_desc = conv.list(col_sq, "out_col_sq", Access::kWrite);
        require_length(grad_desc.size(), out_desc.size(), "out_col_sq", "gradients");
        const zf_tensor total = conv.tensor(total_sq, ArgName{"total_sq"}, Access::kWrite);
        const zf_tensor flag = conv.tensor(nonfinite, ArgName{"nonfinite"}, Access::kWrite);
        const uint32_t flags = accumulate ? ZF_COLUMN_STATS_ACCUMULATE : 0u;
        return run_with_workspace(conv, total.device.type == ZF_DEVICE_CUDA, allocate, [&](void* ws, size_t* bytes) {
          return zf_column_stats(grad_desc.data(), out_desc.data(), grad_desc.size(), &total, &flag, flags, ws, bytes,
                                 reinterpret_cast<zf_stream>(stream));
        });
      },
      py::arg("grads"), py::arg("out_col_sq"), py::arg("total_sq"), py::arg("nonfinite"), py::arg("accumulate") = false,
      py::arg("allocate") = py::none(), py::arg("stream") = 0);
}

}  // namespace zf_py
