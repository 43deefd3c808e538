// stats(): counters of the engine and its lanes (zf_engine_stats in zenflow/engine.h).
#include "engine/engine.hpp"

namespace zf {

zf_engine_stats Engine::stats() const {
  zf_engine_stats s{};
  s.steps = schedule_.step();
  s.windows = windows_;
  s.reselections = reselections_;
  s.skipped_steps = skipped_steps_;
  s.last_global_norm = last_norm_;
  s.stall_seconds_window_close = stall_close_;
  s.stall_seconds_back_pressure = stall_back_pressure_;
  s.stall_seconds_flush = stall_flush_;
  s.host_update_seconds = lane_->update_seconds();
  s.accumulate_seconds = lane_->accumulate_seconds();
  s.bytes_down = bytes_down_;
  s.bytes_up = bytes_up_;
  int64_t selected = 0, columns = 0, host_bytes = 0;
  column_counts(&selected, &columns);
  for (const Matrix& m : matrices_) {
    // master, m, v, two accumulators (fp32) and the step counts
    host_bytes += 5 * 4 * m.rows * m.own_cols + 4 * m.own_cols;  // this rank's columns
  }
  s.selected_fraction = columns > 0 ? static_cast<double>(selected) / static_cast<double>(columns) : 0.0;
  s.device_state_bytes = static_cast<int64_t>(device_state_bytes_);
  // What the engine holds once it has stepped (allocated at first use: ensure_host_memory).
  // The host backend has no pinned staging slots: its host lane reads the device slots.
  const auto slots = static_cast<int64_t>(ring_.pinned_bytes());
  const auto records = static_cast<int64_t>(ScalarReadback::host_bytes());
  const auto upload = static_cast<int64_t>(upload_bytes_) * upload_copies_;
  s.host_state_bytes = host_bytes + upload + slots;
  s.stall_seconds_readback = stall_readback_;
  s.device_bytes = static_cast<int64_t>(arena_.bytes());
  s.pinned_host_bytes = upload + slots + records;
  s.collective_bytes_statistics = collective_stats_bytes_;
  s.collective_bytes_gradients = collective_gradient_bytes_;
  s.collective_bytes_upload = collective_upload_bytes_;
  s.host_lane_bytes_read = host_bytes_read_.load(std::memory_order_relaxed);
  s.host_lane_bytes_written = host_bytes_written_.load(std::memory_order_relaxed);
  s.held_gradient_bytes_peak = held_gradient_bytes_peak_;
  s.synchronous_start_steps = schedule_.warm_up_steps();
  s.host_lane_wait_seconds = lane_->wait_seconds();
  return s;
}

size_t Engine::host_memory_capacity() const {
  size_t bytes = ring_.pinned_capacity() + upload_.size() + scalar_readback_.host_capacity();
  for (const Matrix& m : matrices_) {
    for (const StreamedVector<float>* v : m.host_arrays()) bytes += v->capacity() * sizeof(float);
    bytes += m.steps.capacity() * sizeof(int32_t);
  }
  return bytes;
}

std::vector<const void*> Engine::host_stream_bases_for_testing() const {
  std::vector<const void*> bases;
  for (const Matrix& m : matrices_) {
    for (const StreamedVector<float>* v : m.host_arrays())
      if (!v->empty()) bases.push_back(v->data());
  }
  for (size_t slot = 0; slot < ring_.host_slots(); ++slot) bases.push_back(ring_.host_slot(slot) + kSlotHeaderBytes);
  for (int copy = 0; copy < upload_copies_ && upload_.data() != nullptr; ++copy) bases.push_back(upload_copy(copy));
  return bases;
}

std::vector<std::pair<const void*, size_t>> Engine::host_stream_blocks_for_testing() const {
  std::vector<std::pair<const void*, size_t>> blocks;
  for (const Matrix& m : matrices_) {
    for (const StreamedVector<float>* v : m.host_arrays())
      if (v->capacity() > 0) blocks.emplace_back(v->data(), v->capacity() * sizeof(float));
  }
  if (upload_.data() != nullptr) blocks.emplace_back(upload_.data(), upload_.size());
  if (backend_->host_visible() && arena_.exists() && arena_.owned()) blocks.emplace_back(arena_.base(), arena_.bytes());
  return blocks;
}

void Engine::column_counts(int64_t* selected, int64_t* columns) const {
  *selected = *columns = 0;
  for (const Matrix& m : matrices_) {
    *selected += static_cast<int64_t>(m.selected.size());
    *columns += m.cols;
  }
}

}  // namespace zf
