// trainer/parallel/buckets.cpp: bucket assignment, and ZeRO's chunks of a bucket.
#include "trainer/parallel/buckets.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "core/check.h"

namespace dpt::trainer {

std::vector<Bucket> assign_buckets(const std::vector<size_t>& sizes, size_t cap_bytes, size_t first_cap_bytes,
                                   size_t elem_bytes) {
  DPT_CHECK(cap_bytes > 0 && first_cap_bytes > 0 && elem_bytes > 0, "bucket caps {} and {}, element {} bytes",
            cap_bytes, first_cap_bytes, elem_bytes);
  std::vector<size_t> offsets(sizes.size() + 1, 0);
  for (size_t i = 0; i < sizes.size(); ++i) offsets[i + 1] = offsets[i] + sizes[i];
  std::vector<Bucket> out;
  size_t end = sizes.size();  // the bucket being filled holds parameters [i, end)
  size_t bytes = 0;
  for (size_t i = sizes.size(); i-- > 0;) {
    const size_t cap = out.empty() ? first_cap_bytes : cap_bytes;
    const size_t b = sizes[i] * elem_bytes;
    if (end != i + 1 && bytes > 0 && bytes + b > cap) {  // close the bucket [i + 1, end)
      out.push_back({offsets[i + 1], offsets[end] - offsets[i + 1], i + 1, end});
      end = i + 1;
      bytes = 0;
    }
    bytes += b;
  }
  if (end > 0) out.push_back({0, offsets[end], 0, end});
  return out;
}

std::string bucket_summary(const std::vector<Bucket>& buckets) {
  std::vector<std::string> parts;
  for (const auto& b : buckets) parts.push_back(fmt::format("{:.2f} MB", static_cast<double>(b.count) * 4 / 1e6));
  return fmt::format("sizes {} (last layers first)", fmt::join(parts, ", "));
}

BucketMap::BucketMap(const std::vector<Bucket>& buckets, size_t num_params) : bucket_of_param_(num_params, 0) {
  for (size_t b = 0; b < buckets.size(); ++b)
    for (size_t p = buckets[b].first_param; p < buckets[b].end_param; ++p) bucket_of_param_[p] = b;
}

Chunks chunks_of(size_t count, size_t world, size_t rank) {
  DPT_CHECK(world > 0 && rank < world, "rank {} of {}", rank, world);
  const size_t q = count / world;
  return {.q = q, .split = world * q, .mine = rank * q, .rem = count - world * q};
}

OwnedPieces owned_pieces(const std::vector<Bucket>& buckets, size_t world, size_t rank) {
  OwnedPieces out;
  // Increasing offset: the buckets run from the end of the buffer to its start.
  for (size_t i = buckets.size(); i-- > 0;) {
    const Bucket& b = buckets[i];
    const Chunks c = chunks_of(b.count, world, rank);
    if (c.q > 0) {
      out.ranges.push_back({b.offset + c.mine, c.q});
      out.by_all.push_back(false);
    }
    if (c.rem > 0) {
      out.ranges.push_back({b.offset + c.split, c.rem});
      out.by_all.push_back(true);
    }
  }
  return out;
}

size_t OwnedPieces::index_at(size_t offset) const {
  const auto it = std::lower_bound(ranges.begin(), ranges.end(), offset,
                                   [](const FlatRange& r, size_t o) { return r.offset < o; });
  DPT_CHECK(it != ranges.end() && it->offset == offset, "no owned piece at offset {}", offset);
  return static_cast<size_t>(it - ranges.begin());
}

}  // namespace dpt::trainer
