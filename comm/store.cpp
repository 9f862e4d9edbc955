// comm/store.cpp: PrefixStore, HashStore, and the helpers every store shares.
#include "comm/store.h"

#include <charconv>

#include "core/check.h"

namespace dpt::comm {

namespace detail {

int64_t parse_counter(const std::string& key, const std::vector<uint8_t>& value) {
  std::string text(value.begin(), value.end());
  int64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc{} || end != text.data() + text.size() || text.empty()) {
    DPT_THROW(CommError, "store key '{}' holds '{}', not a counter: add() on a key set() with other data", key,
              text.size() > 32 ? text.substr(0, 32) + "..." : text);
  }
  return v;
}

int64_t add_counter(std::map<std::string, std::vector<uint8_t>>& data, const std::string& key, int64_t delta) {
  int64_t v = 0;
  auto it = data.find(key);
  if (it != data.end()) v = parse_counter(key, it->second);
  // A client may send any delta: the sum must not overflow (undefined behaviour, found by tests/fuzz).
  if (__builtin_add_overflow(v, delta, &v)) {
    DPT_THROW(CommError, "store counter '{}' holds {}: adding {} overflows a 64-bit counter", key,
              parse_counter(key, it->second), delta);
  }
  data[key] = format_counter(v);
  return v;
}

std::vector<uint8_t> format_counter(int64_t value) {
  std::string s = std::to_string(value);
  return {s.begin(), s.end()};
}

std::string format_duration(std::chrono::milliseconds d) {
  if (d.count() >= 1000 && d.count() % 1000 == 0) return fmt::format("{} s", d.count() / 1000);
  return fmt::format("{} ms", d.count());
}

void throw_wait_timeout(const std::vector<std::string>& missing, std::chrono::milliseconds timeout,
                        const std::string& where) {
  DPT_THROW(TimeoutError, "timed out after {} waiting for store key{} {} in {}", format_duration(timeout),
            missing.size() == 1 ? "" : "s", fmt::format("'{}'", fmt::join(missing, "', '")), where);
}

}  // namespace detail

// ---- PrefixStore -----------------------------------------------------------------------------------------

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> inner)
    : Store(inner ? inner->timeout() : kDefaultStoreTimeout), prefix_(std::move(prefix)), inner_(std::move(inner)) {
  DPT_CHECK(inner_ != nullptr, "PrefixStore needs a store to wrap");
}

void PrefixStore::do_set(const std::string& k, const std::vector<uint8_t>& value) { inner_->set(key(k), value); }

std::vector<uint8_t> PrefixStore::do_get(const std::string& k) {
  // Store::get already waited for the key (through do_wait): this returns at once.
  return inner_->get(key(k));
}

int64_t PrefixStore::do_add(const std::string& k, int64_t delta) { return inner_->add(key(k), delta); }

void PrefixStore::do_wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const auto& k : keys) full.push_back(key(k));
  inner_->wait(full, timeout);
}

// ---- HashStore -------------------------------------------------------------------------------------------

void HashStore::do_set(const std::string& key, const std::vector<uint8_t>& value) {
  {
    std::lock_guard lock(mu_);
    data_[key] = value;
  }
  cv_.notify_all();
}

std::vector<uint8_t> HashStore::do_get(const std::string& key) {
  std::lock_guard lock(mu_);
  auto it = data_.find(key);
  if (it == data_.end()) DPT_THROW(CommError, "store key '{}' is not set", key);
  return it->second;
}

int64_t HashStore::do_add(const std::string& key, int64_t delta) {
  int64_t v = 0;
  {
    std::lock_guard lock(mu_);
    v = detail::add_counter(data_, key, delta);
  }
  cv_.notify_all();
  return v;
}

void HashStore::do_wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  auto all_present = [&] {
    for (const auto& k : keys) {
      if (!data_.count(k)) return false;
    }
    return true;
  };
  if (timeout.count() < 0) {
    cv_.wait(lock, all_present);
    return;
  }
  if (cv_.wait_for(lock, timeout, all_present)) return;
  std::vector<std::string> missing;
  for (const auto& k : keys) {
    if (!data_.count(k)) missing.push_back(k);
  }
  detail::throw_wait_timeout(missing, timeout, "the in-process store");
}

}  // namespace dpt::comm
