// The staging ring (docs/design.md section 8, "The staging ring has two sides"), one part of
// the engine: the slots a bucket's deferred gradient columns pass through on their way to the
// host lane. Each slot holds a SlotHeader (step_scalars.hpp: the step's gradient scale and
// skip flag) in its first kHeaderBytes, then the packed columns.
//
// A device slot (in the engine's device memory) is free again once its last copy down has
// completed; a host slot (pinned on CUDA) once the host lane's job reading it is done. So the
// two sides turn independently. On the host backend they are one ring in the engine's memory,
// which the host lane reads in place (no copy down, no pinned slots).
//
// The ring orders nothing itself: the engine waits for a slot's job (back-pressure) and makes
// the compute lane wait for a device slot's last copy before writing it, records each copy
// down (set_copied) and each host-lane job (set_job).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/thread_pool.hpp"
#include "engine/backend.hpp"

namespace zf {

class StagingRing {
 public:
  static constexpr size_t kHeaderBytes = 256;
  struct Slot {
    size_t host, device;
  };

  // Slots for up to `packed_bytes` of packed columns: `host_slots` on the host side and
  // `device_slots` on the device (one ring of host_slots when `host_visible`).
  void plan(size_t packed_bytes, size_t host_slots, size_t device_slots, bool host_visible);
  // The bytes of the engine's device memory it needs; then where they are: at `offset` of the
  // arena whose base the engine keeps at *arena (attached or allocated later).
  size_t device_bytes() const { return stride_ * (host_visible_ ? jobs_.size() : copied_.size()); }
  void place(uint8_t* const* arena, size_t offset) {
    arena_ = arena;
    offset_ = offset;
  }
  // The pinned host slots (none on the host backend), at the engine's first use of its host
  // memory; release() frees them.
  void allocate(Backend* backend);
  void release() { pinned_ = PinnedBuffer(); }
  // Pinned bytes once allocated, and those held now.
  size_t pinned_bytes() const { return host_visible_ ? 0 : stride_ * jobs_.size(); }
  size_t pinned_capacity() const { return pinned_.size(); }

  size_t host_slots() const { return jobs_.size(); }
  uint8_t* device_slot(size_t slot) const { return *arena_ + offset_ + slot * stride_; }
  // Where the host lane reads host slot `slot` (its header, then the packed columns).
  uint8_t* host_slot(size_t slot) const {
    return (host_visible_ ? *arena_ + offset_ : pinned_.data()) + slot * stride_;
  }

  // The next host and device slots, in turn. *busy: the host lane's job that was reading the
  // host slot (the ring forgets it: the caller waits for it before using the slot), or
  // nullptr.
  Slot next(std::shared_ptr<WorkJob>* busy);
  // The next device slot alone (CUDA: a closing step's pack, copied down into U).
  size_t next_device() {
    const size_t slot = next_device_;
    next_device_ = (next_device_ + 1) % copied_.size();
    return slot;
  }
  // The device slot's last copy down (nullptr: none, or complete); the slot is free after it.
  const Event& copied(size_t device_slot) const { return copied_[device_slot]; }
  void set_copied(size_t device_slot, Event copied) { copied_[device_slot] = std::move(copied); }
  void set_job(size_t host_slot, std::shared_ptr<WorkJob> job) { jobs_[host_slot] = std::move(job); }
  // The host lane's jobs reading the host slots (nullptr where none).
  const std::vector<std::shared_ptr<WorkJob>>& jobs() const { return jobs_; }
  // Hands every job over (the caller waits for them) and leaves none.
  std::vector<std::shared_ptr<WorkJob>> take_jobs();
  // After the device was synchronised (a load, the engine's end): no copy is in flight, and
  // the next slots are the first.
  void forget_copies();

 private:
  size_t stride_ = 0;
  bool host_visible_ = true;
  uint8_t* const* arena_ = nullptr;
  size_t offset_ = 0;
  PinnedBuffer pinned_;
  std::vector<std::shared_ptr<WorkJob>> jobs_;  // per host slot
  std::vector<Event> copied_;                   // per device slot (none on the host backend)
  size_t next_host_ = 0, next_device_ = 0;
};

}  // namespace zf
