// Version, error text, dtype helpers and host threads: the C entry points that are not ops.
#include <algorithm>
#include <exception>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/tensor.hpp"
#include "common/thread_pool.hpp"
#include "zenflow/zenflow.h"

namespace zf {
namespace {
thread_local std::string last_error_text;
}
void set_last_error(const std::string& message) { last_error_text = message; }
void clear_last_error() { last_error_text.clear(); }
}  // namespace zf

extern "C" {

ZF_API const char* zf_version(void) { return ZENFLOW_VERSION_STRING; }

ZF_API const char* zf_last_error(void) { return zf::last_error_text.c_str(); }

ZF_API const char* zf_status_string(zf_status status) {
  switch (zf::raw_enum_value(status)) {  // a C caller may pass any int
    case ZF_SUCCESS:
      return "success";
    case ZF_ERROR_INVALID_VALUE:
      return "invalid value";
    case ZF_ERROR_INVALID_TYPE:
      return "invalid type";
    case ZF_ERROR_NOT_SUPPORTED:
      return "not supported";
    case ZF_ERROR_CUDA:
      return "CUDA error";
    case ZF_ERROR_OUT_OF_MEMORY:
      return "out of memory";
    case ZF_ERROR_INTERNAL:
      return "internal error";
  }
  return "unknown status";
}

ZF_API const char* zf_dtype_name(zf_dtype dtype) {
  switch (zf::raw_enum_value(dtype)) {  // a C caller may pass any int
    case ZF_DTYPE_F32:
      return "f32";
    case ZF_DTYPE_F16:
      return "f16";
    case ZF_DTYPE_BF16:
      return "bf16";
    case ZF_DTYPE_I32:
      return "i32";
    case ZF_DTYPE_I64:
      return "i64";
  }
  return "unknown";
}

ZF_API size_t zf_dtype_size(zf_dtype dtype) {
  switch (zf::raw_enum_value(dtype)) {  // a C caller may pass any int
    case ZF_DTYPE_F32:
    case ZF_DTYPE_I32:
      return 4;
    case ZF_DTYPE_F16:
    case ZF_DTYPE_BF16:
      return 2;
    case ZF_DTYPE_I64:
      return 8;
  }
  return 0;
}

ZF_API int zf_get_num_threads(void) {
  // Creating the default pool can fail (the OS refusing a thread); nothing may escape
  // extern "C", and a query has no status to return: report 1 (the calling thread alone,
  // which every region always has) and leave the reason in zf_last_error().
  try {
    return zf::global_thread_pool()->size();
  } catch (const std::exception& e) {
    zf::set_last_error(std::string("zf_get_num_threads: could not create the default pool: ") + e.what());
  } catch (...) {
    zf::set_last_error("zf_get_num_threads: could not create the default pool: unknown exception");
  }
  return 1;
}

ZF_API zf_status zf_set_num_threads(int num_threads, const int* cores, int num_cores) {
  return zf::api_call([&] {
    const int max_threads = zf::max_thread_count();
    zf::require(num_threads >= 1 && num_threads <= max_threads, ZF_ERROR_INVALID_VALUE, "num_threads: must be in [1, ",
                max_threads, "] (max(64, 4 x ", zf::host_cpu_count(), " usable CPUs)), got ", num_threads);
    zf::require(num_cores >= 0 && (num_cores == 0 || cores != nullptr), ZF_ERROR_INVALID_VALUE,
                "cores: NULL with num_cores=", num_cores);
    std::vector<int> core_list;
    for (int i = 0; i < num_cores; ++i) {
      zf::require(cores[i] >= 0 && cores[i] < 65536, ZF_ERROR_INVALID_VALUE, "cores[", i, "]: invalid CPU id ",
                  cores[i]);
      core_list.push_back(cores[i]);
    }
    zf::resize_global_thread_pool(num_threads, std::move(core_list));
  });
}

ZF_API int zf_host_cpu_count(void) { return zf::host_cpu_count(); }

ZF_API zf_status zf_set_parallel_runtime(zf_parallel_run run, void* runtime_context) {
  return zf::api_call([&] { zf::set_global_parallel_runtime(zf::ParallelRuntime{run, runtime_context}); });
}

ZF_API int zf_parallel_runtime_is_set(void) {
  try {
    return zf::global_parallel_runtime_is_set() ? 1 : 0;
  } catch (...) {
    return 0;  // only a failed allocation of the pool's state can throw here; none is set then
  }
}

}  // extern "C"
