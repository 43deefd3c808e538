#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "bindings.hpp"
#include "tensor_convert.hpp"

namespace zf_py {

namespace {

// The [rows, cols] view the pack ops take of a matrix (pack.h): 1-D [n] reads as [1, n],
// more dimensions as [shape[0], rest].
void matrix_view(const zf_tensor& t, int64_t& rows, int64_t& cols) {
  if (t.ndim == 0) {
    rows = cols = 1;
  } else if (t.ndim == 1) {
    rows = 1;
    cols = t.shape[0];
  } else {
    rows = t.shape[0];
    cols = 1;
    for (int d = 1; d < t.ndim; ++d) cols *= t.shape[d];
  }
}

// zf_packed_layout of the given sizes: count + 1 offsets, the last one the total.
std::vector<int64_t> packed_layout(const std::vector<int64_t>& rows, const std::vector<int64_t>& cols,
                                   const std::vector<int64_t>& ks) {
  std::vector<int64_t> offsets(rows.size() + 1);
  zf_status status;
  {
    py::gil_scoped_release release;
    status = zf_packed_layout(rows.data(), cols.data(), ks.data(), rows.size(), offsets.data());
  }
  check(status);
  return offsets;
}

// The four lists both forms of the exchange take (old and new selections and compact states),
// converted in argument order; check_lengths() once the call's other arguments are converted.
struct ExchangeLists {
  std::vector<zf_tensor> old_selected, new_selected;
  std::vector<zf_column_state> old_state, new_state;

  ExchangeLists(Converter& conv, const py::object& old_sel, const py::object& new_sel, const py::object& old_st,
                const py::object& new_st)
      : old_selected(conv.list(old_sel, "old_selected", Access::kRead)),
        new_selected(conv.list(new_sel, "new_selected", Access::kRead)),
        old_state(conv.states(old_st, "old_state", Access::kRead)),
        new_state(conv.states(new_st, "new_state", Access::kWrite)) {}

  size_t count() const { return old_selected.size(); }
  bool on_cuda() const { return old_selected[0].device.type == ZF_DEVICE_CUDA; }
  void check_lengths() const {
    require_length(count(), new_selected.size(), "new_selected", "matrices");
    require_length(count(), old_state.size(), "old_state", "matrices");
    require_length(count(), new_state.size(), "new_state", "matrices");
  }
};

}  // namespace

// packed_layout / pack_columns / scatter_columns / exchange_selected_columns: see zenflow/pack.h.
void register_pack(py::module_& m) {
  m.def(
      "packed_layout",
      [](const std::vector<int64_t>& rows, const std::vector<int64_t>& cols, const std::vector<int64_t>& ks) {
        require_length(rows.size(), cols.size(), "cols", "matrices");
        require_length(rows.size(), ks.size(), "ks", "matrices");
        return packed_layout(rows, cols, ks);
      },
      py::arg("rows"), py::arg("cols"), py::arg("ks"));

  // packed: the output buffer, or None to have `allocate(total_elements)` create it (the size
  // comes from the packed layout of the converted matrices). Returns the buffer.
  m.def(
      "pack_columns",
      [](const py::object& grads, const py::object& selected, py::object packed, const py::object& allocate,
         const py::object& scale, intptr_t stream) {
        Converter conv(stream);
        const auto grad_desc = conv.list(grads, "grads", Access::kRead);
        const auto selected_desc = conv.optional_list(selected, "selected", Access::kRead);
        if (!selected.is_none()) require_length(grad_desc.size(), selected_desc.size(), "selected", "matrices");
        if (packed.is_none()) {
          std::vector<int64_t> rows(grad_desc.size()), cols(grad_desc.size()), ks(grad_desc.size(), 0);
          for (size_t i = 0; i < grad_desc.size(); ++i) {
            matrix_view(grad_desc[i], rows[i], cols[i]);
            if (!selected_desc.empty()) {
              const zf_tensor& sel = selected_desc[i];
              ks[i] = sel.ndim == 1 ? sel.shape[0] : 0;  // a bad shape is reported by the C call
            }
          }
          packed = allocate(packed_layout(rows, cols, ks).back());
        }
        const zf_tensor packed_desc = conv.tensor(packed, ArgName{"packed"}, Access::kWrite);
        zf_tensor scale_desc{};
        if (!scale.is_none()) scale_desc = conv.tensor(scale, ArgName{"scale"}, Access::kRead);
        conv.run([&] {
          return zf_pack_columns(grad_desc.data(), selected.is_none() ? nullptr : selected_desc.data(),
                                 grad_desc.size(), &packed_desc, scale.is_none() ? nullptr : &scale_desc,
                                 reinterpret_cast<zf_stream>(stream));
        });
        return packed;
      },
      py::arg("grads"), py::arg("selected"), py::arg("packed"), py::arg("allocate") = py::none(),
      py::arg("scale") = py::none(), py::arg("stream") = 0);

  m.def(
      "scatter_columns",
      [](const py::object& packed, const py::object& params, const py::object& selected, intptr_t stream) {
        Converter conv(stream);
        const zf_tensor packed_desc = conv.tensor(packed, ArgName{"packed"}, Access::kRead);
        const auto param_desc = conv.list(params, "params", Access::kWrite);
        const auto selected_desc = conv.optional_list(selected, "selected", Access::kRead);
        if (!selected.is_none()) require_length(param_desc.size(), selected_desc.size(), "selected", "params");
        conv.run([&] {
          return zf_scatter_columns(&packed_desc, param_desc.data(),
                                    selected.is_none() ? nullptr : selected_desc.data(), param_desc.size(),
                                    reinterpret_cast<zf_stream>(stream));
        });
      },
      py::arg("packed"), py::arg("params"), py::arg("selected"), py::arg("stream") = 0);

  m.def(
      "exchange_selected_columns",
      [](const py::object& old_selected, const py::object& new_selected, const py::object& old_state,
         const py::object& new_state, const py::object& entering, const py::object& leaving, const py::object& allocate,
         intptr_t stream) {
        Converter conv(stream);
        const ExchangeLists lists(conv, old_selected, new_selected, old_state, new_state);
        const auto in_s = conv.states(entering, "entering", Access::kRead);
        const auto out_s = conv.states(leaving, "leaving", Access::kWrite);
        const size_t count = lists.count();
        lists.check_lengths();
        require_length(count, in_s.size(), "entering", "matrices");
        require_length(count, out_s.size(), "leaving", "matrices");
        if (count == 0) return size_t{0};
        return run_with_workspace(conv, lists.on_cuda(), allocate, [&](void* ws, size_t* bytes) {
          return zf_exchange_selected_columns(lists.old_selected.data(), lists.new_selected.data(),
                                              lists.old_state.data(), lists.new_state.data(), in_s.data(), out_s.data(),
                                              count, ws, bytes, reinterpret_cast<zf_stream>(stream));
        });
      },
      py::arg("old_selected"), py::arg("new_selected"), py::arg("old_state"), py::arg("new_state"), py::arg("entering"),
      py::arg("leaving"), py::arg("allocate") = py::none(), py::arg("stream") = 0);

  // The packed form: `entering` and `leaving` are one state each for all matrices, cut by the
  // per-matrix column counts (zf_exchange_selected_columns_packed).
  m.def(
      "exchange_selected_columns_packed",
      [](const py::object& old_selected, const py::object& new_selected, const py::object& old_state,
         const py::object& new_state, const std::vector<int64_t>& entering_counts, const py::object& entering,
         const std::vector<int64_t>& leaving_counts, const py::object& leaving, const py::object& allocate,
         intptr_t stream) {
        Converter conv(stream);
        const ExchangeLists lists(conv, old_selected, new_selected, old_state, new_state);
        const zf_column_state in_s = conv.state(entering, "entering", -1, Access::kRead);
        const zf_column_state out_s = conv.state(leaving, "leaving", -1, Access::kWrite);
        const size_t count = lists.count();
        lists.check_lengths();
        require_length(count, entering_counts.size(), "entering_counts", "matrices");
        require_length(count, leaving_counts.size(), "leaving_counts", "matrices");
        if (count == 0) return size_t{0};
        return run_with_workspace(conv, lists.on_cuda(), allocate, [&](void* ws, size_t* bytes) {
          return zf_exchange_selected_columns_packed(lists.old_selected.data(), lists.new_selected.data(),
                                                     lists.old_state.data(), lists.new_state.data(),
                                                     entering_counts.data(), &in_s, leaving_counts.data(), &out_s,
                                                     count, ws, bytes, reinterpret_cast<zf_stream>(stream));
        });
      },
      py::arg("old_selected"), py::arg("new_selected"), py::arg("old_state"), py::arg("new_state"),
      py::arg("entering_counts"), py::arg("entering"), py::arg("leaving_counts"), py::arg("leaving"),
      py::arg("allocate") = py::none(), py::arg("stream") = 0);
}

}  // namespace zf_py
