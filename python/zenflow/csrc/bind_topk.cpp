#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "tensor_convert.hpp"

namespace zf_py {

// select_topk_columns(col_sq, out_indices, ks, allocate, stream): see zenflow/topk.h.
// ks: the counts the caller asked for (or None). The C call takes k_i from the length of
// out_indices[i]; a caller-given buffer whose length is not the asked k is an error here.
void register_topk(py::module_& m) {
  m.def(
      "select_topk_columns",
      [](const py::object& scores, const py::object& out_indices, const std::optional<std::vector<int64_t>>& ks,
         const py::object& allocate, intptr_t stream) {
        Converter conv(stream);
        const auto score_desc = conv.list(scores, "col_sq", Access::kRead);
        const auto out_desc = conv.list(out_indices, "out_indices", Access::kWrite);
        require_length(score_desc.size(), out_desc.size(), "out_indices", "score vectors");
        if (ks) {
          require_length(score_desc.size(), ks->size(), "k", "score vectors");
          for (size_t i = 0; i < out_desc.size(); ++i) {
            const zf_tensor& out = out_desc[i];
            const int64_t k = (*ks)[i];
            const zf_tensor& score = score_desc[i];
            if (score.ndim == 1 && (k < 0 || k > score.shape[0])) {
              throw py::value_error("k: " + std::to_string(k) + " is outside [0, " + std::to_string(score.shape[0]) +
                                    "] for col_sq[" + std::to_string(i) + "]");
            }
            if (out.ndim != 1 || out.shape[0] != k) {
              const std::string len = out.ndim == 1 ? std::to_string(out.shape[0]) : std::to_string(out.ndim) + "-D";
              throw py::value_error("out_indices[" + std::to_string(i) + "]: has " + len + " entries, but k is " +
                                    std::to_string(k));
            }
          }
        }
        if (score_desc.empty()) return size_t{0};
        return run_with_workspace(conv, score_desc[0].device.type == ZF_DEVICE_CUDA, allocate,
                                  [&](void* ws, size_t* bytes) {
                                    return zf_select_topk_columns(score_desc.data(), out_desc.data(), score_desc.size(),
                                                                  ws, bytes, reinterpret_cast<zf_stream>(stream));
                                  });
      },
      py::arg("col_sq"), py::arg("out_indices"), py::arg("ks") = py::none(), py::arg("allocate") = py::none(),
      py::arg("stream") = 0);
}

}  // namespace zf_py
