// An in-process communicator for the data-parallel engine tests: N ranks that are N threads
// of one process, each with its own zf_engine_collectives (zenflow/engine.h).
//
// Every call is two barriers: the ranks publish their buffers, wait for each other, each
// computes its result from everybody's buffers into a buffer of its own, waits again (so that
// no rank writes before every rank has read: in-place all-reduces and an all-gather whose
// output holds its input are safe), then writes. Sums run in rank order 0..N-1 in float
// (int64 for i32) and are rounded once per element, so every rank gets the same bits.
//
// It never hangs: a barrier that waits longer than the group's timeout fails the call with
// ZF_ERROR_INTERNAL ("timeout" in last_error) and breaks the group, as does a call whose
// function, count or dtype differs between the ranks ("mismatch"); once broken, every call of
// every rank fails at once. abort() breaks it from outside (a rank's thread that gives up).
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/float_convert.hpp"
#include "zenflow/engine.h"

namespace zf_test {

class InProcessGroup {
 public:
  enum Function { kAllReduce = 0, kReduceScatter = 1, kAllGather = 2, kFunctions = 3 };

  // Per rank and function: calls and payload bytes (count * element size, as the engine's
  // collective_bytes_* count them). Written by the rank's own thread: read them after the
  // ranks' threads have joined.
  struct Counts {
    int64_t calls[kFunctions] = {0, 0, 0};
    int64_t bytes[kFunctions] = {0, 0, 0};
    int64_t largest[kFunctions] = {0, 0, 0};  // the largest payload of one call
    int64_t total_bytes() const { return bytes[0] + bytes[1] + bytes[2]; }
    int64_t total_calls() const { return calls[0] + calls[1] + calls[2]; }
  };

  explicit InProcessGroup(int world_size, double timeout_seconds = 20.0)
      : world_(world_size), timeout_(std::chrono::duration<double>(timeout_seconds)) {
    for (int r = 0; r < world_size; ++r) {
      ranks_.push_back(std::make_unique<Rank>());
      ranks_.back()->group = this;
      ranks_.back()->rank = r;
    }
    slots_.resize(static_cast<size_t>(world_size));
  }
  InProcessGroup(const InProcessGroup&) = delete;
  InProcessGroup& operator=(const InProcessGroup&) = delete;

  int world_size() const { return world_; }

  // Rank r's functions; valid while the group lives.
  zf_engine_collectives collectives(int rank) {
    zf_engine_collectives c{};
    c.user = ranks_[static_cast<size_t>(rank)].get();
    c.rank = rank;
    c.world_size = world_;
    c.all_reduce_sum = &all_reduce_sum;
    c.reduce_scatter_sum = &reduce_scatter_sum;
    c.all_gather = &all_gather;
    c.last_error = &last_error;
    return c;
  }

  const Counts& counts(int rank) const { return ranks_[static_cast<size_t>(rank)]->counts; }
  // Rank r's last error message ("" when none).
  std::string error(int rank) const { return ranks_[static_cast<size_t>(rank)]->error; }
  // Barrier waits that ran out of time, and calls whose ranks disagreed, over the group's life.
  int64_t timeouts() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return timeouts_;
  }
  int64_t mismatches() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return mismatches_;
  }
  // Breaks the group: calls waiting now and every later call fail with `reason`.
  void abort(const std::string& reason) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!broken_) broken_reason_ = reason;
    broken_ = true;
    cv_.notify_all();
  }

  static size_t element_size(zf_dtype dtype) {
    switch (dtype) {
      case ZF_DTYPE_F32:
      case ZF_DTYPE_I32:
        return 4;
      case ZF_DTYPE_BF16:
      case ZF_DTYPE_F16:
        return 2;
      default:
        return 0;
    }
  }

 private:
  struct Rank {
    InProcessGroup* group = nullptr;
    int rank = 0;
    std::string error;
    Counts counts;
  };
  struct Slot {
    Function function = kAllReduce;
    const void* in = nullptr;
    void* out = nullptr;
    size_t count = 0;
    zf_dtype dtype = ZF_DTYPE_F32;
  };

  static const char* name(Function f) {
    return f == kAllReduce ? "all_reduce_sum" : f == kReduceScatter ? "reduce_scatter_sum" : "all_gather";
  }

  static float load(zf_dtype dtype, const void* base, size_t i) {
    switch (dtype) {
      case ZF_DTYPE_F32:
        return static_cast<const float*>(base)[i];
      case ZF_DTYPE_BF16:
        return zf::bf16_to_f32(static_cast<const uint16_t*>(base)[i]);
      default:
        return zf::f16_to_f32(static_cast<const uint16_t*>(base)[i]);
    }
  }
  static void store(zf_dtype dtype, void* base, size_t i, float value) {
    switch (dtype) {
      case ZF_DTYPE_F32:
        static_cast<float*>(base)[i] = value;
        break;
      case ZF_DTYPE_BF16:
        static_cast<uint16_t*>(base)[i] = zf::f32_to_bf16(value);
        break;
      default:
        static_cast<uint16_t*>(base)[i] = zf::f32_to_f16(value);
        break;
    }
  }

  // result[i] <- the sum over ranks q (in order) of slot q's in[offset + i], i < count.
  void sum_into(std::vector<unsigned char>& result, size_t offset, size_t count, zf_dtype dtype) const {
    result.resize(count * element_size(dtype));
    if (dtype == ZF_DTYPE_I32) {
      for (size_t i = 0; i < count; ++i) {
        int64_t acc = 0;
        for (const Slot& s : slots_) acc += static_cast<const int32_t*>(s.in)[offset + i];
        const int32_t v = static_cast<int32_t>(acc);
        std::memcpy(result.data() + i * 4, &v, 4);
      }
      return;
    }
    for (size_t i = 0; i < count; ++i) {
      float acc = load(dtype, slots_[0].in, offset + i);
      for (size_t q = 1; q < slots_.size(); ++q) acc += load(dtype, slots_[q].in, offset + i);
      store(dtype, result.data(), i, acc);
    }
  }

  zf_status fail(Rank& self, const std::string& message) {
    self.error = "in-process collectives, rank " + std::to_string(self.rank) + ": " + message;
    return ZF_ERROR_INTERNAL;
  }

  // The barrier: true when every rank arrived; false (and self.error set) on a timeout or a
  // broken group.
  bool wait_for_all(Rank& self) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (broken_) {
      self.error = "in-process collectives, rank " + std::to_string(self.rank) + ": group broken: " + broken_reason_;
      return false;
    }
    const uint64_t generation = generation_;
    if (++arrived_ == world_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return true;
    }
    cv_.wait_for(lock, timeout_, [&] { return generation_ != generation || broken_; });
    if (generation_ != generation) return true;
    if (!broken_) {
      ++timeouts_;
      broken_ = true;
      broken_reason_ = "timeout after " + std::to_string(timeout_.count()) + " s: " + std::to_string(arrived_) +
                       " of " + std::to_string(world_) + " ranks arrived (rank " + std::to_string(self.rank) +
                       " waiting)";
      cv_.notify_all();
    }
    self.error = "in-process collectives, rank " + std::to_string(self.rank) + ": " + broken_reason_;
    return false;
  }

  zf_status run(Rank& self, Function function, const void* in, void* out, size_t count, zf_dtype dtype) {
    const size_t size = element_size(dtype);
    if (size == 0) return fail(self, std::string(name(function)) + ": unsupported dtype");
    if (count > 0 && (in == nullptr || out == nullptr))
      return fail(self, std::string(name(function)) + ": NULL buffer");
    self.counts.calls[function] += 1;
    self.counts.bytes[function] += static_cast<int64_t>(count * size);
    self.counts.largest[function] = std::max(self.counts.largest[function], static_cast<int64_t>(count * size));
    slots_[static_cast<size_t>(self.rank)] = Slot{function, in, out, count, dtype};
    if (!wait_for_all(self)) return ZF_ERROR_INTERNAL;
    std::string mismatch;
    for (size_t q = 0; q < slots_.size(); ++q) {
      const Slot& s = slots_[q];
      if (s.function != function || s.count != count || s.dtype != dtype) {
        mismatch = "mismatch: rank " + std::to_string(self.rank) + " called " + name(function) + "(count " +
                   std::to_string(count) + ", " + zf_dtype_name(dtype) + "), rank " + std::to_string(q) + " " +
                   name(s.function) + "(count " + std::to_string(s.count) + ", " + zf_dtype_name(s.dtype) + ")";
        break;
      }
    }
    std::vector<unsigned char> result;
    if (mismatch.empty()) {
      if (function == kAllReduce) {
        sum_into(result, 0, count, dtype);
      } else if (function == kReduceScatter) {
        sum_into(result, static_cast<size_t>(self.rank) * count, count, dtype);
      } else {
        result.resize(slots_.size() * count * size);
        for (size_t q = 0; q < slots_.size(); ++q)
          if (count > 0) std::memcpy(result.data() + q * count * size, slots_[q].in, count * size);
      }
    }
    if (!wait_for_all(self)) return ZF_ERROR_INTERNAL;  // every rank has read before anyone writes
    if (!mismatch.empty()) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (self.rank == 0) ++mismatches_;
      }
      abort(mismatch);
      return fail(self, mismatch);
    }
    if (!result.empty()) std::memcpy(out, result.data(), result.size());
    return ZF_SUCCESS;
  }

  static zf_status all_reduce_sum(void* user, void* data, size_t count, zf_dtype dtype, zf_stream) {
    Rank& self = *static_cast<Rank*>(user);
    return self.group->run(self, kAllReduce, data, data, count, dtype);
  }
  static zf_status reduce_scatter_sum(void* user, const void* in, void* out, size_t count, zf_dtype dtype, zf_stream) {
    Rank& self = *static_cast<Rank*>(user);
    return self.group->run(self, kReduceScatter, in, out, count, dtype);
  }
  static zf_status all_gather(void* user, const void* in, void* out, size_t count, zf_dtype dtype, zf_stream) {
    Rank& self = *static_cast<Rank*>(user);
    return self.group->run(self, kAllGather, in, out, count, dtype);
  }
  static const char* last_error(void* user) { return static_cast<Rank*>(user)->error.c_str(); }

  const int world_;
  const std::chrono::duration<double> timeout_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  std::vector<Slot> slots_;  // rank q's call, written by q before the first barrier of a call
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool broken_ = false;
  std::string broken_reason_;
  int64_t timeouts_ = 0, mismatches_ = 0;
};

}  // namespace zf_test
