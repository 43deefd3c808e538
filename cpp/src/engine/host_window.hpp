// The host side's windows (docs/design.md section 8), one of the engine's parts: the open
// window, which of the two accumulators (A[0], A[1]) it fills, how many steps it holds and
// the values its host update will run with (its last step's learning rates, weight decays,
// betas and eps); and the closed window whose host update was started and whose result (in
// one of the upload copies U[0], U[1]) has not gone up yet, with, per copy, the event after
// which it may be written again.
//
// It decides nothing: the engine's step closes a window when the schedule says so, starts
// its update on the host lane and uploads the result at the landing step (step.cpp). This
// part keeps their state in one place, so that a checkpoint, a flush and a poll of the host
// lane read and write the same few fields. Training thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "common/thread_pool.hpp"
#include "engine/backend.hpp"
#include "zenflow/engine.h"
#include "zenflow/optim.h"

namespace zf {

class HostWindow {
 public:
  // Before any step: an update would run with the groups' own values.
  void init(const std::vector<zf_engine_group>& groups, const zf_adam_hparams& hparams) {
    lrs_.resize(groups.size());
    for (size_t g = 0; g < groups.size(); ++g) lrs_[g] = groups[g].lr;
    take_values(groups, hparams);
  }

  // ---- the open window ----
  int filling() const { return filling_; }  // the accumulator its steps add into
  int64_t steps() const { return steps_; }
  // One more step accumulated, with the values of the window's update from now on: the
  // step's learning rates, the groups' weight decays and the betas and eps.
  void add_step(const std::vector<double>& lrs, const std::vector<zf_engine_group>& groups,
                const zf_adam_hparams& hparams) {
    ++steps_;
    lrs_ = lrs;
    take_values(groups, hparams);
  }
  double lr(size_t group) const { return lrs_[group]; }
  double weight_decay(size_t group) const { return weight_decays_[group]; }
  const zf_adam_hparams& hparams() const { return hparams_; }

  // Closes it: `job` runs its update (nullptr: nothing to run on this rank), writing its
  // result into upload copy `buffer`; `pending`, a result is owed to the weights (data
  // parallel: also with no job here, for the all-gathers). The next window fills the other
  // accumulator.
  void close(std::shared_ptr<WorkJob> job, bool pending, int buffer) {
    job_ = std::move(job);
    pending_ = pending;
    result_buffer_ = buffer;
    filling_ ^= 1;
    steps_ = 0;
  }

  // ---- the closed window's update ----
  bool pending() const { return pending_; }
  // The upload copy holding the last result (owed while pending, else gone up).
  int result_buffer() const { return result_buffer_; }
  // The running (or finished, not yet waited for) update; nullptr when none.
  const std::shared_ptr<WorkJob>& job() const { return job_; }
  // Its result goes up: the pending flag is cleared and the job handed over to be waited for.
  std::shared_ptr<WorkJob> take_for_upload() {
    pending_ = false;
    return std::exchange(job_, nullptr);
  }
  // Upload copy `buffer` is read by the copies up until this event completes.
  const Event& uploaded(int buffer) const { return uploaded_[buffer]; }
  void set_uploaded(int buffer, Event event) { uploaded_[buffer] = std::move(event); }

  // A loaded state: the open window holds `steps` in A[0]; `pending`, a result is owed (in
  // U[0]). The caller waited for the job and dropped it and U's events (forget_job,
  // forget_uploaded).
  void restore(int64_t steps, bool pending) {
    filling_ = 0;
    steps_ = steps;
    pending_ = pending;
    result_buffer_ = 0;
  }
  // The update no longer runs (the caller waited for it); its result stays owed.
  void forget_job() { job_.reset(); }
  void forget_uploaded() {
    uploaded_[0].reset();
    uploaded_[1].reset();
  }

 private:
  void take_values(const std::vector<zf_engine_group>& groups, const zf_adam_hparams& hparams) {
    weight_decays_.resize(groups.size());
    for (size_t g = 0; g < groups.size(); ++g) weight_decays_[g] = groups[g].weight_decay;
    hparams_ = hparams;
  }

  int filling_ = 0;
  int64_t steps_ = 0;
  std::vector<double> lrs_, weight_decays_;  // per group
  zf_adam_hparams hparams_{};
  std::shared_ptr<WorkJob> job_;
  bool pending_ = false;
  int result_buffer_ = 0;
  Event uploaded_[2];
};

}  // namespace zf
