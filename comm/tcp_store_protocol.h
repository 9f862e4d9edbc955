// comm/tcp_store_protocol.h: the TcpStore protocol's constants and decoded messages (comm/tcp_store.h describes the
// protocol): its bounds, the hello, the commands and a request as the server decodes it, and the decoders the fuzz
// target and the tests call (defined in tcp_store_wire.cpp, the same code the server reads a socket with).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dpt::comm {

namespace detail {

// The protocol's bounds.
inline constexpr uint32_t kMaxStoreKeyBytes = 64 * 1024;
inline constexpr uint64_t kMaxStoreValueBytes = uint64_t{1} << 31;
inline constexpr uint32_t kMaxStoreWaitKeys = 1 << 20;
inline constexpr uint64_t kMaxStoreWaitKeyBytes = uint64_t{64} << 20;  // all keys of one WAIT together

// The hello: its first word (protocol version 1; "DPT" and the version as bytes in little-endian hosts' order),
// the longest token, and how long the server waits for a new client's hello before dropping it.
inline constexpr uint32_t kStoreHelloMagic = 0x01545044;
inline constexpr uint32_t kMaxStoreTokenBytes = 256;
inline constexpr std::chrono::seconds kStoreHelloTimeout{5};

enum class StoreCmd : uint8_t { Set = 1, Get = 2, Add = 3, Wait = 4 };

// One client request as the server decodes it.
struct StoreRequest {
  StoreCmd cmd{};
  std::string key;                // SET, GET, ADD
  std::vector<uint8_t> value;     // SET
  int64_t delta = 0;              // ADD
  int64_t timeout_ms = -1;        // WAIT; -1: forever (also what negative and over-a-year timeouts become)
  std::vector<std::string> keys;  // WAIT
};

// Decodes one request from the front of `bytes` exactly as the server decodes what it reads off a client's
// socket (the same code; for the fuzz target and tests). Returns the request with *consumed = its length, or
// nullopt with *consumed = 0 when the bytes end inside it. Throws CommError saying what is malformed.
std::optional<StoreRequest> parse_store_request(std::span<const uint8_t> bytes, size_t* consumed);

// Decodes a client's hello from the front of `bytes` as the server does: returns the token it presents with
// *consumed = the hello's length, or nullopt with *consumed = 0 when the bytes end inside it. Throws CommError
// for a wrong first word (not a TcpStore client, or another protocol version) or a token over its bound.
std::optional<std::string> parse_store_hello(std::span<const uint8_t> bytes, size_t* consumed);

// a == b, in a time that depends on the lengths only, never on where the bytes first differ.
bool tokens_equal(std::string_view a, std::string_view b);

}  // namespace detail

}  // namespace dpt::comm
