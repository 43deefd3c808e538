#include "engine/scalar_readback.hpp"

#include <chrono>

namespace zf {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

StepScalars ScalarReadback::read_now(Backend& backend, const StepScalars* device, double* stall) {
  if (backend.host_visible()) return *device;
  const auto start = std::chrono::steady_clock::now();
  StepScalars* record = host_record(kRecords);
  backend.wait(Lane::kDown, backend.record(Lane::kCompute));
  backend.copy_down(record, device, sizeof(StepScalars));
  backend.host_wait(backend.record(Lane::kDown));
  if (stall != nullptr) *stall += seconds_since(start);
  return *record;
}

void ScalarReadback::record(Backend& backend, const StepScalars* device, uint8_t* ring, int64_t step,
                            const Consumer& consume, double* stall) {
  // A ring entry is reused only after its copy was consumed.
  if (pending_.size() == kRecords) consume_oldest(backend, 1, consume, stall);
  const size_t record = next_;
  next_ = (next_ + 1) % kRecords;
  uint8_t* entry = ring + record * sizeof(StepScalars);
  backend.copy_device(entry, device, sizeof(StepScalars));
  backend.wait(Lane::kDown, backend.record(Lane::kCompute));
  backend.copy_down(host_record(record), entry, sizeof(StepScalars));
  pending_.push_back(Pending{record, backend.record(Lane::kDown), step});
}

void ScalarReadback::consume_ready(Backend& backend, bool wait, const Consumer& consume, double* stall) {
  size_t ready = 0;
  while (ready < pending_.size() && (wait || backend.done(pending_[ready].copied))) ++ready;
  consume_oldest(backend, ready, consume, stall);
}

void ScalarReadback::consume_oldest(Backend& backend, size_t count, const Consumer& consume, double* stall) {
  for (size_t i = 0; i < count && !pending_.empty(); ++i) {
    const Pending pending = pending_.front();
    pending_.erase(pending_.begin());
    const auto start = std::chrono::steady_clock::now();
    backend.host_wait(pending.copied);
    if (stall != nullptr) *stall += seconds_since(start);
    consume(*host_record(pending.record), pending.step);
  }
}

}  // namespace zf
