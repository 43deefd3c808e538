// The engine's configuration table (engine.h: zf_engine_config_key): every field's name, type,
// default, range, meaning and DeepSpeed key, in one place. zf_engine_config_default() is built
// from it, check_config_table() checks a configuration against it (and the few rules that tie
// two fields together), and the C ABI hands it to bindings, which parse and document their
// config objects from it instead of keeping rules of their own.
#ifndef ZENFLOW_ENGINE_CONFIG_TABLE_HPP_
#define ZENFLOW_ENGINE_CONFIG_TABLE_HPP_

#include <cstddef>

#include "zenflow/engine.h"

namespace zf {

// The defaults of every field (zf_engine_config_default).
zf_engine_config config_defaults();
// Refuses a configuration that breaks a rule of the table, naming the field (ZF_ERROR_INVALID_VALUE).
void check_config_table(const zf_engine_config& config);
// check_config_table plus DeepSpeed's zenflow rules (zf_engine_config_check_deepspeed).
void check_config_deepspeed(const zf_engine_config& config);

}  // namespace zf

#endif  // ZENFLOW_ENGINE_CONFIG_TABLE_HPP_
