// tests/unit/comm/test_store_token.cpp: the TcpStore's rendezvous token (issue 10): a client with the job's token
// is admitted, one with another token or none is rejected with an error naming DPT_STORE_TOKEN while the good
// clients keep working; a client that connects and sends nothing, or sends junk, holds up no one and is dropped;
// the log names the address, never a token; the hello decoder's bounds; the constant-time comparison.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>
#include <string>
#include <thread>
#include <vector>

#include "comm/tcp_store.h"
#include "core/check.h"
#include "tests/support/store_wire.h"

using namespace dpt;
using namespace dpt::comm;
using namespace std::chrono_literals;
using Catch::Matchers::Contains;
using Clock = std::chrono::steady_clock;
namespace sp = dpt::comm::detail;

namespace {

constexpr const char* kJobToken = "5e11c0ffee5e11c0ffee5e11c0ffee00";

std::shared_ptr<TcpStore> server(const std::string& token) {
  return std::make_shared<TcpStore>(TcpStoreOptions{"127.0.0.1", 0, true, 10s, token});
}

std::shared_ptr<TcpStore> client(const TcpStore& srv, const std::string& token) {
  return std::make_shared<TcpStore>(TcpStoreOptions{"127.0.0.1", srv.port(), false, 10s, token});
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

using Bytes = dpt::test::StoreBytes;  // the wire format, by hand

Bytes hello(const std::string& token) {
  Bytes h;
  h.put(sp::kStoreHelloMagic).str(token);
  return h;
}

// A raw TCP connection to the store, as a stranger would make; closed by the destructor.
class RawClient {
 public:
  explicit RawClient(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd_ >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  }
  ~RawClient() { ::close(fd_); }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  void send(const Bytes& bytes) {
    REQUIRE(::send(fd_, bytes.b.data(), bytes.b.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.b.size()));
  }
  // What the server did within `patience`: "closed" (end of file or reset), "silent", or "byte N".
  std::string outcome(std::chrono::seconds patience) {
    timeval tv{static_cast<time_t>(patience.count()), 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    uint8_t c = 0;
    ssize_t n = ::recv(fd_, &c, 1, 0);
    if (n == 0 || (n < 0 && errno == ECONNRESET)) return "closed";
    if (n < 0) return "silent";
    return "byte " + std::to_string(c);
  }

 private:
  int fd_ = -1;
};

// Captures what spdlog's default logger writes while alive. Create it before the server (whose threads log)
// and destroy it after, so the sink list never changes while a thread logs.
struct LogCapture {
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(1000);
  LogCapture() { spdlog::default_logger()->sinks().push_back(sink); }
  ~LogCapture() { spdlog::default_logger()->sinks().pop_back(); }
  std::string text() const {
    std::string all;
    for (const std::string& line : sink->last_formatted()) all += line;
    return all;
  }
};

// The CommError (not a TimeoutError) that f throws, its message; "no CommError" / "a TimeoutError: ..." otherwise.
template <class F>
std::string comm_error_of(F f) {
  try {
    f();
  } catch (const TimeoutError& e) {
    return std::string("a TimeoutError: ") + e.what();
  } catch (const CommError& e) {
    return e.what();
  }
  return "no CommError";
}

}  // namespace

TEST_CASE("TcpStore token: clients presenting the job's token are admitted", "[store]") {
  auto srv = server(kJobToken);
  auto cli = client(*srv, kJobToken);
  srv->set("k", std::string("v"));
  CHECK(cli->get_string("k") == "v");
  CHECK(cli->add("n", 2) == 2);
  // A job started without a token: empty on both sides is a match.
  auto open_srv = server("");
  CHECK(client(*open_srv, "")->add("n", 1) == 1);
}

TEST_CASE("TcpStore token: a wrong or missing token is rejected naming DPT_STORE_TOKEN, good clients keep working",
          "[store]") {
  LogCapture log;
  auto srv = server(kJobToken);
  auto good = client(*srv, kJobToken);
  good->set("before", std::string("1"));
  const std::string expected = "the TcpStore at 127.0.0.1:" + std::to_string(srv->port()) +
                               " rejected this process: its rendezvous token (DPT_STORE_TOKEN) differs from the job's";
  const auto start = Clock::now();
  const std::string wrong_token = "this-is-not-the-token-of-the-job";
  CHECK(comm_error_of([&] { client(*srv, wrong_token); }) == expected);
  CHECK(comm_error_of([&] { client(*srv, ""); }) == expected);              // none
  CHECK(comm_error_of([&] { client(*srv, std::string(kJobToken) + "0"); }) == expected);  // a longer one
  CHECK(seconds_since(start) < 3.0);  // at once, not after a timeout
  // A server without a token rejects a client with one (it belongs to another job).
  auto open_srv = server("");
  CHECK(comm_error_of([&] { client(*open_srv, kJobToken); }) ==
        "the TcpStore at 127.0.0.1:" + std::to_string(open_srv->port()) +
            " rejected this process: its rendezvous token (DPT_STORE_TOKEN) differs from the job's");
  // The good client's connection is untouched, and new good clients still get in.
  CHECK(good->get_string("before") == "1");
  CHECK(client(*srv, kJobToken)->add("after", 1) == 1);
  srv.reset();
  open_srv.reset();
  const std::string logged = log.text();
  CHECK_THAT(logged, Contains("rejected a client from 127.0.0.1:") && Contains(": wrong rendezvous token"));
  // Neither the job's token nor the ones presented are ever logged.
  CHECK_THAT(logged, !Contains(kJobToken) && !Contains(wrong_token));
}

TEST_CASE("TcpStore token: a client that sends nothing holds up no one and is dropped after the hello deadline",
          "[store]") {
  LogCapture log;
  auto srv = server(kJobToken);
  RawClient silent(srv->port());
  RawClient half(srv->port());
  half.send(Bytes().put(sp::kStoreHelloMagic));  // the first word, then nothing
  const auto start = Clock::now();
  // Meanwhile good clients connect and work at once.
  auto good = client(*srv, kJobToken);
  good->set("k", std::string("v"));
  CHECK(client(*srv, kJobToken)->get_string("k") == "v");
  CHECK(seconds_since(start) < 1.0);
  // The silent ones are dropped once the hello deadline (5 s) passes: not before 4 s, and not much after.
  CHECK(silent.outcome(10s) == "closed");
  const double waited = seconds_since(start);
  CHECK(waited > sp::kStoreHelloTimeout.count() - 1.0);
  CHECK(waited < sp::kStoreHelloTimeout.count() + 3.0);
  CHECK(half.outcome(3s) == "closed");
  CHECK(good->get_string("k") == "v");
  srv.reset();
  CHECK_THAT(log.text(), Contains("that sent no hello within 5 s"));
}

TEST_CASE("TcpStore token: junk instead of a hello is dropped at once, the others keep working", "[store]") {
  LogCapture log;
  auto srv = server(kJobToken);
  auto good = client(*srv, kJobToken);
  const auto start = Clock::now();
  {
    RawClient http(srv->port());
    Bytes get;
    for (char c : std::string("GET / HTTP/1.1\r\nHost: x\r\n\r\n")) get.put(c);
    http.send(get);
    CHECK(http.outcome(5s) == "closed");
  }
  {
    RawClient huge(srv->port());  // a valid first word, then a token length of 1 GiB
    huge.send(Bytes().put(sp::kStoreHelloMagic).put(uint32_t{1} << 30));
    CHECK(huge.outcome(5s) == "closed");
  }
  {
    RawClient old(srv->port());  // a request with no hello before it (a client of the protocol before tokens)
    old.send(Bytes().put(uint8_t{2}).str("k"));
    CHECK(old.outcome(5s) == "closed");
  }
  {
    RawClient wrong(srv->port());  // a well-formed hello with another token: the reply says no, then EOF
    wrong.send(hello("guess"));
    CHECK(wrong.outcome(5s) == "byte 3");
    CHECK(wrong.outcome(5s) == "closed");
  }
  {
    RawClient right(srv->port());  // the right token by hand: OK, then requests are served
    right.send(hello(kJobToken));
    CHECK(right.outcome(5s) == "byte 0");
    right.send(Bytes().put(uint8_t{3}).str("n").put(int64_t{5}));  // ADD n 5
    CHECK(right.outcome(5s) == "byte 0");
  }
  CHECK(seconds_since(start) < 4.0);
  CHECK(good->add("n", 1) == 6);
  srv.reset();
  const std::string logged = log.text();
  CHECK_THAT(logged, Contains("dropping a client from 127.0.0.1:") && Contains("is no TcpStore hello"));
  CHECK_THAT(logged, Contains("a rendezvous token of 1073741824 bytes (at most 256)"));
}

TEST_CASE("TcpStore token: a token longer than the protocol allows is refused before connecting", "[store]") {
  CHECK_THROWS_MATCHES(TcpStore(TcpStoreOptions{"127.0.0.1", 0, true, 1s, std::string(257, 'x')}), ConfigError,
                       Catch::Matchers::Predicate<ConfigError>([](const ConfigError& e) {
                         std::string m = e.what();
                         return m.find("DPT_STORE_TOKEN") != std::string::npos && m.find("257") != std::string::npos &&
                                m.find("xxxx") == std::string::npos;
                       }));
  auto srv = server(std::string(256, 't'));  // the longest allowed
  CHECK(client(*srv, std::string(256, 't'))->add("n", 1) == 1);
}

TEST_CASE("store protocol: the hello decodes, a truncated one asks for more bytes, bounds are enforced", "[store]") {
  size_t used = 99;
  Bytes h = hello("abc");
  h.put(uint8_t{2});  // a request after it is not part of the hello
  auto token = sp::parse_store_hello(h.b, &used);
  REQUIRE(token);
  CHECK(*token == "abc");
  CHECK(used == 4 + 4 + 3);
  token = sp::parse_store_hello(hello("").b, &used);
  REQUIRE(token);
  CHECK(token->empty());
  CHECK(used == 8);
  const std::string longest(sp::kMaxStoreTokenBytes, 'z');
  token = sp::parse_store_hello(hello(longest).b, &used);
  REQUIRE(token);
  CHECK(*token == longest);

  // Cut anywhere inside: nullopt, nothing consumed.
  const Bytes whole = hello("abcdef");
  for (size_t n = 0; n < whole.b.size(); ++n) {
    used = 99;
    CHECK_FALSE(sp::parse_store_hello(std::span(whole.b).first(n), &used));
    CHECK(used == 0);
  }
  // A length alone, however large (within the bound), asks for more bytes.
  CHECK_FALSE(sp::parse_store_hello(Bytes().put(sp::kStoreHelloMagic).put(uint32_t{256}).b, &used));

  auto error_of = [](const Bytes& in) {
    size_t n = 0;
    return comm_error_of([&] { sp::parse_store_hello(in.b, &n); });
  };
  CHECK_THAT(error_of(hello(longest + "z")),
             Contains("malformed TcpStore hello: a rendezvous token of 257 bytes (at most 256)"));
  CHECK_THAT(error_of(Bytes().put(sp::kStoreHelloMagic).put(uint32_t{0xFFFFFFFF})), Contains("4294967295 bytes"));
  CHECK_THAT(error_of(Bytes().put(sp::kStoreHelloMagic + 1).str("abc")),
             Contains("first word 0x01545045 is no TcpStore hello"));
  Bytes request;  // a request where the hello belongs
  request.put(uint8_t{1}).str("k").put(uint64_t{0});
  CHECK_THAT(error_of(request), Contains("is no TcpStore hello"));
}

TEST_CASE("store protocol: tokens_equal is ==, for any lengths", "[store]") {
  CHECK(sp::tokens_equal("", ""));
  CHECK(sp::tokens_equal("abc", "abc"));
  CHECK_FALSE(sp::tokens_equal("abc", "abd"));
  CHECK_FALSE(sp::tokens_equal("abc", "ab"));
  CHECK_FALSE(sp::tokens_equal("ab", "abc"));
  CHECK_FALSE(sp::tokens_equal("", "a"));
  CHECK_FALSE(sp::tokens_equal("a", ""));
  // A zero byte is a byte like any other (the shorter side is not padded with zeros into a match).
  CHECK_FALSE(sp::tokens_equal(std::string("a\0", 2), "a"));
  CHECK(sp::tokens_equal(std::string("a\0b", 3), std::string("a\0b", 3)));
}
