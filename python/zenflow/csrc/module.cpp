// zenflow._C: the thin pybind11 layer. Each op family registers itself from its own file.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "tensor_convert.hpp"

namespace zf_py {

static void register_runtime(py::module_& m) {
  m.def("version", [] { return std::string(zf_version()); });
  m.def("simd_level_supported", [] { return std::string(zf_simd_level_name(zf_simd_level_supported())); });
  m.def("simd_level_active", [] { return std::string(zf_simd_level_name(zf_simd_level_active())); });
  m.def("simd_environment_warning", [] { return std::string(zf_simd_environment_warning()); });
  m.def(
      "set_simd_level",
      [](const std::string& level) {
        for (int l = ZF_SIMD_SCALAR; l <= ZF_SIMD_AVX512; ++l) {
          if (level == zf_simd_level_name(static_cast<zf_simd_level>(l))) {
            check(zf_set_simd_level(static_cast<zf_simd_level>(l)));
            return;
          }
        }
        throw py::value_error("level: expected 'scalar', 'avx2' or 'avx512', got '" + level + "'");
      },
      py::arg("level"));
  m.def("get_num_threads", [] { return zf_get_num_threads(); });
  m.def(
      "set_num_threads",
      [](int num_threads, const std::vector<int>& cores) {
        zf_status status;
        {
          py::gil_scoped_release release;  // waits for kernels running on the old pool
          status =
              zf_set_num_threads(num_threads, cores.empty() ? nullptr : cores.data(), static_cast<int>(cores.size()));
        }
        check(status);
      },
      py::arg("num_threads"), py::arg("cores") = std::vector<int>{});
  m.def("host_cpu_count", [] { return zf_host_cpu_count(); });
  m.def("cuda_compiled", [] { return zf_cuda_compiled() != 0; });
  m.def("cuda_architectures", [] { return std::string(zf_cuda_architectures()); });
  m.def("cuda_device_count", [] { return zf_cuda_device_count(); });
  m.def(
      "cuda_device_name",
      [](int index) {
        char name[256];
        check(zf_cuda_device_name(index, name, sizeof(name)));
        return std::string(name);
      },
      py::arg("index"));
}

}  // namespace zf_py

PYBIND11_MODULE(_C, m) {
  m.doc() = "zenflow native bindings (see zenflow.ops for the public API)";
  zf_py::register_runtime(m);
  zf_py::register_norms(m);
  zf_py::register_topk(m);
  zf_py::register_optim(m);
  zf_py::register_pack(m);
  zf_py::register_cpu_adamw(m);
  zf_py::register_engine(m);
}
