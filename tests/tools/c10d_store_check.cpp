// tests/tools/c10d_store_check.cpp: dpt-c10d-store-check HOST PORT EXPECT, driven by integration.torchrun against a
// c10d TCPStore server that Python's torch.distributed.TCPStore runs (tests/support/python/c10d_server.py). It
// checks comm/c10d_store.h's client against the real server, printing one "ok: ..." line per check, and exits 1 at
// the first failure, naming it. EXPECT: v1 or v2, the protocol the probe must find. The keys it sets start with "/"
// so that the Python side, whose client puts "/" before every key, reads them back (c10d_server.py checks them).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "comm/c10d_store.h"
#include "core/check.h"

using namespace dpt;
using namespace dpt::comm;

namespace {

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

void expect(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "FAIL: %s\n", what.c_str());
    std::exit(1);
  }
  std::printf("ok: %s\n", what.c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: dpt-c10d-store-check HOST PORT v1|v2\n");
    return 2;
  }
  const std::string host = argv[1], want = argv[3];
  const int port = std::atoi(argv[2]);
  try {
    using std::chrono::milliseconds;
    C10dStore store(host, port, milliseconds(10'000));
    expect((store.protocol() == C10dProtocol::V1 ? "v1" : "v2") == want, "the probe found protocol " + want);
    // A second client, told the protocol (no probe), and the first's requests interleaved with it.
    const C10dProtocol known = store.protocol();
    C10dStore other(host, port, milliseconds(10'000), &known);

    expect(store.get_string("/py/hello") == "from python", "get of a key Python set");
    store.set("/dpt/a", "from dptrain");
    expect(other.get_string("/dpt/a") == "from dptrain", "set, then get from another client");
    expect(store.add("/dpt/n", 5) == 5, "add to an absent key starts at 0");
    expect(other.add("/dpt/n", -2) == 3, "add of a negative delta");
    expect(store.get_string("/dpt/n") == "3", "an added key reads as decimal text");

    expect(text(store.compare_set("/dpt/cas", {}, bytes("x"))) == "x", "compare_set of an absent key, expected empty: set");
    expect(text(store.compare_set("/dpt/cas", bytes("y"), bytes("z"))) == "x", "compare_set with the wrong expected: unchanged");
    expect(text(store.compare_set("/dpt/cas", bytes("x"), bytes("z"))) == "z", "compare_set with the right expected: swapped");
    expect(text(store.compare_set("/dpt/none", bytes("e"), bytes("d"))) == "e",
           "compare_set of an absent key, expected non-empty: returns expected");
    expect(!store.check({"/dpt/none"}), "... and sets nothing");

    std::vector<uint8_t> big(4u << 20);  // 4 MiB: within the libuv server's 8 MiB limit
    for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
    store.set("/dpt/big", big);
    expect(other.get("/dpt/big") == big, "a 4 MiB value, byte for byte");
    std::vector<uint8_t> empty_value;
    store.set("/dpt/empty", empty_value);
    expect(store.check({"/dpt/empty"}) && other.get("/dpt/empty").empty(), "an empty value exists and reads empty");
    const std::string binary_key("/dpt/k\0\xff", 8);
    store.set(binary_key, "binary");
    expect(other.get_string(binary_key) == "binary", "a key with a NUL and a 0xff byte");

    const auto t0 = std::chrono::steady_clock::now();
    bool timed_out = false;
    try {
      store.wait({"/dpt/a", "/dpt/never"}, milliseconds(300));
    } catch (const TimeoutError& e) {
      const std::string msg = e.what();
      timed_out = msg.find("/dpt/never") != std::string::npos && msg.find("/dpt/a,") == std::string::npos;
      std::printf("   (%s)\n", msg.c_str());
    }
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    expect(timed_out && waited >= 0.3 && waited < 5.0, fmt::format("a missing key times out after 300 ms ({:.2f} s), naming only it", waited));
    expect(store.get_string("/dpt/a") == "from dptrain", "the connection still works after a timed-out wait");
    bool get_timed_out = false;
    store.set_timeout(milliseconds(200));
    try {
      store.get("/dpt/never");
    } catch (const TimeoutError&) {
      get_timed_out = true;
    }
    store.set_timeout(milliseconds(10'000));
    expect(get_timed_out, "get of a missing key times out");

    store.set("/dpt/go", "1");  // the Python side sets /py/late 0.5 s after it sees this
    store.wait({"/py/late"}, milliseconds(10'000));
    expect(store.get_string("/py/late") == "late", "wait for a key another client sets later");

    expect(store.delete_key("/dpt/empty") && !store.check({"/dpt/empty"}), "delete_key removes a key");
    expect(!store.delete_key("/dpt/empty"), "delete_key of an absent key says so");
    expect(store.num_keys() >= 6, fmt::format("num_keys counts the keys ({})", store.num_keys()));
    store.set("/dpt/done", "1");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "FAIL: %s\n", e.what());
    return 1;
  }
  return 0;
}
