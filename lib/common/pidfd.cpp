#include "common/pidfd.hpp"

#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>

namespace ddp {

bool pidfd_exited_within(int pidfd, std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  for (;;) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
    pollfd p{pidfd, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::max<std::int64_t>(left.count(), 0)));
    if (r > 0) return true;
    if (r == 0 || errno != EINTR) return false;
  }
}

}  // namespace ddp
