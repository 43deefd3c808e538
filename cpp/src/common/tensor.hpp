// Validation of zf_tensor descriptors at the C boundary. Every check names the argument
// ("grads[3]") so the message reaches the Python user unchanged.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "common/error.hpp"
#include "zenflow/zenflow.h"

namespace zf {

std::string arg_name(const char* name, size_t index);
std::string describe_device(const zf_device& device);

int64_t numel(const zf_tensor& t);
bool is_contiguous(const zf_tensor& t);

// Non-null descriptor with a known dtype, 0 <= ndim <= ZF_MAX_DIMS, non-negative shape,
// data non-null unless empty, data aligned to its element size.
void check_descriptor(const zf_tensor* t, const std::string& name);
void check_dtype(const zf_tensor& t, const std::string& name, std::initializer_list<zf_dtype> allowed);
void check_ndim(const zf_tensor& t, const std::string& name, int ndim);
void check_contiguous(const zf_tensor& t, const std::string& name);
void check_same_device(const zf_tensor& t, const std::string& name, const zf_device& expected,
                       const std::string& expected_from);
void check_numel(const zf_tensor& t, const std::string& name, int64_t expected);

inline bool same_device(const zf_device& a, const zf_device& b) {
  return a.type == b.type && (a.type == ZF_DEVICE_CPU || a.index == b.index);
}

}  // namespace zf
