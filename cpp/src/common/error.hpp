// Errors inside libzenflow: C++ exceptions carrying a zf_status, turned into a status code
// and thread-local text at the C boundary by api_call().
#pragma once

#include <exception>
#include <new>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include "zenflow/zenflow.h"

namespace zf {

class Error : public std::runtime_error {
 public:
  Error(zf_status status, const std::string& message) : std::runtime_error(message), status_(status) {}
  zf_status status() const noexcept { return status_; }

 private:
  zf_status status_;
};

namespace detail {
inline void append_all(std::ostringstream&) {}
template <class T, class... Rest>
void append_all(std::ostringstream& out, const T& first, const Rest&... rest) {
  out << first;
  append_all(out, rest...);
}
}  // namespace detail

// Builds the message from streamable parts: fail(ZF_ERROR_INVALID_VALUE, "k=", k, " > n=", n).
template <class... Parts>
[[noreturn]] void fail(zf_status status, const Parts&... parts) {
  std::ostringstream out;
  detail::append_all(out, parts...);
  throw Error(status, out.str());
}

template <class... Parts>
void require(bool condition, zf_status status, const Parts&... parts) {
  if (!condition) fail(status, parts...);
}

void set_last_error(const std::string& message);
void clear_last_error();

// Runs body() and converts any exception into a status; the only way the C entry points
// call into C++, so nothing escapes extern "C".
template <class Body>
zf_status api_call(Body&& body) noexcept {
  try {
    clear_last_error();
    body();
    return ZF_SUCCESS;
  } catch (const Error& e) {
    set_last_error(e.what());
    return e.status();
  } catch (const std::bad_alloc&) {
    set_last_error("out of host memory");
    return ZF_ERROR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    set_last_error(std::string("internal error: ") + e.what());
    return ZF_ERROR_INTERNAL;
  } catch (...) {
    set_last_error("internal error: unknown exception");
    return ZF_ERROR_INTERNAL;
  }
}

}  // namespace zf
