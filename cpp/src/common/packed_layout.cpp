#include "common/packed_layout.hpp"

#include <limits>

#include "common/error.hpp"

namespace zf {

void PackedLayout::add(int64_t rows, int64_t cols, int64_t selected, const char* name) {
  require(rows >= 0 && cols >= 0, ZF_ERROR_INVALID_VALUE, name, "[", matrices_.size(), "]: negative size [", rows, ", ",
          cols, "]");
  require(selected >= 0 && selected <= cols, ZF_ERROR_INVALID_VALUE, name, "[", matrices_.size(), "]: ", selected,
          " selected columns for ", cols, " columns");
  constexpr int64_t kMaxElements = std::numeric_limits<std::ptrdiff_t>::max() / 4;
  const int64_t unselected = cols - selected;
  require(rows == 0 || unselected <= (kMaxElements - total_) / rows, ZF_ERROR_INVALID_VALUE, name, "[",
          matrices_.size(), "]: the packed buffer would pass PTRDIFF_MAX bytes");
  matrices_.push_back(PackedMatrix{rows, cols, selected, total_});
  total_ += rows * unselected;
}

}  // namespace zf

extern "C" ZF_API zf_status zf_packed_layout(const int64_t* rows, const int64_t* cols, const int64_t* selected_counts,
                                             size_t count, int64_t* offsets) {
  return zf::api_call([&] {
    zf::require(offsets != nullptr, ZF_ERROR_INVALID_VALUE, "offsets: is NULL");
    zf::require(count == 0 || (rows != nullptr && cols != nullptr && selected_counts != nullptr),
                ZF_ERROR_INVALID_VALUE, "rows/cols/selected_counts: NULL array with count=", count);
    zf::PackedLayout layout;
    layout.reserve(count);
    for (size_t i = 0; i < count; ++i) layout.add(rows[i], cols[i], selected_counts[i], "shapes");
    for (size_t i = 0; i < count; ++i) offsets[i] = layout[i].offset;
    offsets[count] = layout.total();
  });
}
