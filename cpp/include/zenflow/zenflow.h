/*
 * zenflow C ABI: everything. The common part (version, status codes, error text, tensor
 * descriptors, runtime control) is in types.h; each op family has its own header.
 *
 * Pure C (C99 and later) so that any runtime can link libzenflow without C++, Python or
 * torch. Every function returns a zf_status; on failure, zf_last_error() holds a message
 * for the calling thread that names the offending argument. A failed call writes nothing
 * to its outputs. No function calls exit() or abort(), and no C++ exception escapes.
 */
#ifndef ZENFLOW_ZENFLOW_H_
#define ZENFLOW_ZENFLOW_H_

#include "zenflow/types.h"

#include "zenflow/cpu_adamw.h"
#include "zenflow/engine.h"
#include "zenflow/norms.h"
#include "zenflow/optim.h"
#include "zenflow/pack.h"
#include "zenflow/topk.h"

#endif /* ZENFLOW_ZENFLOW_H_ */
