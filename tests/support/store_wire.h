// tests/support/store_wire.h: builds TcpStore wire bytes by hand (comm/tcp_store.h: host byte order, strings as
// u32 length + bytes), for the tests that feed the server's parser or a raw socket what a client, or a stranger,
// would send.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace dpt::test {

struct StoreBytes {
  std::vector<uint8_t> b;
  template <class T>
  StoreBytes& put(T v) {
    const size_t at = b.size();
    b.resize(at + sizeof v);
    std::memcpy(b.data() + at, &v, sizeof v);
    return *this;
  }
  StoreBytes& str(const std::string& s) {
    put(static_cast<uint32_t>(s.size()));
    const size_t at = b.size();
    b.resize(at + s.size());
    if (!s.empty()) std::memcpy(b.data() + at, s.data(), s.size());
    return *this;
  }
};

}  // namespace dpt::test
