// Validation of zf_tensor descriptors at the C boundary. Every check names the argument
// ("grads[3]") so the message reaches the Python user unchanged. Names are ArgName values
// that are turned into text only when a check fails: validating hundreds of tensors builds
// no string.
#pragma once

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <ostream>
#include <string>

#include "common/error.hpp"
#include "zenflow/zenflow.h"

namespace zf {

// The integer a C caller stored in an enum field. Loading an out-of-range value through the
// C++ enum type is itself undefined behaviour (UBSan reports it), so validation reads the
// bytes as the int that C stores.
template <typename Enum>
inline int raw_enum_value(const Enum& value) {
  static_assert(sizeof(Enum) == sizeof(int), "C enums are stored as int");
  int raw;
  std::memcpy(&raw, &value, sizeof(raw));
  return raw;
}

// "base", "base[index]" or "base[index].field", formatted on demand. Holds pointers only:
// it lives no longer than the call that validates.
class ArgName {
 public:
  ArgName(const char* base) : base_(base) {}                 // NOLINT: implicit, names are mostly literals
  ArgName(const std::string& base) : base_(base.c_str()) {}  // NOLINT
  ArgName(const char* base, size_t index, const char* field = nullptr)
      : base_(base), index_(static_cast<int64_t>(index)), field_(field) {}
  ArgName with_field(const char* field) const {
    ArgName out = *this;
    out.field_ = field;
    return out;
  }
  std::string str() const;

 private:
  const char* base_;
  int64_t index_ = -1;
  const char* field_ = nullptr;
};
std::ostream& operator<<(std::ostream& out, const ArgName& name);

std::string arg_name(const char* name, size_t index);
std::string describe_device(const zf_device& device);

// Element count of a descriptor whose shape check_descriptor accepted (no overflow then).
int64_t numel(const zf_tensor& t);
// A contiguous (row-major) descriptor of `shape` (at most ZF_MAX_DIMS dimensions).
zf_tensor contiguous_descriptor(const void* data, zf_dtype dtype, zf_device device,
                                std::initializer_list<int64_t> shape);
bool is_contiguous(const zf_tensor& t);

// Non-null descriptor with a known dtype and device type, 0 <= ndim <= ZF_MAX_DIMS,
// non-negative shape whose element count and byte size fit in PTRDIFF_MAX, data non-null
// unless empty, data aligned to its element size.
void check_descriptor(const zf_tensor* t, const ArgName& name);
void check_dtype(const zf_tensor& t, const ArgName& name, std::initializer_list<zf_dtype> allowed);
void check_ndim(const zf_tensor& t, const ArgName& name, int ndim);
void check_contiguous(const zf_tensor& t, const ArgName& name);
void check_same_device(const zf_tensor& t, const ArgName& name, const zf_device& expected,
                       const ArgName& expected_from);
void check_numel(const zf_tensor& t, const ArgName& name, int64_t expected);
// Layout checks for arguments that are checked by element count (docs/design.md section 4).
// A tensor of two or more dimensions must have the shape its layout gives, size-1
// dimensions aside: the same elements in another shape (a transposed [n, m] where [m, n] is
// expected) would be read in the wrong order and update the wrong elements. A 0-D or 1-D
// tensor is a flat buffer the caller laid out, read as it is. A square matrix cannot be
// told from its transpose by its shape: the headers name every argument's layout.
//   check_matrix_layout: `t` must be [rows, cols], the `layout` that `reference` gives.
//   check_same_layout: `t` must have the shape of `reference` (when both have 2+ dims).
void check_matrix_layout(const zf_tensor& t, const ArgName& name, int64_t rows, int64_t cols, const char* layout,
                         const ArgName& reference);
void check_same_layout(const zf_tensor& t, const ArgName& name, const zf_tensor& reference,
                       const ArgName& reference_name);
// A CPU tensor (host-only calls).
void check_cpu(const zf_tensor& t, const ArgName& name);

inline bool same_device(const zf_device& a, const zf_device& b) {
  return a.type == b.type && (a.type == ZF_DEVICE_CPU || a.index == b.index);
}

}  // namespace zf
