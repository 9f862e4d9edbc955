// core/net.h: small network helpers shared by the launcher, the comm layer and the tests.
#pragma once

#include <string>

namespace dpt {

// A TCP port on `addr` (IPv4) that nothing was bound to a moment ago: binds port 0, reads the port the
// kernel chose, closes. Throws ConfigError for a malformed address and CommError when a socket call fails.
int find_free_port(const std::string& addr = "127.0.0.1");

}  // namespace dpt
