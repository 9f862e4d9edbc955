// tests/unit/core/test_net.cpp: find_free_port gives a port that can be bound at once.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "core/check.h"
#include "core/net.h"

using namespace dpt;

TEST_CASE("find_free_port returns a port that can be bound at once", "[core]") {
  for (int i = 0; i < 3; ++i) {
    int port = find_free_port();
    REQUIRE(port >= 1);
    REQUIRE(port <= 65535);
    int sock = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(sock >= 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<uint16_t>(port));
    REQUIRE(::inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr) == 1);
    int rc = ::bind(sock, reinterpret_cast<const sockaddr*>(&sa), sizeof sa);
    int listened = rc == 0 ? ::listen(sock, 1) : -1;
    ::close(sock);
    REQUIRE(rc == 0);
    REQUIRE(listened == 0);
  }
  REQUIRE_THROWS_AS(find_free_port("not-an-address"), ConfigError);
}
