// zenflow._C: the thin pybind11 layer. Each op family registers itself from its own file.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "bindings.hpp"
#include "tensor_convert.hpp"

namespace zf_py {

namespace {

// The OpenMP runtime the framework loaded, reached through the GNU OpenMP ABI, which
// libgomp exports and LLVM's and Intel's runtimes provide too: GOMP_parallel runs fn(data)
// on every thread of a new team, the calling thread included, and returns when all have.
struct OpenMpRuntime {
  void (*parallel)(void (*fn)(void*), void* data, unsigned num_threads, unsigned flags);
  int (*thread_num)();
  int (*num_threads)();
};

struct OpenMpRegion {
  const OpenMpRuntime* runtime;
  zf_parallel_body body;
  void* body_context;
};

void openmp_team_member(void* data) {
  const auto* region = static_cast<const OpenMpRegion*>(data);
  region->body(region->body_context, region->runtime->thread_num(), region->runtime->num_threads());
}

void run_on_openmp(void* context, zf_parallel_body body, void* body_context, int num_threads) {
  const auto* runtime = static_cast<const OpenMpRuntime*>(context);
  OpenMpRegion region{runtime, body, body_context};
  runtime->parallel(&openmp_team_member, &region, static_cast<unsigned>(num_threads), 0);
}

template <typename Function>
Function function_at(uintptr_t address, const char* name) {
  if (address == 0) throw py::value_error(std::string(name) + ": expected the address of the function, got 0");
  return reinterpret_cast<Function>(address);
}

// The value named `name` among `choices` (name, value); else ValueError naming `what` and
// the names it takes.
template <class T>
T named(const std::string& name, std::initializer_list<std::pair<const char*, T>> choices, const std::string& what) {
  std::string names;
  for (const auto& [choice, value] : choices) {
    if (name == choice) return value;
    names += (names.empty() ? "'" : ", '") + std::string(choice) + "'";
  }
  throw py::value_error(what + " must be one of " + names + ", got '" + name + "'");
}

}  // namespace

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
  m.def(
      "host_stream_bandwidth",
      [](const std::vector<std::pair<std::string, std::string>>& streams, int64_t elements, int threads,
         int repetitions) {
        // (dtype, access) names -> zf_stream_spec; the engine checks everything else.
        std::vector<zf_stream_spec> specs;
        for (size_t s = 0; s < streams.size(); ++s) {
          const auto& [dtype, access] = streams[s];
          const std::string where = "streams[" + std::to_string(s) + "]: ";
          zf_stream_spec spec{};
          spec.dtype = named<zf_dtype>(
              dtype, {{"float32", ZF_DTYPE_F32}, {"bfloat16", ZF_DTYPE_BF16}, {"float16", ZF_DTYPE_F16}},
              where + "dtype");
          spec.access = named<zf_stream_access>(
              access, {{"read", ZF_STREAM_READ}, {"write", ZF_STREAM_WRITE}, {"read_write", ZF_STREAM_READ_WRITE}},
              where + "access");
          specs.push_back(spec);
        }
        double bytes_per_second = 0.0;
        zf_status status;
        {
          py::gil_scoped_release release;
          status = zf_host_stream_bandwidth(specs.empty() ? nullptr : specs.data(), specs.size(), elements, threads,
                                            repetitions, &bytes_per_second);
        }
        check(status);
        return bytes_per_second;
      },
      py::arg("streams"), py::arg("elements"), py::arg("threads"), py::arg("repetitions") = 5,
      "The host's streaming roof for a pass of this shape, bytes per second (zf_host_stream_bandwidth): streams "
      "are (dtype, access) pairs, access 'read', 'write' or 'read_write'.");
  m.def(
      "use_openmp_runtime",
      [](uintptr_t parallel, uintptr_t thread_num, uintptr_t num_threads) {
        // Never freed: a region still running on a previous runtime keeps its context.
        auto* runtime =
            new OpenMpRuntime{function_at<decltype(OpenMpRuntime::parallel)>(parallel, "parallel"),
                              function_at<decltype(OpenMpRuntime::thread_num)>(thread_num, "thread_num"),
                              function_at<decltype(OpenMpRuntime::num_threads)>(num_threads, "num_threads")};
        zf_status status;
        {
          py::gil_scoped_release release;  // waits for kernels running on the old pool
          status = zf_set_parallel_runtime(&run_on_openmp, runtime);
        }
        check(status);
      },
      py::arg("parallel"), py::arg("thread_num"), py::arg("num_threads"));
  m.def("use_own_threads", [] {
    zf_status status;
    {
      py::gil_scoped_release release;
      status = zf_set_parallel_runtime(nullptr, nullptr);
    }
    check(status);
  });
  m.def("parallel_runtime_is_set", [] { return zf_parallel_runtime_is_set() != 0; });
  m.def("cuda_compiled", [] { return zf_cuda_compiled() != 0; });
  m.def("cuda_architectures", [] { return std::string(zf_cuda_architectures()); });
  m.def("cuda_build_note", [] { return std::string(zf_cuda_build_note()); });
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
