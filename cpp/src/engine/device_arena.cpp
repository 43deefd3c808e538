// DeviceArena (device_arena.hpp).
#include "engine/device_arena.hpp"

#include "common/error.hpp"

namespace zf {

void DeviceArena::attach(void* memory, size_t bytes) {
  require(base_ == nullptr, ZF_ERROR_INVALID_VALUE,
          "memory: device memory is attached once, before the first step or load");
  require(memory != nullptr || bytes_ == 0, ZF_ERROR_INVALID_VALUE, "memory: NULL");
  require(bytes >= bytes_, ZF_ERROR_INVALID_VALUE, "bytes: ", bytes, " < the ", bytes_,
          " bytes zf_engine_device_memory_size asks for");
  require(reinterpret_cast<uintptr_t>(memory) % 256 == 0, ZF_ERROR_INVALID_VALUE, "memory: not 256-byte aligned");
  base_ = static_cast<uint8_t*>(memory);
  owned_ = false;
}

bool DeviceArena::ensure(Backend& backend) {
  if (base_ != nullptr || bytes_ == 0) return false;
  base_ = static_cast<uint8_t*>(backend.allocate_device(bytes_));
  allocated_bytes_ = bytes_;
  owned_ = true;
  return true;
}

void DeviceArena::free(Backend& backend) {
  if (owned_ && base_ != nullptr) backend.free_device(base_, allocated_bytes_);
  base_ = nullptr;
  owned_ = false;
}

}  // namespace zf
