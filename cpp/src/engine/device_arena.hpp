// The engine's device memory (docs/design.md section 8, "The engine's parts"), one part of
// the engine: a single block that holds every device region of the engine (the compact
// selected state, the selections, the column sums, the step scalars, the staging slots, data
// parallel's buffers, ...). The engine lays its regions out (take(), each 256-byte aligned)
// whenever its plan changes, before the block exists; the block is then attached by the
// caller (zf_engine_attach_device_memory) or allocated through the backend at first use, and
// zeroed once. An allocated block is freed with the arena's free(); an attached one stays the
// caller's.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/backend.hpp"

namespace zf {

class DeviceArena {
 public:
  // A new layout: no region yet (the block must not exist).
  void start_layout() { bytes_ = 0; }
  // A region of `bytes`; returns its offset in the block.
  size_t take(size_t bytes) {
    const size_t at = bytes_;
    bytes_ += (bytes + 255) / 256 * 256;
    return at;
  }
  size_t bytes() const { return bytes_; }

  // The block (nullptr before it exists), and where the engine's parts find it later.
  uint8_t* base() const { return base_; }
  uint8_t* const* base_address() const { return &base_; }
  bool exists() const { return base_ != nullptr; }
  bool owned() const { return owned_; }

  // The caller's block: at least bytes() bytes, 256-byte aligned, once, before any use
  // (zf::Error naming the argument otherwise; nothing changes then).
  void attach(void* memory, size_t bytes);
  // Allocates the block through `backend` when there is none (and the layout needs one);
  // returns whether it did.
  bool ensure(Backend& backend);
  // Frees an allocated block (an attached one is the caller's); after every lane is done.
  void free(Backend& backend);

 private:
  uint8_t* base_ = nullptr;
  size_t bytes_ = 0;
  size_t allocated_bytes_ = 0;  // what ensure() asked the backend for (its free takes it back)
  bool owned_ = false;
};

}  // namespace zf
