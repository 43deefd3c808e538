// Lane latency: how long a short high-priority job (an accumulate) waits behind a long
// low-priority one (a window update) on one WorkQueue.
//
// The queue runs a kLow "window update" (an Adam step streaming over p, m, v, g of
// --update-elements fp32 each, in chunks of --chunk-elements) and, while it runs, a kHigh
// 1M-element accumulate (--accumulate-elements) every ~20 ms. A kHigh job starts after the
// chunk in progress, so its queue latency should be about one chunk, not one update.
//
// Prints one JSON line: median and max accumulate queue latency (queued_seconds), median
// chunk time, update seconds (median over --rounds), and the ratios latency / chunk.
//
//   ./build/zenflow_bench_lane_latency                        # 128M elements, 4M per chunk
//   ./build/zenflow_bench_lane_latency --chunk-elements 1048576 --threads 2 --rounds 3
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/adam_math.hpp"
#include "common/thread_pool.hpp"
#include "simd/kernels.hpp"

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  int64_t update_elements = int64_t{128} << 20;
  int64_t chunk_elements = int64_t{4} << 20;
  int64_t accumulate_elements = int64_t{1} << 20;
  int threads = zf::default_thread_count();
  int rounds = 2;
  int accumulate_period_ms = 20;
};

void print_usage(const char* program) {
  std::fprintf(stderr,
               "usage: %s [--update-elements N] [--chunk-elements N] [--accumulate-elements N] [--threads N] "
               "[--rounds N]\n",
               program);
}

// Parses "--flag value" and "--flag=value"; returns false (after a message) on anything else.
bool parse_options(int argc, char** argv, Options* options) {
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    std::string value;
    const size_t equals = flag.find('=');
    if (equals != std::string::npos) {
      value = flag.substr(equals + 1);
      flag = flag.substr(0, equals);
    } else if (flag == "--help" || flag == "-h") {
      return false;
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      std::fprintf(stderr, "%s: missing value\n", flag.c_str());
      return false;
    }
    char* end = nullptr;
    const long long number = std::strtoll(value.c_str(), &end, 10);
    if (value.empty() || *end != '\0' || number < 1) {
      std::fprintf(stderr, "%s: expected a positive integer, got '%s'\n", flag.c_str(), value.c_str());
      return false;
    }
    if (flag == "--update-elements") {
      options->update_elements = number;
    } else if (flag == "--chunk-elements") {
      options->chunk_elements = number;
    } else if (flag == "--accumulate-elements") {
      options->accumulate_elements = number;
    } else if (flag == "--threads") {
      options->threads = static_cast<int>(std::min<long long>(number, 4096));
    } else if (flag == "--rounds") {
      options->rounds = static_cast<int>(std::min<long long>(number, 1000000));
    } else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return false;
    }
  }
  return true;
}

double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const size_t middle = values.size() / 2;
  return values.size() % 2 == 1 ? values[middle] : 0.5 * (values[middle - 1] + values[middle]);
}

double max_of(const std::vector<double>& values) {
  return values.empty() ? 0.0 : *std::max_element(values.begin(), values.end());
}

// Uninitialised storage: the arrays are first touched by the pool's threads, as in training.
std::unique_ptr<float[]> allocate(int64_t count) { return std::unique_ptr<float[]>(new float[count]); }

int run(const Options& options) {
  auto pool = std::make_shared<zf::ThreadPool>(options.threads);
  zf::WorkQueue queue(pool);
  const zf::simd::KernelTable& kernels = zf::simd::active_kernels();

  const int64_t n = options.update_elements;
  auto param = allocate(n), exp_avg = allocate(n), exp_avg_sq = allocate(n), grad = allocate(n);
  const int64_t acc_n = options.accumulate_elements;
  auto acc = allocate(acc_n), acc_source = allocate(acc_n);
  pool->run([&](int thread, int threads) {
    int64_t begin, end;
    zf::split_range(0, n, thread, threads, &begin, &end);
    for (int64_t i = begin; i < end; ++i) {
      param[i] = 1.0f;
      exp_avg[i] = 0.0f;
      exp_avg_sq[i] = 0.0f;
      grad[i] = 1e-3f * static_cast<float>(i % 17 - 8);
    }
    zf::split_range(0, acc_n, thread, threads, &begin, &end);
    for (int64_t i = begin; i < end; ++i) {
      acc[i] = 0.0f;
      acc_source[i] = 1e-3f * static_cast<float>(i % 13 - 6);
    }
  });

  const zf::AdamHyperParams hyper{1e-3, 0.9, 0.999, 1e-8, 0.01, /*decoupled=*/true};
  std::vector<double> chunk_ms, update_seconds, latency_ms, accumulate_run_ms;

  zf::WorkQueue::Chunk accumulate = [&](zf::ThreadPool& chunk_pool) {
    chunk_pool.run([&](int thread, int threads) {
      int64_t begin, end;
      zf::split_range(0, acc_n, thread, threads, &begin, &end);
      kernels.accumulate(acc.get() + begin, acc_source.get() + begin, ZF_DTYPE_F32, end - begin, 0.5f, false, false);
    });
  };

  for (int round = 0; round < options.rounds; ++round) {
    zf::simd::AdamStepArgs step_args{};
    step_args.grad_dtype = ZF_DTYPE_F32;
    step_args.out = nullptr;
    step_args.out_dtype = ZF_DTYPE_F32;
    step_args.zero_grad = false;
    step_args.stream_out = false;
    step_args.grad_scale = 1.0f;
    step_args.scalars = zf::adam_step_scalars(hyper, round + 1);

    // Chunks run one after another on the driver thread: each writes its own slot.
    const int64_t chunk_count = (n + options.chunk_elements - 1) / options.chunk_elements;
    std::vector<double> round_chunk_ms(static_cast<size_t>(chunk_count), 0.0);
    std::vector<zf::WorkQueue::Chunk> update_chunks;
    for (int64_t c = 0; c < chunk_count; ++c) {
      const int64_t chunk_begin = c * options.chunk_elements;
      const int64_t chunk_end = std::min(n, chunk_begin + options.chunk_elements);
      update_chunks.push_back([&, c, chunk_begin, chunk_end](zf::ThreadPool& chunk_pool) {
        const auto start = Clock::now();
        chunk_pool.run([&](int thread, int threads) {
          int64_t begin, end;
          zf::split_range(chunk_begin, chunk_end, thread, threads, &begin, &end);
          zf::simd::AdamStepArgs args = step_args;
          args.param = param.get() + begin;
          args.exp_avg = exp_avg.get() + begin;
          args.exp_avg_sq = exp_avg_sq.get() + begin;
          args.grad = grad.get() + begin;
          kernels.adam_step(args, end - begin);
        });
        round_chunk_ms[static_cast<size_t>(c)] =
            std::chrono::duration<double, std::milli>(Clock::now() - start).count();
      });
    }

    auto update = queue.submit(zf::WorkQueue::Priority::kLow, std::move(update_chunks));
    auto next_submit = Clock::now();
    while (!update->done()) {
      auto job = queue.submit(zf::WorkQueue::Priority::kHigh, {accumulate});
      job->wait();
      latency_ms.push_back(job->queued_seconds() * 1000.0);
      accumulate_run_ms.push_back((job->total_seconds() - job->queued_seconds()) * 1000.0);
      next_submit += std::chrono::milliseconds(options.accumulate_period_ms);
      const auto now = Clock::now();
      if (next_submit < now) next_submit = now;
      while (!update->done() && Clock::now() < next_submit) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    update->wait();
    update_seconds.push_back(update->total_seconds());
    chunk_ms.insert(chunk_ms.end(), round_chunk_ms.begin(), round_chunk_ms.end());
  }

  const double chunk_median_ms = median(chunk_ms);
  const double latency_median_ms = median(latency_ms);
  const double latency_max_ms = max_of(latency_ms);
  std::printf(
      "{\"benchmark\": \"lane_latency\", \"simd\": \"%s\", \"threads\": %d, \"update_elements\": %lld, "
      "\"chunk_elements\": %lld, \"accumulate_elements\": %lld, \"rounds\": %d, \"accumulates\": %zu, "
      "\"accumulate_latency_median_ms\": %.3f, \"accumulate_latency_max_ms\": %.3f, "
      "\"accumulate_run_median_ms\": %.3f, \"chunk_median_ms\": %.3f, \"update_seconds\": %.3f, "
      "\"latency_to_chunk_median\": %.3f, \"latency_to_chunk_max\": %.3f}\n",
      zf_simd_level_name(kernels.level), pool->size(), static_cast<long long>(n),
      static_cast<long long>(options.chunk_elements), static_cast<long long>(acc_n), options.rounds, latency_ms.size(),
      latency_median_ms, latency_max_ms, median(accumulate_run_ms), chunk_median_ms, median(update_seconds),
      chunk_median_ms > 0.0 ? latency_median_ms / chunk_median_ms : 0.0,
      chunk_median_ms > 0.0 ? latency_max_ms / chunk_median_ms : 0.0);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  if (!parse_options(argc, argv, &options)) {
    print_usage(argv[0]);
    return 2;
  }
  try {
    return run(options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_lane_latency: %s\n", e.what());
    return 1;
  }
}
