// core/net.cpp: find_free_port.
#include "core/net.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/check.h"

namespace dpt {

int find_free_port(const std::string& addr) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = 0;  // the kernel picks a free one
  if (::inet_pton(AF_INET, addr.c_str(), &sa.sin_addr) != 1) {
    DPT_THROW(ConfigError, "find_free_port: '{}' is not an IPv4 address", addr);
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) DPT_THROW(CommError, "finding a free port: socket failed: {}", std::strerror(errno));
  std::string error;
  socklen_t len = sizeof sa;
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) != 0) {
    error = fmt::format("bind to {}:0 failed: {}", addr, std::strerror(errno));
  } else if (::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    error = fmt::format("getsockname failed: {}", std::strerror(errno));
  }
  // Closing a socket that never listened leaves no TIME_WAIT behind: the port is free for rank 0 at once.
  ::close(fd);
  if (!error.empty()) DPT_THROW(CommError, "finding a free port: {}", error);
  return ntohs(sa.sin_port);
}

}  // namespace dpt
