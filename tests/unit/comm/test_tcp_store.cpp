// tests/unit/comm/test_tcp_store.cpp: TcpStore (and HashStore, PrefixStore): set/get/add, waiting for keys
// set later, timeouts naming the keys, a client with no server, and a server that shuts down promptly; a
// server that never answers (requests or the hello) or answers garbage: the client times out or fails, then
// refuses further calls. The rendezvous token: test_store_token.cpp.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <future>
#include <thread>
#include <vector>

#include "core/net.h"
#include "comm/process_group.h"  // kNoTimeout
#include "comm/store.h"
#include "comm/tcp_store.h"
#include "core/check.h"

using namespace dpt;
using namespace dpt::comm;
using namespace std::chrono_literals;
using Catch::Matchers::Contains;
using Clock = std::chrono::steady_clock;

namespace {

std::shared_ptr<TcpStore> server(std::chrono::milliseconds timeout = 10s) {
  // Port 0: the server picks a free port, so tests running in parallel never collide.
  return std::make_shared<TcpStore>(TcpStoreOptions{"127.0.0.1", 0, true, timeout});
}

std::shared_ptr<TcpStore> client(const TcpStore& srv, std::chrono::milliseconds timeout = 10s) {
  return std::make_shared<TcpStore>(TcpStoreOptions{"127.0.0.1", srv.port(), false, timeout});
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A plain listening socket on a free port that accepts connections and never answers on its own (a rank 0
// whose host froze); send() writes raw bytes to the last connection it accepted.
class FakeServer {
 public:
  FakeServer() : port_(find_free_port()) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd_ >= 0);
    int one = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port_));
    REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
    REQUIRE(::listen(fd_, 16) == 0);
  }
  ~FakeServer() {
    for (int c : conns_) ::close(c);
    ::close(fd_);
  }
  FakeServer(const FakeServer&) = delete;
  FakeServer& operator=(const FakeServer&) = delete;

  int port() const { return port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  // Accepts the connection a TcpStore client just made (the kernel queued it), and keeps it open.
  void accept_one() {
    int c = ::accept(fd_, nullptr, nullptr);
    REQUIRE(c >= 0);
    conns_.push_back(c);
  }
  void send(const std::vector<uint8_t>& bytes) {
    REQUIRE(!conns_.empty());
    REQUIRE(::send(conns_.back(), bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size()));
  }
  // A TcpStore client of this fake server, its hello (u32 magic, u32 token length, the token) read and answered
  // OK: the client waits for that answer in its constructor.
  std::unique_ptr<TcpStore> connect(std::chrono::milliseconds timeout) {
    auto cli = std::async(std::launch::async,
                          [&] { return std::make_unique<TcpStore>("127.0.0.1", port_, false, timeout); });
    accept_one();
    uint32_t head[2] = {0, 0};
    REQUIRE(::recv(conns_.back(), head, sizeof head, MSG_WAITALL) == static_cast<ssize_t>(sizeof head));
    REQUIRE(head[0] == comm::detail::kStoreHelloMagic);
    std::vector<uint8_t> token(head[1]);
    if (!token.empty()) {
      REQUIRE(::recv(conns_.back(), token.data(), token.size(), MSG_WAITALL) == static_cast<ssize_t>(token.size()));
    }
    send({0});
    return cli.get();
  }

 private:
  int port_;
  int fd_ = -1;
  std::vector<int> conns_;
};

// Matches a CommError that is not a TimeoutError and whose message contains every fragment.
Catch::Matchers::Generic::PredicateMatcher<CommError> comm_error_with(std::vector<std::string> fragments) {
  return Catch::Matchers::Predicate<CommError>([fragments](const CommError& e) {
    if (dynamic_cast<const TimeoutError*>(&e) != nullptr) return false;
    std::string m = e.what();
    for (const auto& f : fragments) {
      if (m.find(f) == std::string::npos) return false;
    }
    return true;
  });
}

Catch::Matchers::Generic::PredicateMatcher<TimeoutError> timeout_with(std::vector<std::string> fragments) {
  return Catch::Matchers::Predicate<TimeoutError>([fragments](const TimeoutError& e) {
    std::string m = e.what();
    for (const auto& f : fragments) {
      if (m.find(f) == std::string::npos) return false;
    }
    return true;
  });
}

}  // namespace

TEST_CASE("TcpStore: set, get and add between server and client", "[store]") {
  auto srv = server();
  REQUIRE(srv->port() > 0);
  CHECK(srv->is_server());
  auto cli = client(*srv);
  CHECK_FALSE(cli->is_server());

  srv->set("greeting", std::string("hello"));
  CHECK(cli->get_string("greeting") == "hello");
  std::vector<uint8_t> bytes = {0, 1, 2, 255, 0};
  cli->set("bytes", bytes);
  CHECK(srv->get("bytes") == bytes);
  cli->set("empty", std::string());
  CHECK(srv->get("empty").empty());
  cli->set("greeting", std::string("again"));  // overwrite
  CHECK(srv->get_string("greeting") == "again");

  // A large value crosses many TCP segments.
  std::vector<uint8_t> big(3 * 1024 * 1024 + 7);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 31 + 7);
  srv->set("big", big);
  CHECK(cli->get("big") == big);

  CHECK(cli->add("counter", 5) == 5);
  CHECK(srv->add("counter", -2) == 3);
  CHECK(cli->add("counter", 0) == 3);
  CHECK(cli->get_string("counter") == "3");
  CHECK_THROWS_WITH(cli->add("greeting", 1), Contains("greeting") && Contains("not a counter"));
  // The failed add left the connection usable.
  CHECK(cli->add("counter", 1) == 4);
}

TEST_CASE("TcpStore: concurrent adds from threads sum correctly", "[store][multirank]") {
  auto srv = server();
  constexpr int kThreads = 8;
  constexpr int kAdds = 200;
  std::vector<std::thread> threads;
  auto shared_client = client(*srv);  // one client shared by half the threads: requests must not interleave
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::shared_ptr<TcpStore> own = t % 2 == 0 ? client(*srv) : nullptr;
      TcpStore& s = own ? *own : *shared_client;
      for (int i = 0; i < kAdds; ++i) s.add("sum", t + 1);
    });
  }
  for (auto& th : threads) th.join();
  // sum over threads of (t+1) * kAdds
  CHECK(srv->add("sum", 0) == int64_t{kAdds} * kThreads * (kThreads + 1) / 2);
}

TEST_CASE("TcpStore: wait returns when another thread sets the keys later", "[store]") {
  auto srv = server();
  auto cli = client(*srv);
  auto start = Clock::now();
  std::thread setter([&] {
    auto other = client(*srv);
    std::this_thread::sleep_for(100ms);
    other->set("a", std::string("1"));
    std::this_thread::sleep_for(50ms);
    other->set("b", std::string("2"));
  });
  cli->wait({"a", "b"}, 5s);
  double waited = seconds_since(start);
  setter.join();
  CHECK(waited >= 0.14);
  CHECK(waited < 4.0);
  CHECK(cli->get_string("b") == "2");

  // get() waits too.
  std::thread late([&] {
    std::this_thread::sleep_for(100ms);
    srv->set("late", std::string("x"));
  });
  CHECK(cli->get_string("late") == "x");
  late.join();

  // Keys that exist return at once, also with a zero timeout.
  cli->wait({"a"}, 0ms);
}

TEST_CASE("TcpStore: wait and get time out naming the missing key", "[store]") {
  auto srv = server(200ms);
  auto cli = client(*srv, 200ms);
  cli->set("present", std::string("1"));
  auto start = Clock::now();
  CHECK_THROWS_MATCHES(cli->wait({"present", "missing-key"}, 200ms), TimeoutError,
                       Catch::Matchers::Predicate<TimeoutError>([](const TimeoutError& e) {
                         std::string m = e.what();
                         return m.find("missing-key") != std::string::npos && m.find("'present'") == std::string::npos &&
                                m.find("200 ms") != std::string::npos;
                       }));
  double waited = seconds_since(start);
  CHECK(waited >= 0.19);
  CHECK(waited < 3.0);
  // get() uses the store's timeout (200 ms here).
  CHECK_THROWS_AS(cli->get("never-set"), TimeoutError);
  CHECK_THROWS_WITH(cli->get("never-set"), Contains("never-set"));
  // TimeoutError is a CommError.
  CHECK_THROWS_AS(srv->wait({"never-set"}, 50ms), CommError);
  // The connection survives a timeout.
  CHECK(cli->get_string("present") == "1");
}

TEST_CASE("TcpStore: a client with no server fails after its timeout naming the address", "[store]") {
  int port = find_free_port();
  auto start = Clock::now();
  std::string expected = "127.0.0.1:" + std::to_string(port);
  CHECK_THROWS_MATCHES(TcpStore("127.0.0.1", port, false, 300ms), TimeoutError,
                       Catch::Matchers::Predicate<TimeoutError>([&](const TimeoutError& e) {
                         std::string m = e.what();
                         return m.find(expected) != std::string::npos && m.find("is rank 0 running") != std::string::npos;
                       }));
  double waited = seconds_since(start);
  CHECK(waited >= 0.29);
  CHECK(waited < 3.0);
}

TEST_CASE("TcpStore: a client that starts before the server connects once it is up", "[store]") {
  int port = find_free_port();
  std::shared_ptr<TcpStore> srv;
  std::thread starter([&] {
    std::this_thread::sleep_for(300ms);
    srv = std::make_shared<TcpStore>("127.0.0.1", port, true, 10s);
  });
  TcpStore cli("127.0.0.1", port, false, 10s);
  starter.join();
  cli.set("k", std::string("v"));
  CHECK(srv->get_string("k") == "v");
}

TEST_CASE("TcpStore: a second server on the same port fails with address in use", "[store]") {
  auto srv = server();
  CHECK_THROWS_MATCHES(TcpStore("127.0.0.1", srv->port(), true, 1s), CommError,
                       Catch::Matchers::Predicate<CommError>([&](const CommError& e) {
                         std::string m = e.what();
                         return m.find(std::to_string(srv->port())) != std::string::npos &&
                                m.find("address in use") != std::string::npos;
                       }));
}

TEST_CASE("TcpStore: the server's destructor does not hang on waiting clients", "[store]") {
  auto srv = server();
  auto cli = client(*srv);
  auto idle = client(*srv);  // connected, never sends anything
  std::promise<std::string> outcome;
  std::thread waiter([&] {
    try {
      cli->wait({"never"}, kNoTimeout);
      outcome.set_value("returned");
    } catch (const CommError& e) {
      outcome.set_value(e.what());
    }
  });
  std::this_thread::sleep_for(100ms);  // let the WAIT reach the server
  auto start = Clock::now();
  srv.reset();
  CHECK(seconds_since(start) < 2.0);
  auto fut = outcome.get_future();
  REQUIRE(fut.wait_for(5s) == std::future_status::ready);
  std::string msg = fut.get();
  waiter.join();
  CHECK_THAT(msg, Contains("lost the connection"));
  // Later calls fail too, rather than hang.
  CHECK_THROWS_AS(idle->set("k", std::string("v")), CommError);
}

TEST_CASE("HashStore and PrefixStore", "[store]") {
  auto base = std::make_shared<HashStore>(200ms);
  PrefixStore a("job/a", base);
  PrefixStore b("job/b", base);
  a.set("k", std::string("from a"));
  b.set("k", std::string("from b"));
  CHECK(a.get_string("k") == "from a");
  CHECK(b.get_string("k") == "from b");
  CHECK(base->get_string("job/a/k") == "from a");
  CHECK(a.add("n", 2) == 2);
  CHECK(b.add("n", 5) == 5);
  CHECK_THROWS_WITH(b.wait({"only-in-a"}, 50ms), Contains("job/b/only-in-a"));
  std::thread later([&] {
    std::this_thread::sleep_for(50ms);
    a.set("later", std::string("x"));
  });
  a.wait({"later"}, 5s);
  later.join();
  CHECK_THROWS_AS(base->get("nothing"), TimeoutError);

  // A PrefixStore over a TcpStore, as init_process_group builds it.
  auto srv = server();
  PrefixStore p("dpt/restart1", srv);
  p.set("x", std::string("y"));
  CHECK(client(*srv)->get_string("dpt/restart1/x") == "y");
}

TEST_CASE("TcpStore: a server that never answers: requests time out, then the client refuses further calls",
          "[store]") {
  FakeServer fake;

  SECTION("set") {
    auto cli = fake.connect(300ms);
    auto start = Clock::now();
    CHECK_THROWS_MATCHES(cli->set("k", std::string("v")), TimeoutError,
                         timeout_with({"no reply", fake.address(), "set('k')", "300 ms"}));
    double waited = seconds_since(start);
    CHECK(waited >= 0.29);
    CHECK(waited < 5.0);
    // The next call fails at once: the connection may hold the late reply.
    start = Clock::now();
    CHECK_THROWS_MATCHES(cli->add("n", 1), CommError, comm_error_with({"unusable", fake.address(), "set('k')"}));
    CHECK(seconds_since(start) < 0.5);
  }

  SECTION("get (its wait gets a margin for the server's reply)") {
    auto cli = fake.connect(300ms);
    auto start = Clock::now();
    CHECK_THROWS_MATCHES(cli->get("k"), TimeoutError, timeout_with({"no reply", fake.address(), "'k'"}));
    double waited = seconds_since(start);
    CHECK(waited >= 0.29);
    CHECK(waited < 5.0);
    start = Clock::now();
    CHECK_THROWS_MATCHES(cli->get("k"), CommError, comm_error_with({"unusable", fake.address()}));
    CHECK_THROWS_MATCHES(cli->set("k", std::string("v")), CommError, comm_error_with({"unusable"}));
    CHECK(seconds_since(start) < 0.5);
  }

  SECTION("the hello: the constructor times out naming the address") {
    auto start = Clock::now();
    CHECK_THROWS_MATCHES(TcpStore("127.0.0.1", fake.port(), false, 300ms), TimeoutError,
                         timeout_with({"no reply", fake.address(), "the hello", "300 ms"}));
    double waited = seconds_since(start);
    CHECK(waited >= 0.29);
    CHECK(waited < 5.0);
  }
}

TEST_CASE("TcpStore: a malformed reply breaks the connection instead of misreading the next reply", "[store]") {
  FakeServer fake;
  auto cli = fake.connect(2s);
  // An ERROR reply (status 3, see tcp_store.h) whose text claims 1 MiB: longer than the client accepts.
  std::vector<uint8_t> reply = {3};
  uint32_t len = 1u << 20;
  const auto* p = reinterpret_cast<const uint8_t*>(&len);
  reply.insert(reply.end(), p, p + sizeof(len));
  reply.resize(reply.size() + 64, 'x');
  fake.send(reply);
  auto start = Clock::now();
  CHECK_THROWS_MATCHES(cli->add("n", 1), CommError, comm_error_with({"unexpected reply", fake.address(), "add('n')"}));
  CHECK_THROWS_MATCHES(cli->get("n"), CommError, comm_error_with({"unusable", "unexpected reply to add('n')"}));
  CHECK(seconds_since(start) < 1.0);
}
