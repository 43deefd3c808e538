// The step scalars' way to the host (docs/design.md section 8), one part of the engine. A
// step whose next host decision needs its scalars (the host backend, dynamic loss scaling)
// reads them at once (read_now). On CUDA without loss scaling a step goes on without them: a
// non-finite gradient makes every device op a no-op through the skip flag, and the scalars
// are copied down into a ring of kRecords pinned records that a later call looks at once
// the copy is complete (record, then consume), so no step waits for its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "common/step_scalars.hpp"
#include "engine/backend.hpp"

namespace zf {

class ScalarReadback {
 public:
  static constexpr size_t kRecords = 8;
  // The device ring the engine's arena holds for it (one entry per record).
  static constexpr size_t device_bytes() { return kRecords * sizeof(StepScalars); }
  // Its pinned host records: the ring, then one for read_now.
  static constexpr size_t host_bytes() { return (kRecords + 1) * sizeof(StepScalars); }

  // The pinned records, at the engine's first use of its host memory; release() frees them.
  void allocate(Backend* backend) { records_ = PinnedBuffer(backend, host_bytes()); }
  void release() {
    pending_.clear();
    records_ = PinnedBuffer();
  }
  size_t host_capacity() const { return records_.size(); }
  bool empty() const { return pending_.empty(); }
  // Forgets the records not looked at yet (a load, a failed device, a non-finite step).
  void clear() { pending_.clear(); }

  // The scalars at `device` after the compute lane's work so far; blocks until they are
  // here. `stall` (may be NULL) gets the wait.
  StepScalars read_now(Backend& backend, const StepScalars* device, double* stall);

  // What a record says, with the step it belongs to. A consumer may throw (a non-finite
  // gradient): the record is then consumed and the rest stay queued unless it clear()s them.
  using Consumer = std::function<void(const StepScalars& scalars, int64_t step)>;

  // Copies the scalars at `device` down for step `step`, through `ring` (device_bytes() of
  // the engine's device memory: the next step rewrites `device` on the compute lane while the
  // copy may still wait on the down lane). A full ring first consumes its oldest record.
  void record(Backend& backend, const StepScalars* device, uint8_t* ring, int64_t step, const Consumer& consume,
              double* stall);
  // Consumes the records whose copies have completed (every record when `wait`), oldest
  // first; `stall` gets the waits.
  void consume_ready(Backend& backend, bool wait, const Consumer& consume, double* stall);

 private:
  struct Pending {
    size_t record;
    Event copied;
    int64_t step;
  };
  void consume_oldest(Backend& backend, size_t count, const Consumer& consume, double* stall);
  StepScalars* host_record(size_t i) const { return reinterpret_cast<StepScalars*>(records_.data()) + i; }

  PinnedBuffer records_;
  std::vector<Pending> pending_;
  size_t next_ = 0;
};

}  // namespace zf
