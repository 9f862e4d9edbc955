// tests/unit/comm/test_store_protocol.cpp: the TcpStore server's request decoding (sp::parse_store_request,
// the code serve() runs) and its bounds: oversized keys, values and key lists and unknown commands are refused
// with a message; a hostile client is dropped while the others keep working; the client refuses to send what
// the server would refuse; counters do not overflow; endless WAIT timeouts stay endless.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <climits>
#include <cstring>
#include <thread>
#include <vector>

#include "comm/store.h"
#include "comm/tcp_store.h"
#include "core/check.h"
#include "tests/support/store_wire.h"

using namespace dpt;
using namespace dpt::comm;
using namespace std::chrono_literals;
using Catch::Matchers::Contains;
namespace sp = dpt::comm::detail;

namespace {

using Bytes = dpt::test::StoreBytes;  // the wire format, by hand

std::optional<sp::StoreRequest> parse(const Bytes& in, size_t* used) { return sp::parse_store_request(in.b, used); }

// The message of the CommError f() throws ("no CommError" when it throws none).
template <class F>
std::string comm_error_of(F f) {
  try {
    f();
  } catch (const CommError& e) {
    return e.what();
  }
  return "no CommError";
}

}  // namespace

TEST_CASE("store protocol: requests decode, a truncated one asks for more bytes", "[store]") {
  Bytes in;
  in.put(uint8_t{1}).str("k").put(uint64_t{3});  // SET k "abc"
  in.b.insert(in.b.end(), {'a', 'b', 'c'});
  in.put(uint8_t{4}).put(int64_t{250}).put(uint32_t{2}).str("a").str("b");  // WAIT 250 ms for a, b
  size_t used = 0;
  auto set = parse(in, &used);
  REQUIRE(set);
  CHECK(set->cmd == sp::StoreCmd::Set);
  CHECK(set->key == "k");
  CHECK(set->value == std::vector<uint8_t>{'a', 'b', 'c'});
  CHECK(used == 1 + 4 + 1 + 8 + 3);
  auto wait = sp::parse_store_request(std::span(in.b).subspan(used), &used);
  REQUIRE(wait);
  CHECK(wait->timeout_ms == 250);
  CHECK(wait->keys == std::vector<std::string>{"a", "b"});

  Bytes cut;
  cut.put(uint8_t{3}).str("counter").put(int32_t{1});  // ADD with half its delta
  CHECK_FALSE(parse(cut, &used));
  CHECK(used == 0);
  // A value length alone (2 GiB, nothing after it) asks for more bytes: it allocates nothing up front.
  Bytes big;
  big.put(uint8_t{1}).str("k").put(uint64_t{sp::kMaxStoreValueBytes});
  CHECK_FALSE(parse(big, &used));
}

TEST_CASE("store protocol: oversized fields and unknown commands are refused naming the problem", "[store]") {
  size_t used = 0;
  Bytes key;
  key.put(uint8_t{2}).put(uint32_t{sp::kMaxStoreKeyBytes + 1});
  CHECK_THAT(comm_error_of([&] { parse(key, &used); }), Contains("a key of 65537 bytes (at most 65536)"));
  Bytes value;
  value.put(uint8_t{1}).str("k").put(uint64_t{sp::kMaxStoreValueBytes + 1});
  CHECK_THAT(comm_error_of([&] { parse(value, &used); }), Contains("a value of 2147483649 bytes"));
  Bytes keys;
  keys.put(uint8_t{4}).put(int64_t{0}).put(uint32_t{sp::kMaxStoreWaitKeys + 1});
  CHECK_THAT(comm_error_of([&] { parse(keys, &used); }), Contains("1048577 keys"));
  Bytes cmd;
  cmd.put(uint8_t{'G'}).put(uint8_t{'E'}).put(uint8_t{'T'});
  CHECK_THAT(comm_error_of([&] { parse(cmd, &used); }), Contains("unknown command byte 71"));
}

TEST_CASE("store protocol: negative and absurd WAIT timeouts mean forever", "[store]") {
  for (int64_t t : {int64_t{-5}, int64_t{INT64_MAX}, int64_t{1} << 50}) {
    Bytes in;
    in.put(uint8_t{4}).put(t).put(uint32_t{0});
    size_t used = 0;
    auto r = parse(in, &used);
    REQUIRE(r);
    CHECK(r->timeout_ms == -1);
  }
  // End to end: a wait with the largest timeout waits for the key instead of overflowing the server's clock.
  TcpStore srv(TcpStoreOptions{"127.0.0.1", 0, true, 10s});
  std::thread setter([&] {
    std::this_thread::sleep_for(100ms);
    srv.set("late", std::string("1"));
  });
  TcpStore cli(TcpStoreOptions{"127.0.0.1", srv.port(), false, 10s});
  cli.wait({"late"}, std::chrono::milliseconds::max());
  setter.join();
  CHECK(cli.get_string("late") == "1");
}

TEST_CASE("store counters refuse to overflow", "[store]") {
  HashStore hs;
  CHECK(hs.add("n", INT64_MAX) == INT64_MAX);
  CHECK_THAT(comm_error_of([&] { hs.add("n", 1); }), Contains("overflows a 64-bit counter"));
  CHECK(hs.add("n", -1) == INT64_MAX - 1);  // the counter is unchanged by the refused add
  TcpStore srv(TcpStoreOptions{"127.0.0.1", 0, true, 10s});
  CHECK(srv.add("m", INT64_MIN) == INT64_MIN);
  CHECK_THAT(comm_error_of([&] { srv.add("m", -1); }), Contains("overflows"));
  CHECK(srv.add("m", 1) == INT64_MIN + 1);  // the server's answer: the connection stays usable
}

TEST_CASE("TcpStore: a hostile client is dropped, the others keep working, the client refuses oversized requests",
          "[store]") {
  TcpStore srv(TcpStoreOptions{"127.0.0.1", 0, true, 10s});
  srv.set("a", std::string("1"));
  // A raw connection claiming a 4 GiB key: the server closes it at once instead of allocating.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(srv.port()));
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char c = 1;
  Bytes evil;
  evil.put(sp::kStoreHelloMagic).str("");  // the hello this server (no token) admits; its reply is OK (0)
  REQUIRE(::send(fd, evil.b.data(), evil.b.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(evil.b.size()));
  REQUIRE(::recv(fd, &c, 1, 0) == 1);
  CHECK(c == 0);
  evil.b.clear();
  evil.put(uint8_t{2}).put(uint32_t{0xFFFFFFFF});
  REQUIRE(::send(fd, evil.b.data(), evil.b.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(evil.b.size()));
  CHECK(::recv(fd, &c, 1, 0) == 0);  // EOF: dropped (a timeout would return -1)
  ::close(fd);

  TcpStore cli(TcpStoreOptions{"127.0.0.1", srv.port(), false, 10s});
  CHECK(cli.get_string("a") == "1");
  const std::string long_key(sp::kMaxStoreKeyBytes + 1, 'k');
  CHECK_THAT(comm_error_of([&] { cli.set(long_key, std::string("x")); }), Contains("the TcpStore accepts at most 65536"));
  CHECK_THROWS_AS(cli.add(long_key, 1), CommError);
  CHECK_THROWS_AS(cli.wait({"a", long_key}, 1s), CommError);
  cli.set("b", std::string("2"));  // refused before sending: the connection is still usable
  CHECK(srv.get_string("b") == "2");
}
