// StagingRing (staging_ring.hpp).
#include "engine/staging_ring.hpp"

#include <utility>

namespace zf {

void StagingRing::plan(size_t packed_bytes, size_t host_slots, size_t device_slots, bool host_visible) {
  stride_ = (kHeaderBytes + packed_bytes + 255) / 256 * 256;
  host_visible_ = host_visible;
  pinned_ = PinnedBuffer();
  jobs_.assign(host_slots, nullptr);
  copied_.assign(host_visible ? 0 : device_slots, nullptr);
  next_host_ = next_device_ = 0;
}

void StagingRing::allocate(Backend* backend) {
  if (!host_visible_) pinned_ = PinnedBuffer(backend, pinned_bytes());
}

StagingRing::Slot StagingRing::next(std::shared_ptr<WorkJob>* busy) {
  Slot slot{next_host_, next_host_};
  next_host_ = (next_host_ + 1) % jobs_.size();
  *busy = std::move(jobs_[slot.host]);
  jobs_[slot.host].reset();
  if (!host_visible_) {
    slot.device = next_device_;
    next_device_ = (next_device_ + 1) % copied_.size();
  }
  return slot;
}

std::vector<std::shared_ptr<WorkJob>> StagingRing::take_jobs() {
  std::vector<std::shared_ptr<WorkJob>> out(jobs_.size());
  for (size_t i = 0; i < jobs_.size(); ++i) out[i] = std::move(jobs_[i]);
  jobs_.assign(jobs_.size(), nullptr);
  return out;
}

void StagingRing::forget_copies() {
  copied_.assign(copied_.size(), nullptr);
  next_host_ = next_device_ = 0;
}

}  // namespace zf
