// The configuration table's rules that the C ABI tests (c_abi_test.c) do not reach: the
// thread split's rounding, which follows DeepSpeed's _split_affinity (issue 27), and the
// loss scaler's fields meeting the checkpoint.
#include <gtest/gtest.h>

#include "common/thread_pool.hpp"
#include "zenflow/engine.h"

namespace {

// DeepSpeed's tests/unit/runtime/zenflow/test_zf.py::test_split_affinity: the framework keeps
// ceil(share * cores), the host lane the rest. The old rule (floor) gave 0.1 of 8 cores no
// reserve at all and 0.25 of 2 cores none either, so both sides took every core.
TEST(EngineConfig, ReservedCoresRoundUpAsDeepSpeed) {
  EXPECT_EQ(zf::reserved_split_thread_count(8, 0.25), 6);
  EXPECT_EQ(zf::reserved_split_thread_count(8, 0.1), 7);
  EXPECT_EQ(zf::reserved_split_thread_count(2, 0.5), 1);
  EXPECT_EQ(zf::reserved_split_thread_count(2, 0.25), 1);
  EXPECT_EQ(zf::reserved_split_thread_count(4, 0.0), 4);  // DeepSpeed: the full set too
  // A reserve of every core: DeepSpeed shares the full set; zenflow keeps one host thread
  // (a deliberate difference, docs/usage.md).
  EXPECT_EQ(zf::reserved_split_thread_count(4, 1.0), 1);
  EXPECT_EQ(zf::reserved_split_thread_count(1, 0.5), 1);
}

TEST(EngineConfig, DefaultsPassTheirOwnChecksAndEveryKeyIsListed) {
  const zf_engine_config d = zf_engine_config_default();
  EXPECT_EQ(zf_engine_config_check(&d), ZF_SUCCESS);
  EXPECT_EQ(zf_engine_config_check_deepspeed(&d), ZF_SUCCESS);
  zf_engine_config_key k{};
  ASSERT_EQ(zf_engine_config_key_at(zf_engine_config_key_count() - 1, &k), ZF_SUCCESS);
  EXPECT_STREQ(k.name, "auto_warm_up_rounds");  // the last field of the struct
  EXPECT_EQ(k.offset + k.size, offsetof(zf_engine_config, auto_warm_up_rounds) + sizeof(int64_t));
}

}  // namespace
