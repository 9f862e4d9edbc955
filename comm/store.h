// comm/store.h: the Store interface (a small key-value service the ranks rendezvous through), PrefixStore
// (a namespace inside another store) and HashStore (in-process, for a single process or ranks as threads).
//
// Values are bytes. add() keeps its counter as decimal text, so get() of an added key returns e.g. "3".
// get() and wait() block until the keys exist; they fail with TimeoutError naming the missing keys.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace dpt::comm {

inline constexpr std::chrono::milliseconds kDefaultStoreTimeout = std::chrono::seconds(300);

// An elastic dprun job's rendezvous store (launcher/rendezvous.h), which node 0's dprun hosts at --master-port, holds
// this counter at 1 from its start; rank 0's store (at a plain job's MASTER_PORT) never does. A rank of a node
// started as a plain job that finds it there, and a node's elastic dprun that does not, were given other --nnodes or
// --max-restarts than node 0's dprun: both once waited their whole timeout (300 s) and then blamed something else.
// The rank leaves its message under kNotElasticKey (the first one stays; kNotElasticCount counts them), which node 0's
// dprun ends the job with.
inline constexpr const char* kElasticRendezvousKey = "rdzv/elastic";
inline constexpr const char* kNotElasticKey = "rdzv/not_elastic";
inline constexpr const char* kNotElasticCount = "rdzv/not_elastic_count";

class Store {
 public:
  // timeout: how long get() and wait(keys) wait for a key; negative waits forever.
  explicit Store(std::chrono::milliseconds timeout = kDefaultStoreTimeout) : timeout_(timeout) {}
  virtual ~Store() = default;
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  void set(const std::string& key, const std::vector<uint8_t>& value) { do_set(key, value); }
  void set(const std::string& key, const std::string& value) {
    do_set(key, std::vector<uint8_t>(value.begin(), value.end()));
  }
  // Waits up to timeout() for the key, then returns its value.
  std::vector<uint8_t> get(const std::string& key) {
    do_wait({key}, timeout_);
    return do_get(key);
  }
  std::string get_string(const std::string& key) {
    auto v = get(key);
    return std::string(v.begin(), v.end());
  }
  // Adds delta to the key's counter (0 when absent) and returns the new value.
  int64_t add(const std::string& key, int64_t delta) { return do_add(key, delta); }
  // Blocks until every key exists; TimeoutError naming the missing keys after `timeout` (negative: forever).
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) { do_wait(keys, timeout); }
  void wait(const std::vector<std::string>& keys) { do_wait(keys, timeout_); }

  std::chrono::milliseconds timeout() const { return timeout_; }
  void set_timeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }

 protected:
  // Implementations. do_get is called after the key was seen by do_wait; it may throw CommError if the key is
  // (still) absent.
  virtual void do_set(const std::string& key, const std::vector<uint8_t>& value) = 0;
  virtual std::vector<uint8_t> do_get(const std::string& key) = 0;
  virtual int64_t do_add(const std::string& key, int64_t delta) = 0;
  virtual void do_wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;

 private:
  std::chrono::milliseconds timeout_;
};

// Every key becomes "PREFIX/key" in the wrapped store: several groups (or restarts of a job) share one
// store without seeing each other's keys.
class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> inner);
  const std::string& prefix() const { return prefix_; }
  Store& inner() { return *inner_; }

 protected:
  void do_set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> do_get(const std::string& key) override;
  int64_t do_add(const std::string& key, int64_t delta) override;
  void do_wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;

 private:
  std::string key(const std::string& k) const { return prefix_ + "/" + k; }
  std::string prefix_;
  std::shared_ptr<Store> inner_;
};

// An in-process store: a map under a mutex. For a single process, or ranks as threads in one process.
class HashStore : public Store {
 public:
  explicit HashStore(std::chrono::milliseconds timeout = kDefaultStoreTimeout) : Store(timeout) {}

 protected:
  void do_set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> do_get(const std::string& key) override;
  int64_t do_add(const std::string& key, int64_t delta) override;
  void do_wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::vector<uint8_t>> data_;
};

namespace detail {
// Shared by the stores: the counter add() keeps as decimal text, and the TimeoutError message.
int64_t parse_counter(const std::string& key, const std::vector<uint8_t>& value);
std::vector<uint8_t> format_counter(int64_t value);
// The add operation on a key-value map (the caller holds its lock): adds delta to the counter stored at key
// (0 when absent), stores the result and returns it.
int64_t add_counter(std::map<std::string, std::vector<uint8_t>>& data, const std::string& key, int64_t delta);
[[noreturn]] void throw_wait_timeout(const std::vector<std::string>& missing, std::chrono::milliseconds timeout,
                                     const std::string& where);
std::string format_duration(std::chrono::milliseconds d);  // "200 ms", "30 s"
}  // namespace detail

}  // namespace dpt::comm
