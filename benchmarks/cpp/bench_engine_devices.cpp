// The host-side cost of driving parameters on several devices in lock step (engine_group.hpp).
//
// One step call on the same model, with its parameters on one device (the peer: a plain
// engine) and split over 2 and 4 devices. The devices are CPU parts on host backends
// (zf::testing::create_engine_in_parts), so every part's device work runs on the calling
// thread one part after the other: the total work is the same, and the difference is what
// the lock step adds (each device's checks, phases and bookkeeping, the partial exchange).
// On GPUs the device work of the parts runs concurrently; the host cost measured here is the
// part that stays on the training thread.
//
// Two models: 300 tiny tensors (150 [8, 16] + 150 [16]: bookkeeping dominates, as in
// bench_engine.py's bookkeeping row) and 24 [256, 512] fp32 matrices (the work dominates).
// Prints a markdown table: median step ms over --reps timed steps (after warm-up) and the
// ratio to one device.
//
//   ./build/zenflow_bench_engine_devices --reps 200
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/testing.hpp"
#include "zenflow/zenflow.hpp"

namespace {

struct Model {
  std::vector<std::vector<float>> params, grads;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<zf_tensor> param_tensors, grad_tensors;
  std::vector<int32_t> param_groups;
};

Model make_model(const std::vector<std::vector<int64_t>>& shapes) {
  Model m;
  m.shapes = shapes;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const auto& s : shapes) {
    int64_t n = 1;
    for (int64_t d : s) n *= d;
    std::vector<float> p(static_cast<size_t>(n)), g(static_cast<size_t>(n));
    for (auto& v : p) v = normal(rng);
    for (auto& v : g) v = normal(rng);
    m.params.push_back(std::move(p));
    m.grads.push_back(std::move(g));
    m.param_groups.push_back(0);
  }
  for (size_t i = 0; i < shapes.size(); ++i) {
    m.param_tensors.push_back(zenflow::contiguous_tensor(m.params[i].data(), ZF_DTYPE_F32, shapes[i]));
    m.grad_tensors.push_back(zenflow::contiguous_tensor(m.grads[i].data(), ZF_DTYPE_F32, shapes[i]));
  }
  return m;
}

double median_step_ms(size_t devices, Model& model, int reps) {
  const std::vector<zf_engine_group> groups = {zf_engine_group{1e-3, 0.01, 0}};
  zf_engine_config c = zf_engine_config_default();
  c.update_interval = 4;
  zenflow::Engine engine = [&] {
    if (devices == 1) return zenflow::Engine(model.param_tensors, model.param_groups, groups, c);
    std::vector<size_t> parts(model.param_tensors.size());
    for (size_t i = 0; i < parts.size(); ++i) parts[i] = i * devices / parts.size();  // contiguous runs
    return zenflow::Engine(
        zf::testing::create_engine_in_parts(model.param_tensors, model.param_groups, groups, c, parts));
  }();
  for (int t = 0; t < 8; ++t) engine.step(model.grad_tensors);
  std::vector<double> times;
  for (int r = 0; r < reps; ++r) {
    const auto start = std::chrono::steady_clock::now();
    engine.step(model.grad_tensors);
    times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  engine.flush();
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 200;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: %s [--reps N]\n", argv[0]);
      return 2;
    }
  }
  try {
    std::vector<std::vector<int64_t>> tiny, matrices;
    for (int i = 0; i < 150; ++i) {
      tiny.push_back({8, 16});
      tiny.push_back({16});
    }
    for (int i = 0; i < 24; ++i) matrices.push_back({256, 512});
    std::printf("| model | devices | step ms (median of %d) | vs one device |\n|---|---:|---:|---:|\n", reps);
    const std::pair<const char*, std::vector<std::vector<int64_t>>*> models[] = {{"300 tiny tensors", &tiny},
                                                                                 {"24 x [256, 512] fp32", &matrices}};
    for (const auto& entry : models) {
      Model model = make_model(*entry.second);
      // Interleaved rounds, so that drift of a noisy machine hits every placement alike.
      std::vector<std::vector<double>> rounds(3);
      for (int round = 0; round < 3; ++round) {
        for (size_t d = 0; d < 3; ++d) rounds[d].push_back(median_step_ms(size_t{1} << d, model, reps));
      }
      double one = 0.0;
      for (size_t d = 0; d < 3; ++d) {
        std::sort(rounds[d].begin(), rounds[d].end());
        const double ms = rounds[d][1];
        if (d == 0) one = ms;
        std::printf("| %s | %zu | %.3f | %.2fx |\n", entry.first, size_t{1} << d, ms, ms / one);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_engine_devices: %s\n", e.what());
    return 1;
  }
  return 0;
}
