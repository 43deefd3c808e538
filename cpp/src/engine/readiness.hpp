// Which gradients of a split step are ready, and which runs of them to submit (engine.h:
// zf_engine_mark_ready). A framework's backward hooks say "parameter i's gradient is ready"
// in whatever order autograd produces them; the engine hands contiguous runs of ready
// parameters to submit once a run holds at least `threshold` gradient bytes, so that work on
// the step starts during backward in buckets of a useful size. The rest is submitted when
// the step ends. Plain bookkeeping, no engine state: tested alone (test_readiness.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace zf {

class ReadyRuns {
 public:
  struct Range {
    size_t first = 0, stop = 0;  // parameters [first, stop)
    bool empty() const { return first == stop; }
  };

  // A new split step over `count` parameters: none ready.
  void reset(size_t count);
  size_t size() const { return status_.size(); }

  // Parameter i's gradient (of `bytes` bytes) is ready. Returns the run it completes when
  // the run reached `threshold` bytes (the caller submits it, then calls submitted()), else
  // an empty range. A parameter ready again before its run was submitted changes nothing
  // (its gradient is read at submit, accumulated by then); one ready again after its run
  // was submitted is recorded (arrived_after_submit): what was submitted is not its whole
  // gradient, so the step must be taken again from the final gradients.
  Range mark(size_t i, size_t bytes, size_t threshold);
  // The parameters [first, stop) were submitted (by a run from mark(), or directly).
  void submitted(size_t first, size_t stop);
  // The runs not yet submitted, in order (ready or not).
  std::vector<Range> unsubmitted() const;
  bool is_submitted(size_t i) const { return status_[i] == kSubmitted; }
  // The first parameter whose gradient arrived again after it was submitted, or size().
  size_t arrived_after_submit() const { return arrived_again_; }

 private:
  enum : uint8_t { kWaiting = 0, kReady = 1, kSubmitted = 2 };
  std::vector<uint8_t> status_;
  // A run of ready, unsubmitted parameters is kept at its two ends: run_start_ at its last
  // index, run_end_ at its first, run_bytes_ at both.
  std::vector<size_t> run_start_, run_end_, run_bytes_;
  size_t arrived_again_ = 0;
};

}  // namespace zf
