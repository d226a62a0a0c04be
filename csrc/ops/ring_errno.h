// EPL ring: error text for failed system calls, shared by the TCP transport and
// the shared-memory queue so both word their errors the same way.
#ifndef EPL_CSRC_OPS_RING_ERRNO_H_
#define EPL_CSRC_OPS_RING_ERRNO_H_

#include <errno.h>

#include <cstring>
#include <string>

namespace epl {
namespace ring {

// "what: strerror(code)". For calls that return their error code instead of
// setting errno (posix_fallocate).
inline std::string Errno(const std::string& what, int code) {
  return what + ": " + std::strerror(code);
}

// "what: strerror(errno)". Call it right after the failed call. `what` is built
// before errno is read; that only allocates memory, which does not normally
// touch errno (where it matters, save errno first and pass it as `code`).
inline std::string Errno(const std::string& what) { return Errno(what, errno); }

}  // namespace ring
}  // namespace epl

#endif  // EPL_CSRC_OPS_RING_ERRNO_H_
