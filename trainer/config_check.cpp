// trainer/config_check.cpp: check_same_config: the ranks' hashes all-reduced; on a mismatch the texts broadcast
// and the same message built on every rank from what every rank then holds.
#include "trainer/config_check.h"

#include <bit>
#include <cstdint>
#include <cstring>
#include <map>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/check.h"

#include "dpt_build_id.h"  // DPT_VERSION, DPT_BUILD_ID: written at build time by cmake/build_id.cmake

namespace dpt::trainer {

namespace {

// A message, not a dump: two different builds may differ in many keys.
constexpr size_t kMaxListedKeys = 12;
// A config text or version longer than this from a peer is a bug, not a config.
constexpr int64_t kMaxTextBytes = int64_t{1} << 30;

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a 64, as config_hash
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Broadcasts `text` from `root` (a length, then the bytes; the other ranks' `text` is not read) and returns the
// root's text on every rank.
std::string broadcast_text(comm::ProcessGroup& pg, int root, const std::string& text) {
  Tensor length = Tensor::zeros({1}, DType::I64);
  if (pg.rank() == root) length.data<int64_t>()[0] = static_cast<int64_t>(text.size());
  pg.broadcast(length, {.root = root})->wait();
  const int64_t bytes = length.data<int64_t>()[0];
  DPT_CHECK(bytes >= 0 && bytes <= kMaxTextBytes, "rank {} sent a text of {} bytes", root, bytes);
  if (bytes == 0) return {};  // every rank saw the 0: none joins a broadcast of nothing
  Tensor buf = Tensor::zeros({bytes}, DType::U8);
  if (pg.rank() == root) std::memcpy(buf.data<uint8_t>(), text.data(), text.size());
  pg.broadcast(buf, {.root = root})->wait();
  return std::string(reinterpret_cast<const char*>(buf.data<uint8_t>()), static_cast<size_t>(bytes));
}

// to_toml's text as (section.key, value) in its order.
std::vector<std::pair<std::string, std::string>> flatten(const std::string& toml) {
  std::vector<std::pair<std::string, std::string>> out;
  std::string section;
  size_t pos = 0;
  while (pos < toml.size()) {
    size_t end = toml.find('\n', pos);
    if (end == std::string::npos) end = toml.size();
    const std::string line = toml.substr(pos, end - pos);
    pos = end + 1;
    if (line.size() >= 2 && line.front() == '[' && line.back() == ']') {
      section = line.substr(1, line.size() - 2);
      continue;
    }
    const size_t eq = line.find(" = ");
    if (eq == std::string::npos) continue;
    out.emplace_back(section.empty() ? line.substr(0, eq) : section + "." + line.substr(0, eq), line.substr(eq + 3));
  }
  return out;
}

// "rank 3" or "ranks 1, 3".
std::string ranks_phrase(const std::vector<int>& ranks) {
  return fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", fmt::join(ranks, ", "));
}

}  // namespace

std::string binary_version() { return fmt::format("dptrain {} built {}", DPT_VERSION, DPT_BUILD_ID); }

void check_same_config(const Config& cfg, comm::ProcessGroup& pg) {
  detail::check_same_texts(to_toml(cfg), binary_version(), pg);
}

void check_same_data(const Datasets& ds, const DataConfig& d, comm::ProcessGroup& pg) {
  std::string names;
  for (const std::string& c : ds.classes) names += c + '\n';
  detail::check_same_figures({{"train examples", ds.train ? static_cast<int64_t>(ds.train->size()) : -1},
                              {"test examples", ds.test ? static_cast<int64_t>(ds.test->size()) : -1},
                              {"classes", static_cast<int64_t>(ds.classes.size())},
                              {"class names", std::bit_cast<int64_t>(fnv1a(names)), false}},
                             fmt::format("data.dir '{}'", d.dir), pg);
}

std::vector<std::string> config_changes(const std::string& now, const std::string& before,
                                        const std::string& before_name) {
  const auto mine = flatten(now);
  const auto ref = flatten(before);
  std::map<std::string, std::string> ref_values(ref.begin(), ref.end());
  std::map<std::string, std::string> mine_values(mine.begin(), mine.end());
  std::vector<std::string> out;
  for (const auto& [key, value] : mine) {
    auto it = ref_values.find(key);
    if (it == ref_values.end()) {
      out.push_back(fmt::format("{} = {} ({}: not set)", key, value, before_name));
    } else if (it->second != value) {
      out.push_back(fmt::format("{} = {} ({}: {})", key, value, before_name, it->second));
    }
  }
  for (const auto& [key, value] : ref) {
    if (!mine_values.count(key)) out.push_back(fmt::format("{} not set ({}: {})", key, before_name, value));
  }
  return out;
}

void check_same_inputs(const std::vector<std::string>& items, const std::string& noun, const std::string& source,
                       comm::ProcessGroup& pg) {
  std::string all;
  for (const std::string& item : items) all += fmt::format("{}:{}", item.size(), item);  // unambiguous
  detail::check_same_figures({{noun, static_cast<int64_t>(items.size())},
                              {noun, std::bit_cast<int64_t>(fnv1a(all)), false}}, source, pg);
}

namespace detail {

std::vector<std::string> config_differences(const std::string& theirs, const std::string& base_toml, int base) {
  return config_changes(theirs, base_toml, fmt::format("rank {}", base));
}

void check_same_figures(const std::vector<Figure>& figures, const std::string& source, comm::ProcessGroup& pg) {
  const int world = pg.size();
  const auto k = static_cast<int64_t>(figures.size());
  if (world == 1 || k == 0) return;
  // As check_same_texts: k slots per rank, zero but for this rank's own, summed.
  Tensor all = Tensor::zeros({k * world}, DType::I64);
  int64_t* v = all.data<int64_t>();
  for (int64_t i = 0; i < k; ++i) v[k * pg.rank() + i] = figures[static_cast<size_t>(i)].value;
  pg.allreduce(all, {.op = comm::ReduceOp::Sum, .what = "the data sets' sizes"})->wait();
  std::vector<int> differing;
  std::vector<std::string> diffs;  // the first differing rank's
  for (int r = 1; r < world; ++r) {
    std::vector<std::string> mine;
    for (int64_t i = 0; i < k; ++i) {
      const Figure& f = figures[static_cast<size_t>(i)];
      const int64_t theirs = v[k * r + i], base = v[i];
      if (theirs == base) continue;
      mine.push_back(f.shown ? fmt::format("{} {} (rank 0: {})", theirs < 0 ? "no" : std::to_string(theirs), f.name,
                                           base < 0 ? "none" : std::to_string(base))
                             : fmt::format("other {}", f.name));
    }
    if (mine.empty()) continue;
    if (differing.empty()) diffs = std::move(mine);
    differing.push_back(r);
  }
  if (differing.empty()) return;
  const std::string listed = fmt::format("{}", fmt::join(diffs, ", "));
  DPT_THROW(ConfigError, "{} other data than rank 0 from {}: {}{} (every rank must read the same data set: on "
            "several nodes, identical copies at the same path)",
            differing.size() == 1 ? fmt::format("rank {} reads", differing.front())
                                  : fmt::format("{} read", ranks_phrase(differing)),
            source, differing.size() == 1 ? "" : fmt::format("rank {}'s: ", differing.front()), listed);
}

void check_same_texts(const std::string& config_toml, const std::string& version, comm::ProcessGroup& pg) {
  const int world = pg.size();
  if (world == 1) return;
  // Two slots per rank, zero but for this rank's own: the sum is everyone's hashes, exactly, on every backend.
  Tensor hashes = Tensor::zeros({2 * static_cast<int64_t>(world)}, DType::I64);
  int64_t* h = hashes.data<int64_t>();
  h[2 * pg.rank()] = std::bit_cast<int64_t>(fnv1a(config_toml));
  h[2 * pg.rank() + 1] = std::bit_cast<int64_t>(fnv1a(version));
  pg.allreduce(hashes, {.op = comm::ReduceOp::Sum})->wait();

  std::vector<int> config_ranks, version_ranks;  // the ranks whose config / build differ from rank 0's
  for (int r = 1; r < world; ++r) {
    if (h[2 * r] != h[0]) config_ranks.push_back(r);
    if (h[2 * r + 1] != h[1]) version_ranks.push_back(r);
  }
  if (config_ranks.empty() && version_ranks.empty()) return;

  // Every rank learns rank 0's texts and those of the first rank differing in each respect (same order everywhere).
  std::vector<int> roots{0};
  if (!version_ranks.empty()) roots.push_back(version_ranks.front());
  if (!config_ranks.empty() && (version_ranks.empty() || config_ranks.front() != version_ranks.front()))
    roots.push_back(config_ranks.front());
  std::map<int, std::pair<std::string, std::string>> texts;  // rank -> (version, config)
  for (int root : roots) {
    std::string v = broadcast_text(pg, root, version);
    std::string c = broadcast_text(pg, root, config_toml);
    texts[root] = {std::move(v), std::move(c)};
  }

  std::vector<std::string> parts;
  if (!version_ranks.empty()) {
    const int f = version_ranks.front();
    if (version_ranks.size() == 1) {
      parts.push_back(fmt::format("rank {} runs {}, rank 0 runs {}", f, texts[f].first, texts[0].first));
    } else {
      parts.push_back(fmt::format("{} run another build than rank 0 (rank {} runs {}, rank 0 runs {})",
                                  ranks_phrase(version_ranks), f, texts[f].first, texts[0].first));
    }
  }
  if (!config_ranks.empty()) {
    const int f = config_ranks.front();
    std::vector<std::string> diffs = config_differences(texts[f].second, texts[0].second);
    if (diffs.empty()) diffs.push_back("(the texts differ, but no key does)");
    if (diffs.size() > kMaxListedKeys) {
      const size_t more = diffs.size() - kMaxListedKeys;
      diffs.resize(kMaxListedKeys);
      diffs.push_back(fmt::format("and {} more", more));
    }
    const std::string listed = fmt::format("{}", fmt::join(diffs, ", "));
    if (config_ranks.size() == 1) {
      parts.push_back(fmt::format("rank {} was started with a config that differs from rank 0's: {}", f, listed));
    } else {
      parts.push_back(fmt::format("{} were started with a config that differs from rank 0's; rank {}'s: {}",
                                  ranks_phrase(config_ranks), f, listed));
    }
  }
  DPT_THROW(ConfigError, "{} (every rank must run the same dptrain with the same config file and overrides)",
            fmt::join(parts, "; "));
}

}  // namespace detail

}  // namespace dpt::trainer
