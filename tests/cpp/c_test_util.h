/* What the C tests of the ABI share (c_api_test.c, c_abi_test.c): a failure counter, the
 * EXPECT macros, and a 1-D CPU descriptor. Plain C99. */
#ifndef ZENFLOW_TESTS_C_TEST_UTIL_H_
#define ZENFLOW_TESTS_C_TEST_UTIL_H_

#include <stdio.h>
#include <string.h>

#include "zenflow/zenflow.h"

static int failures = 0;
#define EXPECT(cond)                                                     \
  do {                                                                   \
    if (!(cond)) {                                                       \
      fprintf(stderr, "%s:%d: failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                        \
    }                                                                    \
  } while (0)
/* A call that must fail with `status` and a message containing `text`. */
#define EXPECT_ERROR(call, status, text)                                                                       \
  do {                                                                                                         \
    zf_status got_ = (call);                                                                                   \
    if (got_ != (status) || strstr(zf_last_error(), (text)) == NULL) {                                         \
      fprintf(stderr, "%s:%d: %s\n  returned %s \"%s\", expected %s with \"%s\"\n", __FILE__, __LINE__, #call, \
              zf_status_string(got_), zf_last_error(), zf_status_string(status), (text));                      \
      ++failures;                                                                                              \
    }                                                                                                          \
  } while (0)
#define EXPECT_OK(call)                                                                                    \
  do {                                                                                                     \
    zf_status got_ = (call);                                                                               \
    if (got_ != ZF_SUCCESS) {                                                                              \
      fprintf(stderr, "%s:%d: %s\n  returned %s: %s\n", __FILE__, __LINE__, #call, zf_status_string(got_), \
              zf_last_error());                                                                            \
      ++failures;                                                                                          \
    }                                                                                                      \
  } while (0)

static zf_tensor tensor_1d(void* data, zf_dtype dtype, int64_t n) {
  zf_tensor t;
  memset(&t, 0, sizeof(t));
  t.data = data;
  t.dtype = dtype;
  t.device.type = ZF_DEVICE_CPU;
  t.ndim = 1;
  t.shape[0] = n;
  t.strides[0] = 1;
  return t;
}

#endif /* ZENFLOW_TESTS_C_TEST_UTIL_H_ */
