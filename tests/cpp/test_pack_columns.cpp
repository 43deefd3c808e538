// zf_pack_columns, zf_scatter_columns and zf_exchange_selected_columns on the host:
// exact references on every dtype pair and prime/1xN/Nx1/empty shapes, poisoned outputs,
// a pack/scatter round trip, thread-count independence, and bad input writing nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <tuple>

#include "common/column_index.hpp"
#include "test_util.hpp"

namespace {

using zf_test::HostMatrix;
using zf_test::random_selection;

std::vector<int64_t> complement(const std::vector<int32_t>& selected, int64_t n) {
  std::vector<int64_t> out;
  for (int64_t j = 0; j < n; ++j) {
    if (!std::binary_search(selected.begin(), selected.end(), static_cast<int32_t>(j))) out.push_back(j);
  }
  return out;
}

// Typed storage for a packed buffer, poisoned with NaN so unwritten elements show up.
struct Packed {
  zf_dtype dtype;
  std::vector<float> f32;
  std::vector<uint16_t> half;
  Packed(zf_dtype d, int64_t n) : dtype(d) {
    if (d == ZF_DTYPE_F32) f32.assign(static_cast<size_t>(n), std::numeric_limits<float>::quiet_NaN());
    if (d != ZF_DTYPE_F32) half.assign(static_cast<size_t>(n), 0x7e01);  // NaN in bf16 and f16
  }
  zf_tensor tensor() {
    const int64_t n = static_cast<int64_t>(dtype == ZF_DTYPE_F32 ? f32.size() : half.size());
    return zenflow::contiguous_tensor(dtype == ZF_DTYPE_F32 ? static_cast<void*>(f32.data()) : half.data(), dtype, {n});
  }
  float get(int64_t i) const {
    return zf::load_as_float(dtype == ZF_DTYPE_F32 ? static_cast<const void*>(f32.data()) : half.data(), dtype, i);
  }
};

float round_to(zf_dtype dtype, double value) {
  const float f = static_cast<float>(value);
  if (dtype == ZF_DTYPE_BF16) return zf::bf16_to_f32(zf::f32_to_bf16(f));
  if (dtype == ZF_DTYPE_F16) return zf::f16_to_f32(zf::f32_to_f16(f));
  return f;
}

TEST(UnselectedColumn, MatchesTheComplementList) {
  std::mt19937_64 rng(3);
  for (int64_t n : {1, 2, 17, 300}) {
    for (int64_t k : {int64_t{0}, int64_t{1}, n / 3, n - 1, n}) {
      if (k < 0) continue;
      const auto sel = random_selection(n, k, rng);
      const auto rest = complement(sel, n);
      for (size_t j = 0; j < rest.size(); ++j) {
        ASSERT_EQ(zf::unselected_column(sel.data(), static_cast<int32_t>(k), static_cast<int64_t>(j)), rest[j]);
      }
    }
  }
}

// The host kernels move 8x8 tiles in 16-row bands: whole bands, an 8-row band and element
// tails on both axes (97 rows, 263 columns), runs of consecutive columns and gathered ones
// (selected columns in between), no selection at all (40 x 70, 53 x 131), 16 x 8 exactly.
const std::vector<std::tuple<int64_t, int64_t, int64_t>> kShapes = {
    {1, 1, 0}, {1, 4099, 409}, {4099, 1, 0}, {4099, 1, 1}, {7, 13, 3}, {97, 263, 26}, {33, 64, 64},
    {0, 9, 2}, {3, 0, 0},      {40, 70, 0},  {53, 131, 0}, {16, 8, 0}, {24, 300, 3}};

class PackSweep : public ::testing::TestWithParam<std::tuple<zf_dtype, zf_dtype, zf_simd_level>> {};

TEST_P(PackSweep, PackMatchesReferenceAndScatterInvertsIt) {
  const auto [matrix_dtype, packed_dtype, level] = GetParam();
  if (level > zf_simd_level_supported()) GTEST_SKIP() << "CPU lacks " << zf_simd_level_name(level);
  zenflow::ScopedSimdLevel simd(level);
  std::mt19937_64 rng(11 + matrix_dtype * 3 + packed_dtype);
  std::vector<HostMatrix> grads;
  std::vector<std::vector<int32_t>> sels;
  std::vector<zf_tensor> grad_t, sel_t;
  int64_t total = 0;
  for (const auto& [rows, cols, k] : kShapes) {
    grads.push_back(zf_test::random_matrix(matrix_dtype, rows, cols, rng));
    // Signed zero, infinities and a subnormal go through the tiles as any other value.
    const float specials[] = {-0.0f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                              1e-40f, 70000.0f};
    for (int64_t e = 0; e < rows * cols && e < 5; ++e) grads.back().set(e * 37 % (rows * cols), specials[e]);
    sels.push_back(random_selection(cols, k, rng));
    total += rows * (cols - k);
  }
  for (size_t i = 0; i < grads.size(); ++i) {
    grad_t.push_back(grads[i].tensor());
    sel_t.push_back(zenflow::contiguous_tensor(sels[i].data(), ZF_DTYPE_I32, {int64_t(sels[i].size())}));
  }
  for (const float scale : {1.0f, 0.25f, 0.3f}) {
    Packed packed(packed_dtype, total);
    float scale_value = scale;
    const zf_tensor scale_t = zenflow::contiguous_tensor(&scale_value, ZF_DTYPE_F32, {1});
    zenflow::pack_columns(grad_t, sel_t, packed.tensor(), scale == 1.0f ? nullptr : &scale_t);
    int64_t offset = 0;
    for (size_t i = 0; i < grads.size(); ++i) {
      const auto rest = complement(sels[i], grads[i].cols);
      for (size_t j = 0; j < rest.size(); ++j) {
        for (int64_t r = 0; r < grads[i].rows; ++r) {
          // One fp32 product, one rounding to the packed dtype.
          const float expected =
              round_to(packed_dtype, static_cast<float>(grads[i].values[r * grads[i].cols + rest[j]]) * scale);
          const float got = packed.get(offset + static_cast<int64_t>(j) * grads[i].rows + r);
          ASSERT_EQ(zf::f32_bits(got), zf::f32_bits(expected)) << "matrix " << i << " j=" << j << " r=" << r;
        }
      }
      offset += grads[i].rows * static_cast<int64_t>(rest.size());
    }
    ASSERT_EQ(offset, total);
  }

  // Round trip: scatter the unscaled pack into copies whose unselected columns are
  // poisoned; selected columns must stay as they were.
  Packed packed(packed_dtype, total);
  zenflow::pack_columns(grad_t, sel_t, packed.tensor());
  std::vector<HostMatrix> params = grads;
  std::vector<zf_tensor> param_t;
  for (size_t i = 0; i < params.size(); ++i) {
    for (int64_t j : complement(sels[i], params[i].cols)) {
      for (int64_t r = 0; r < params[i].rows; ++r) params[i].set(r * params[i].cols + j, 12345.0f);
    }
    param_t.push_back(params[i].tensor());
  }
  zenflow::scatter_columns(packed.tensor(), param_t, sel_t);
  for (size_t i = 0; i < params.size(); ++i) {
    for (int64_t e = 0; e < params[i].rows * params[i].cols; ++e) {
      const float original = static_cast<float>(grads[i].values[e]);
      const bool moved = !std::binary_search(sels[i].begin(), sels[i].end(), static_cast<int32_t>(e % params[i].cols));
      const float expected = moved ? round_to(matrix_dtype, round_to(packed_dtype, original)) : original;
      const float got = zf::load_as_float(params[i].data(), matrix_dtype, e);
      ASSERT_EQ(zf::f32_bits(got), zf::f32_bits(expected)) << "matrix " << i << " element " << e;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, PackSweep,
                         ::testing::Combine(::testing::Values(ZF_DTYPE_F32, ZF_DTYPE_BF16, ZF_DTYPE_F16),
                                            ::testing::Values(ZF_DTYPE_F32, ZF_DTYPE_BF16, ZF_DTYPE_F16),
                                            ::testing::Values(ZF_SIMD_SCALAR, ZF_SIMD_AVX2, ZF_SIMD_AVX512)));

TEST(Pack, NoSelectionPacksEverythingOnEveryThreadCount) {
  std::mt19937_64 rng(12);
  HostMatrix g = zf_test::random_matrix(ZF_DTYPE_BF16, 301, 131, rng);
  Packed reference(ZF_DTYPE_BF16, 301 * 131);
  zenflow::pack_columns({g.tensor()}, {}, reference.tensor());
  for (int64_t j = 0; j < 131; ++j) {
    for (int64_t r = 0; r < 301; ++r) ASSERT_EQ(reference.half[j * 301 + r], g.half[r * 131 + j]);
  }
  for (int threads : {1, 2, 5}) {
    zenflow::ScopedNumThreads pool(threads);
    Packed again(ZF_DTYPE_BF16, 301 * 131);
    zenflow::pack_columns({g.tensor()}, {}, again.tensor());
    EXPECT_EQ(again.half, reference.half);
  }
}

TEST(Pack, BadInputFailsAndWritesNothing) {
  std::mt19937_64 rng(13);
  HostMatrix g = zf_test::random_matrix(ZF_DTYPE_F32, 4, 6, rng);
  std::vector<int32_t> sel{1, 3};
  Packed packed(ZF_DTYPE_F32, 4 * 4);
  zf_tensor grad = g.tensor(), sel_t = zenflow::contiguous_tensor(sel.data(), ZF_DTYPE_I32, {2});
  zf_tensor packed_t = packed.tensor();
  packed_t.shape[0] = 15;
  EXPECT_EQ(zf_pack_columns(&grad, &sel_t, 1, &packed_t, nullptr, nullptr), ZF_ERROR_INVALID_VALUE);
  EXPECT_NE(std::string(zf_last_error()).find("packed"), std::string::npos);
  packed_t.shape[0] = 16;
  sel = {3, 1};
  EXPECT_EQ(zf_pack_columns(&grad, &sel_t, 1, &packed_t, nullptr, nullptr), ZF_ERROR_INVALID_VALUE);
  sel = {1, 6};
  EXPECT_EQ(zf_scatter_columns(&packed_t, &grad, &sel_t, 1, nullptr), ZF_ERROR_INVALID_VALUE);
  sel = {1, 3};
  packed_t.dtype = ZF_DTYPE_I32;
  EXPECT_EQ(zf_pack_columns(&grad, &sel_t, 1, &packed_t, nullptr, nullptr), ZF_ERROR_INVALID_TYPE);
  for (float v : packed.f32) EXPECT_TRUE(std::isnan(v));
}

// ---- exchange ---------------------------------------------------------------------------

struct StateStore {
  int64_t rows, columns;
  bool host_layout;  // [columns, rows] instead of [rows, columns]
  std::vector<float> master, exp_avg, exp_avg_sq;
  std::vector<int32_t> steps;
  StateStore(int64_t r, int64_t c, bool host, bool with_master, float fill) : rows(r), columns(c), host_layout(host) {
    const size_t n = static_cast<size_t>(r * c);
    if (with_master) master.assign(n, fill);
    exp_avg.assign(n, fill);
    exp_avg_sq.assign(n, fill);
    steps.assign(static_cast<size_t>(c), -77);
  }
  void randomize(std::mt19937_64& rng) {
    std::normal_distribution<float> normal;
    for (auto& x : master) x = normal(rng);
    for (auto& x : exp_avg) x = normal(rng);
    for (auto& x : exp_avg_sq) x = std::fabs(normal(rng));
    std::uniform_int_distribution<int32_t> step(0, 1000);
    for (auto& s : steps) s = step(rng);
  }
  // Element r of column c.
  size_t at(int64_t r, int64_t c) const { return static_cast<size_t>(host_layout ? c * rows + r : r * columns + c); }
  zf_column_state view() {
    const std::vector<int64_t> shape =
        host_layout ? std::vector<int64_t>{columns, rows} : std::vector<int64_t>{rows, columns};
    zf_column_state s{};
    s.master = master.empty() ? zenflow::contiguous_tensor(nullptr, ZF_DTYPE_F32, {0})
                              : zenflow::contiguous_tensor(master.data(), ZF_DTYPE_F32, shape);
    s.exp_avg = zenflow::contiguous_tensor(exp_avg.data(), ZF_DTYPE_F32, shape);
    s.exp_avg_sq = zenflow::contiguous_tensor(exp_avg_sq.data(), ZF_DTYPE_F32, shape);
    s.steps = zenflow::contiguous_tensor(steps.data(), ZF_DTYPE_I32, {columns});
    return s;
  }
};

void expect_same_column(const StateStore& a, int64_t ca, const StateStore& b, int64_t cb) {
  ASSERT_EQ(a.steps[static_cast<size_t>(ca)], b.steps[static_cast<size_t>(cb)]);
  for (int64_t r = 0; r < a.rows; ++r) {
    if (!a.master.empty()) ASSERT_EQ(a.master[a.at(r, ca)], b.master[b.at(r, cb)]);
    ASSERT_EQ(a.exp_avg[a.at(r, ca)], b.exp_avg[b.at(r, cb)]) << "r=" << r;
    ASSERT_EQ(a.exp_avg_sq[a.at(r, ca)], b.exp_avg_sq[b.at(r, cb)]);
  }
}

TEST(Exchange, MovesOnlyTheChangingColumnsExactly) {
  std::mt19937_64 rng(21);
  const std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t, bool>> shapes = {
      // rows, n, k_old, k_new, master
      {5, 40, 8, 8, true}, {1, 17, 3, 5, false},  {37, 101, 10, 10, true}, {4, 9, 0, 4, true},
      {6, 9, 4, 0, false}, {3, 12, 12, 12, true}, {0, 10, 2, 2, false}};
  std::vector<std::vector<int32_t>> old_sel, new_sel;
  std::vector<StateStore> old_s, new_s, in_s, out_s;
  zenflow::ExchangeArgs args;
  for (const auto& [rows, n, k_old, k_new, master] : shapes) {
    old_sel.push_back(random_selection(n, k_old, rng));
    new_sel.push_back(random_selection(n, k_new, rng));
    int64_t staying = 0;
    for (int32_t c : new_sel.back()) staying += std::binary_search(old_sel.back().begin(), old_sel.back().end(), c);
    old_s.emplace_back(rows, k_old, false, master, 0.0f);
    old_s.back().randomize(rng);
    new_s.emplace_back(rows, k_new, false, master, std::numeric_limits<float>::quiet_NaN());
    in_s.emplace_back(rows, k_new - staying, true, master, 0.0f);
    in_s.back().randomize(rng);
    out_s.emplace_back(rows, k_old - staying, true, master, std::numeric_limits<float>::quiet_NaN());
  }
  for (size_t i = 0; i < shapes.size(); ++i) {
    args.old_selected.push_back(
        zenflow::contiguous_tensor(old_sel[i].data(), ZF_DTYPE_I32, {int64_t(old_sel[i].size())}));
    args.new_selected.push_back(
        zenflow::contiguous_tensor(new_sel[i].data(), ZF_DTYPE_I32, {int64_t(new_sel[i].size())}));
    args.old_state.push_back(old_s[i].view());
    args.new_state.push_back(new_s[i].view());
    args.entering.push_back(in_s[i].view());
    args.leaving.push_back(out_s[i].view());
  }
  EXPECT_EQ(zenflow::exchange_selected_columns_workspace_bytes(args), 0u);
  zenflow::exchange_selected_columns(args);
  for (size_t i = 0; i < shapes.size(); ++i) {
    SCOPED_TRACE("matrix " + std::to_string(i));
    int64_t e = 0, l = 0;
    for (size_t p = 0; p < new_sel[i].size(); ++p) {
      const auto it = std::lower_bound(old_sel[i].begin(), old_sel[i].end(), new_sel[i][p]);
      if (it != old_sel[i].end() && *it == new_sel[i][p]) {
        expect_same_column(new_s[i], static_cast<int64_t>(p), old_s[i], it - old_sel[i].begin());
      } else {
        expect_same_column(new_s[i], static_cast<int64_t>(p), in_s[i], e++);
      }
    }
    for (size_t q = 0; q < old_sel[i].size(); ++q) {
      if (std::binary_search(new_sel[i].begin(), new_sel[i].end(), old_sel[i][q])) continue;
      expect_same_column(out_s[i], l++, old_s[i], static_cast<int64_t>(q));
    }
    EXPECT_EQ(e, in_s[i].columns);
    EXPECT_EQ(l, out_s[i].columns);
  }
}

TEST(Exchange, WrongBufferSizesFailAndWriteNothing) {
  std::vector<int32_t> old_sel{1, 4, 6}, new_sel{1, 5, 6};
  StateStore old_s(3, 3, false, true, 1.0f), new_s(3, 3, false, true, -1.0f);
  StateStore in_s(3, 2, true, true, 2.0f), out_s(3, 1, true, true, -1.0f);  // one enters, not two
  zenflow::ExchangeArgs args;
  args.old_selected = {zenflow::contiguous_tensor(old_sel.data(), ZF_DTYPE_I32, {3})};
  args.new_selected = {zenflow::contiguous_tensor(new_sel.data(), ZF_DTYPE_I32, {3})};
  args.old_state = {old_s.view()};
  args.new_state = {new_s.view()};
  args.entering = {in_s.view()};
  args.leaving = {out_s.view()};
  EXPECT_THROW(zenflow::exchange_selected_columns(args), zenflow::Error);
  EXPECT_NE(std::string(zf_last_error()).find("entering[0]"), std::string::npos) << zf_last_error();
  for (float v : new_s.exp_avg) EXPECT_EQ(v, -1.0f);
  for (float v : out_s.master) EXPECT_EQ(v, -1.0f);
}

TEST(Pack, PackedBufferAliasingAMatrixIsRejected) {
  std::vector<float> grad(4 * 6, 1.0f);
  const std::vector<float> before = grad;
  const zf_tensor grad_t = zenflow::contiguous_tensor(grad.data(), ZF_DTYPE_F32, {4, 6});
  const zf_tensor packed_t = zenflow::contiguous_tensor(grad.data() + 2, ZF_DTYPE_F32, {24});
  EXPECT_EQ(zf_pack_columns(&grad_t, nullptr, 1, &packed_t, nullptr, nullptr), ZF_ERROR_INVALID_VALUE);
  EXPECT_NE(std::string(zf_last_error()).find("overlaps"), std::string::npos) << zf_last_error();
  EXPECT_EQ(zf_scatter_columns(&packed_t, &grad_t, nullptr, 1, nullptr), ZF_ERROR_INVALID_VALUE);
  EXPECT_EQ(grad, before);
}

TEST(Exchange, NewStateAliasingOldStateIsRejected) {
  std::mt19937_64 rng(23);
  std::vector<int32_t> old_sel = {1, 4}, new_sel = {1, 4};
  StateStore old_s(3, 2, false, true, 0.0f), in_s(3, 0, true, true, 0.0f), out_s(3, 0, true, true, 0.0f);
  old_s.randomize(rng);
  const StateStore before = old_s;
  zenflow::ExchangeArgs args;
  args.old_selected.push_back(zenflow::contiguous_tensor(old_sel.data(), ZF_DTYPE_I32, {2}));
  args.new_selected.push_back(zenflow::contiguous_tensor(new_sel.data(), ZF_DTYPE_I32, {2}));
  args.old_state.push_back(old_s.view());
  args.new_state.push_back(old_s.view());  // in place: a move would read what it just wrote
  args.entering.push_back(in_s.view());
  args.leaving.push_back(out_s.view());
  EXPECT_THROW(zenflow::exchange_selected_columns(args), zenflow::Error);
  EXPECT_NE(std::string(zf_last_error()).find("overlaps"), std::string::npos) << zf_last_error();
  EXPECT_EQ(old_s.exp_avg, before.exp_avg);
  EXPECT_EQ(old_s.steps, before.steps);
}

TEST(Exchange, BadMasterDescriptorIsCheckedBeforeItsShapeIsRead) {
  std::mt19937_64 rng(24);
  std::vector<int32_t> old_sel = {1}, new_sel = {2};
  StateStore old_s(3, 1, false, true, 0.0f), new_s(3, 1, false, true, 0.0f), in_s(3, 1, true, true, 0.0f),
      out_s(3, 1, true, true, 0.0f);
  zenflow::ExchangeArgs args;
  args.old_selected.push_back(zenflow::contiguous_tensor(old_sel.data(), ZF_DTYPE_I32, {1}));
  args.new_selected.push_back(zenflow::contiguous_tensor(new_sel.data(), ZF_DTYPE_I32, {1}));
  args.old_state.push_back(old_s.view());
  args.new_state.push_back(new_s.view());
  args.entering.push_back(in_s.view());
  args.leaving.push_back(out_s.view());
  args.old_state[0].master.ndim = 9;  // beyond shape[]: must not be read
  EXPECT_THROW(zenflow::exchange_selected_columns(args), zenflow::Error);
  EXPECT_NE(std::string(zf_last_error()).find("old_state[0].master: ndim 9"), std::string::npos) << zf_last_error();
}

// ---- exchange, packed form --------------------------------------------------------------

// One selection change of several matrices, run in both forms: the per-matrix entering /
// leaving states and the packed ones (zf_exchange_selected_columns_packed).
struct PackedExchangeCase {
  std::vector<std::vector<int32_t>> old_sel, new_sel;
  std::vector<StateStore> old_s, new_s, in_s, out_s;  // the per-matrix form
  std::vector<StateStore> packed_new_s;               // new_state of the packed run
  std::vector<int64_t> rows, entering_counts, leaving_counts;
  std::vector<bool> master;
  // The packed buffers: entering holds the same columns as in_s, leaving is poisoned.
  std::vector<float> in_master, in_exp_avg, in_exp_avg_sq, out_master, out_exp_avg, out_exp_avg_sq;
  std::vector<int32_t> in_steps, out_steps;

  PackedExchangeCase(const std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t, bool>>& shapes,
                     std::mt19937_64& rng) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (const auto& [r, n, k_old, k_new, with_master] : shapes) {
      old_sel.push_back(random_selection(n, k_old, rng));
      new_sel.push_back(random_selection(n, k_new, rng));
      int64_t staying = 0;
      for (int32_t c : new_sel.back()) staying += std::binary_search(old_sel.back().begin(), old_sel.back().end(), c);
      rows.push_back(r);
      master.push_back(with_master);
      entering_counts.push_back(k_new - staying);
      leaving_counts.push_back(k_old - staying);
      old_s.emplace_back(r, k_old, false, with_master, 0.0f);
      old_s.back().randomize(rng);
      new_s.emplace_back(r, k_new, false, with_master, nan);
      packed_new_s.emplace_back(r, k_new, false, with_master, nan);
      in_s.emplace_back(r, k_new - staying, true, with_master, 0.0f);
      in_s.back().randomize(rng);
      out_s.emplace_back(r, k_old - staying, true, with_master, nan);
      // Packed entering: this matrix's columns appended; a matrix without a master gets a
      // slot of poison in the packed master (it must not be read).
      const StateStore& e = in_s.back();
      const size_t elements = e.exp_avg.size();
      if (with_master) {
        in_master.insert(in_master.end(), e.master.begin(), e.master.end());
      } else {
        in_master.insert(in_master.end(), elements, nan);
      }
      in_exp_avg.insert(in_exp_avg.end(), e.exp_avg.begin(), e.exp_avg.end());
      in_exp_avg_sq.insert(in_exp_avg_sq.end(), e.exp_avg_sq.begin(), e.exp_avg_sq.end());
      in_steps.insert(in_steps.end(), e.steps.begin(), e.steps.end());
      const size_t leaving_elements = out_s.back().exp_avg.size();
      out_master.insert(out_master.end(), leaving_elements, -5.0f);
      out_exp_avg.insert(out_exp_avg.end(), leaving_elements, nan);
      out_exp_avg_sq.insert(out_exp_avg_sq.end(), leaving_elements, nan);
      out_steps.insert(out_steps.end(), out_s.back().steps.size(), -77);
    }
  }

  static zf_column_state packed_state(std::vector<float>& m, std::vector<float>& a, std::vector<float>& v,
                                      std::vector<int32_t>& steps) {
    zf_column_state s{};
    s.master = zenflow::contiguous_tensor(m.empty() ? nullptr : m.data(), ZF_DTYPE_F32, {int64_t(m.size())});
    s.exp_avg = zenflow::contiguous_tensor(a.data(), ZF_DTYPE_F32, {int64_t(a.size())});
    s.exp_avg_sq = zenflow::contiguous_tensor(v.data(), ZF_DTYPE_F32, {int64_t(v.size())});
    s.steps = zenflow::contiguous_tensor(steps.data(), ZF_DTYPE_I32, {int64_t(steps.size())});
    return s;
  }

  zenflow::ExchangeArgs per_matrix_args() {
    zenflow::ExchangeArgs args;
    for (size_t i = 0; i < rows.size(); ++i) {
      args.old_selected.push_back(
          zenflow::contiguous_tensor(old_sel[i].data(), ZF_DTYPE_I32, {int64_t(old_sel[i].size())}));
      args.new_selected.push_back(
          zenflow::contiguous_tensor(new_sel[i].data(), ZF_DTYPE_I32, {int64_t(new_sel[i].size())}));
      args.old_state.push_back(old_s[i].view());
      args.new_state.push_back(new_s[i].view());
      args.entering.push_back(in_s[i].view());
      args.leaving.push_back(out_s[i].view());
    }
    return args;
  }

  zenflow::PackedExchangeArgs packed_args() {
    zenflow::PackedExchangeArgs args;
    for (size_t i = 0; i < rows.size(); ++i) {
      args.old_selected.push_back(
          zenflow::contiguous_tensor(old_sel[i].data(), ZF_DTYPE_I32, {int64_t(old_sel[i].size())}));
      args.new_selected.push_back(
          zenflow::contiguous_tensor(new_sel[i].data(), ZF_DTYPE_I32, {int64_t(new_sel[i].size())}));
      args.old_state.push_back(old_s[i].view());
      args.new_state.push_back(packed_new_s[i].view());
    }
    args.entering_counts = entering_counts;
    args.leaving_counts = leaving_counts;
    args.entering = packed_state(in_master, in_exp_avg, in_exp_avg_sq, in_steps);
    args.leaving = packed_state(out_master, out_exp_avg, out_exp_avg_sq, out_steps);
    return args;
  }
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

TEST(ExchangePacked, EqualsThePerMatrixFormBitwise) {
  std::mt19937_64 rng(31);
  // rows, n, k_old, k_new, master: primes, 1xN, Nx1, nothing entering or leaving, empty
  // selections, zero rows, and matrices with and without a master side by side.
  PackedExchangeCase c({{5, 40, 8, 8, true},
                        {1, 17, 3, 5, false},
                        {37, 101, 10, 10, true},
                        {4, 9, 0, 4, true},
                        {6, 9, 4, 0, false},
                        {3, 12, 12, 12, true},
                        {0, 10, 2, 2, false},
                        {7, 1, 1, 1, true},
                        {13, 31, 7, 11, true}},
                       rng);
  zenflow::exchange_selected_columns(c.per_matrix_args());
  const zenflow::PackedExchangeArgs packed = c.packed_args();
  EXPECT_EQ(zenflow::exchange_selected_columns_workspace_bytes(packed), 0u);
  zenflow::exchange_selected_columns(packed);
  size_t at = 0, steps_at = 0;
  for (size_t i = 0; i < c.rows.size(); ++i) {
    SCOPED_TRACE("matrix " + std::to_string(i));
    EXPECT_TRUE(same_bits(c.packed_new_s[i].exp_avg, c.new_s[i].exp_avg));
    EXPECT_TRUE(same_bits(c.packed_new_s[i].exp_avg_sq, c.new_s[i].exp_avg_sq));
    EXPECT_TRUE(same_bits(c.packed_new_s[i].master, c.new_s[i].master));
    EXPECT_EQ(c.packed_new_s[i].steps, c.new_s[i].steps);
    const StateStore& out = c.out_s[i];
    const size_t n = out.exp_avg.size();
    const std::vector<float> a(c.out_exp_avg.begin() + at, c.out_exp_avg.begin() + at + n);
    const std::vector<float> v(c.out_exp_avg_sq.begin() + at, c.out_exp_avg_sq.begin() + at + n);
    const std::vector<float> m(c.out_master.begin() + at, c.out_master.begin() + at + n);
    EXPECT_TRUE(same_bits(a, out.exp_avg));
    EXPECT_TRUE(same_bits(v, out.exp_avg_sq));
    if (c.master[i]) {
      EXPECT_TRUE(same_bits(m, out.master));
    } else {
      for (float x : m) EXPECT_EQ(x, -5.0f);  // a matrix without a master leaves its slot alone
    }
    const std::vector<int32_t> steps(c.out_steps.begin() + steps_at, c.out_steps.begin() + steps_at + out.steps.size());
    EXPECT_EQ(steps, out.steps);
    at += n;
    steps_at += out.steps.size();
  }
  EXPECT_EQ(at, c.out_exp_avg.size());
}

TEST(ExchangePacked, BadInputFailsNamingItAndWritesNothing) {
  std::mt19937_64 rng(32);
  // Matrices 1 and 2 have the same rows: moving a count between them keeps the totals.
  PackedExchangeCase c({{5, 40, 8, 8, true}, {4, 17, 3, 5, true}, {4, 9, 2, 4, true}}, rng);
  const std::vector<StateStore> new_before = c.packed_new_s;
  const std::vector<float> out_before = c.out_exp_avg;
  const std::vector<int32_t> out_steps_before = c.out_steps;
  struct Case {
    const char* what;
    std::function<void(zenflow::PackedExchangeArgs&)> spoil;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"an entering count that does not match the lists",
       [](zenflow::PackedExchangeArgs& a) {
         ++a.entering_counts[1];
         --a.entering_counts[2];
       },
       "entering[1]"},
      {"a negative count", [](zenflow::PackedExchangeArgs& a) { a.leaving_counts[0] = -1; }, "leaving_counts[0]"},
      {"an entering buffer of the wrong size", [](zenflow::PackedExchangeArgs& a) { --a.entering.exp_avg.shape[0]; },
       "entering.exp_avg"},
      {"leaving steps of the wrong size", [](zenflow::PackedExchangeArgs& a) { ++a.leaving.steps.shape[0]; },
       "leaving.steps"},
      {"a strided entering buffer",
       [](zenflow::PackedExchangeArgs& a) {
         a.entering.exp_avg_sq.shape[0] /= 2;
         a.entering.exp_avg_sq.strides[0] = 2;
       },
       "entering.exp_avg_sq"},
      {"a leaving buffer of the wrong dtype",
       [](zenflow::PackedExchangeArgs& a) { a.leaving.exp_avg.dtype = ZF_DTYPE_BF16; }, "leaving.exp_avg"},
      {"no packed master while the matrices have one",
       [](zenflow::PackedExchangeArgs& a) {
         a.entering.master = zenflow::contiguous_tensor(nullptr, ZF_DTYPE_F32, {0});
       },
       "entering[0].master"},
      {"two leaving fields in one buffer",
       [](zenflow::PackedExchangeArgs& a) { a.leaving.exp_avg_sq.data = a.leaving.exp_avg.data; }, "overlaps"},
  };
  for (const Case& bad : cases) {
    SCOPED_TRACE(bad.what);
    zenflow::PackedExchangeArgs args = c.packed_args();
    bad.spoil(args);
    EXPECT_THROW(zenflow::exchange_selected_columns(args), zenflow::Error);
    EXPECT_NE(std::string(zf_last_error()).find(bad.message), std::string::npos) << zf_last_error();
    for (size_t i = 0; i < new_before.size(); ++i) {
      EXPECT_TRUE(same_bits(c.packed_new_s[i].exp_avg, new_before[i].exp_avg));
      EXPECT_EQ(c.packed_new_s[i].steps, new_before[i].steps);
    }
    EXPECT_TRUE(same_bits(c.out_exp_avg, out_before));
    EXPECT_EQ(c.out_steps, out_steps_before);
  }
  // NULL counts with matrices, and no matrices at all.
  zenflow::PackedExchangeArgs args = c.packed_args();
  EXPECT_EQ(zf_exchange_selected_columns_packed(
                args.old_selected.data(), args.new_selected.data(), args.old_state.data(), args.new_state.data(),
                nullptr, &args.entering, args.leaving_counts.data(), &args.leaving, 3, nullptr, nullptr, nullptr),
            ZF_ERROR_INVALID_VALUE);
  EXPECT_EQ(zf_exchange_selected_columns_packed(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                                0, nullptr, nullptr, nullptr),
            ZF_SUCCESS);
}

TEST(PackedLayout, OffsetsAreTheOneDefinitionAndRejectBadShapes) {
  EXPECT_EQ(zenflow::packed_offsets({2, 1, 5}, {3, 4, 0}, {1, 4, 0}), (std::vector<int64_t>{0, 4, 4, 4}));
  EXPECT_EQ(zenflow::packed_offsets({}, {}, {}), (std::vector<int64_t>{0}));
  std::vector<int64_t> offsets(2, -7);
  const int64_t rows = 2, cols = 3, k = 5;
  EXPECT_EQ(zf_packed_layout(&rows, &cols, &k, 1, offsets.data()), ZF_ERROR_INVALID_VALUE);
  EXPECT_NE(std::string(zf_last_error()).find("5 selected columns for 3 columns"), std::string::npos)
      << zf_last_error();
  const int64_t negative = -2;
  EXPECT_EQ(zf_packed_layout(&negative, &cols, &k, 1, offsets.data()), ZF_ERROR_INVALID_VALUE);
  const int64_t huge = int64_t{1} << 40, none = 0;
  EXPECT_EQ(zf_packed_layout(&huge, &huge, &none, 1, offsets.data()), ZF_ERROR_INVALID_VALUE);
  EXPECT_NE(std::string(zf_last_error()).find("PTRDIFF_MAX"), std::string::npos) << zf_last_error();
  EXPECT_EQ(offsets, (std::vector<int64_t>{-7, -7}));  // nothing written on failure
}

}  // namespace
