// ReadyRuns (readiness.hpp).
#include "engine/readiness.hpp"

#include <algorithm>

namespace zf {

void ReadyRuns::reset(size_t count) {
  status_.assign(count, kWaiting);
  run_start_.assign(count, 0);
  run_end_.assign(count, 0);
  run_bytes_.assign(count, 0);
  arrived_again_ = count;
}

ReadyRuns::Range ReadyRuns::mark(size_t i, size_t bytes, size_t threshold) {
  if (status_[i] == kSubmitted) {
    arrived_again_ = std::min(arrived_again_, i);
    return {};
  }
  if (status_[i] == kReady) return {};
  size_t start = i, end = i, total = bytes;
  // Join the runs on either side (each kept at its ends).
  if (i > 0 && status_[i - 1] == kReady) {
    start = run_start_[i - 1];
    total += run_bytes_[i - 1];
  }
  if (i + 1 < status_.size() && status_[i + 1] == kReady) {
    end = run_end_[i + 1];
    total += run_bytes_[i + 1];
  }
  status_[i] = kReady;
  if (total >= threshold) return Range{start, end + 1};
  run_start_[end] = start;
  run_end_[start] = end;
  run_bytes_[start] = run_bytes_[end] = total;
  return {};
}

void ReadyRuns::submitted(size_t first, size_t stop) {
  for (size_t j = first; j < stop; ++j) status_[j] = kSubmitted;
}

std::vector<ReadyRuns::Range> ReadyRuns::unsubmitted() const {
  std::vector<Range> out;
  size_t j = 0;
  while (j < status_.size()) {
    if (status_[j] == kSubmitted) {
      ++j;
      continue;
    }
    const size_t first = j;
    while (j < status_.size() && status_[j] != kSubmitted) ++j;
    out.push_back(Range{first, j});
  }
  return out;
}

}  // namespace zf
