// tests/unit/models/test_generate.cpp: sampling the next token: top_k = 1 is argmax (lowest index on a tie),
// top_k limits the candidates, the frequencies follow softmax(logits / temperature), a seed repeats, and
// vocab_limit keeps to the tokenizer's ids;
// generation from a GPT appends exactly `count` tokens, repeats for a seed, and keeps to the block size; a batch of
// prompts generated side by side gives each its own generate text.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <numeric>

#include "models/generate.h"
#include "models/gpt/gpt.h"

using namespace dpt;
using namespace dpt::models;

TEST_CASE("sample_token: greedy, top-k, temperature and seeds", "[models][generate]") {
  const std::vector<float> logits{1.0f, 3.0f, 0.5f, 3.0f, 2.0f};
  std::mt19937_64 rng(1);
  REQUIRE(sample_token(logits.data(), 5, {.temperature = 1.0, .top_k = 1}, rng) == 1);  // tie: the lower index
  std::map<int32_t, int> seen;
  const int n = 20000;
  for (int i = 0; i < n; ++i) ++seen[sample_token(logits.data(), 5, {.temperature = 1.0, .top_k = 3}, rng)];
  REQUIRE(seen.size() == 3);  // tokens 1, 3 and 4 only
  const double z = 2 * std::exp(3.0) + std::exp(2.0);
  REQUIRE(seen[1] / double(n) == Approx(std::exp(3.0) / z).margin(0.015));
  REQUIRE(seen[4] / double(n) == Approx(std::exp(2.0) / z).margin(0.015));
  // Temperature 0.5 squares the odds: p(4) / p(1) = e^(2 (2 - 3)).
  seen.clear();
  for (int i = 0; i < n; ++i) ++seen[sample_token(logits.data(), 5, {.temperature = 0.5, .top_k = 0}, rng)];
  REQUIRE(seen[4] / double(seen[1]) == Approx(std::exp(-2.0)).margin(0.02));
  std::mt19937_64 a(7), b(7);
  for (int i = 0; i < 50; ++i)
    REQUIRE(sample_token(logits.data(), 5, {.temperature = 1.5}, a) == sample_token(logits.data(), 5, {.temperature = 1.5}, b));
}

TEST_CASE("sample_token: vocab_limit keeps to the tokenizer's ids when the model's vocabulary is larger", "[models][generate]") {
  const std::vector<float> logits{1.0f, 3.0f, 0.5f, 3.0f, 9.0f};  // the padded id 4 would win
  std::mt19937_64 rng(1);
  REQUIRE(sample_token(logits.data(), 5, {.top_k = 1, .vocab_limit = 4}, rng) == 1);
  REQUIRE(sample_token(logits.data(), 5, {.top_k = 1, .vocab_limit = 0}, rng) == 4);  // 0: no limit
  REQUIRE(sample_token(logits.data(), 5, {.top_k = 1, .vocab_limit = 9}, rng) == 4);  // above the vocabulary: none
  std::map<int32_t, int> seen;
  for (int i = 0; i < 2000; ++i) ++seen[sample_token(logits.data(), 5, {.temperature = 2.0, .vocab_limit = 3}, rng)];
  REQUIRE(seen.size() == 3);  // 0, 1 and 2 only
  REQUIRE(seen.rbegin()->first == 2);
}

TEST_CASE("generate: count new tokens, the same for a seed, beyond the block size", "[models][generate]") {
  models::GptOptions o{.n_layer = 1, .n_head = 2, .n_embd = 8, .vocab_size = 256, .block_size = 4};
  auto model = models::make_gpt(o);
  model->init(5);
  const std::vector<int32_t> prompt{72, 105};
  const auto x = generate(*model, o.block_size, prompt, 9, {}, 3);
  REQUIRE(x.size() == 11);  // past block_size: the context slides
  REQUIRE(x[0] == 72);
  REQUIRE(x[1] == 105);
  for (int32_t t : x) REQUIRE((t >= 0 && t < 256));
  REQUIRE(generate(*model, o.block_size, prompt, 9, {}, 3) == x);
  REQUIRE(generate(*model, o.block_size, prompt, 9, {}, 4) != x);
}

TEST_CASE("generate with the KV cache gives the sliding window's text within a block, and runs past it", "[models][generate]") {
  models::GptOptions o{.n_layer = 2, .n_head = 2, .n_embd = 16, .vocab_size = 300, .block_size = 12};
  auto model = models::make_gpt(o);
  model->init(8);
  const std::vector<int32_t> prompt{7, 250, 3};
  for (uint64_t seed : {1, 2, 3}) {
    const auto cached = generate(*model, o.block_size, prompt, 9, {.temperature = 0.8}, seed, /*kv_cache=*/true);
    const auto window = generate(*model, o.block_size, prompt, 9, {.temperature = 0.8}, seed, /*kv_cache=*/false);
    REQUIRE(cached.size() == 12);
    // 12 tokens: the cache never restarts. Equal texts from logits equal within rounding (test_gpt's KV cache
    // test): a draw turns only within ~1e-6 of a boundary, and these seeds' draws are nowhere near one on any of
    // the kernel sets tried (OpenBLAS Prescott, Sandybridge, Haswell, Zen, SkylakeX, Cooperlake).
    REQUIRE(cached == window);
  }
  // Past block_size the cache restarts from half a window: 40 tokens, ids in the vocabulary (not the padding),
  // the same for a seed; the model is left without a cache.
  const auto longer = generate(*model, o.block_size, prompt, 40, {}, 5);
  REQUIRE(longer.size() == 43);
  for (int32_t t : longer) REQUIRE((t >= 0 && t < 300));
  REQUIRE(generate(*model, o.block_size, prompt, 40, {}, 5) == longer);
  REQUIRE(dynamic_cast<models::Gpt&>(model->root()).kv_cache_len() == 0);
  // A prompt longer than the block: its last block_size tokens give the first new token, as the sliding window's;
  // the cache is then full and restarts from half a window, so what follows may differ from the window's.
  std::vector<int32_t> long_prompt(20, 11);
  const auto cached = generate(*model, o.block_size, long_prompt, 3, {}, 6, true);
  const auto window = generate(*model, o.block_size, long_prompt, 3, {}, 6, false);
  REQUIRE(cached.size() == 23);
  REQUIRE(std::vector<int32_t>(cached.begin(), cached.begin() + 21) ==
          std::vector<int32_t>(window.begin(), window.begin() + 21));
}

TEST_CASE("generate_batch: each sequence gets generate's tokens for its prompt and seed, in lockstep past the block",
          "[models][generate]") {
  models::GptOptions o{.n_layer = 2, .n_head = 2, .n_embd = 16, .vocab_size = 300, .block_size = 8};
  auto model = models::make_gpt(o);
  model->init(9);
  const SampleOptions sampling{.temperature = 0.9, .top_k = 20};
  // Three prompts of one length, and three of different lengths all at least block_size (one window length).
  const std::vector<std::vector<std::vector<int32_t>>> batches{
      {{5, 6, 7}, {200, 1, 2}, {5, 6, 7}},
      {std::vector<int32_t>(8, 3), std::vector<int32_t>(11, 4), std::vector<int32_t>(20, 5)}};
  for (bool kv_cache : {true, false})
    for (const auto& prompts : batches) {
      const std::vector<uint64_t> seeds{21, 22, 21};
      int64_t steps = 0, tokens = 0;
      // 19 new tokens: past block_size, so the cache restarts (twice) on every sequence at once.
      const auto got = generate_batch(*model, o.block_size, prompts, 19, sampling, seeds, kv_cache,
                                      [&](int64_t n) {
                                        ++steps;
                                        tokens += n;
                                      });
      REQUIRE(steps == 19);
      REQUIRE(tokens == 57);
      REQUIRE(got.size() == 3);
      for (size_t i = 0; i < 3; ++i) {
        CAPTURE(kv_cache, i);
        // 3 rows against 1: equal within rounding, and these draws are far from a boundary (as above).
        REQUIRE(got[i] == generate(*model, o.block_size, prompts[i], 19, sampling, seeds[i], kv_cache));
      }
      REQUIRE(got[0] != got[1]);  // their own prompts, or seeds, count
      if (prompts[0] == prompts[2]) REQUIRE(got[0] == got[2]);  // the same prompt and seed: the same text
      REQUIRE(dynamic_cast<models::Gpt&>(model->root()).kv_cache_len() == 0);
    }
  // A batch of one is generate; no new tokens gives the prompts back.
  REQUIRE(generate_batch(*model, o.block_size, {{9, 8}}, 5, sampling, {3}).front() ==
          generate(*model, o.block_size, {9, 8}, 5, sampling, 3));
  REQUIRE(generate_batch(*model, o.block_size, {{9, 8}, {1, 2}}, 0, sampling, {3, 3}) ==
          std::vector<std::vector<int32_t>>{{9, 8}, {1, 2}});
  // Windows of different lengths cannot move in lockstep.
  REQUIRE_THROWS_WITH(generate_batch(*model, o.block_size, {{1, 2, 3}, {1, 2}}, 4, sampling, {1, 1}),
                      Catch::Contains("their windows differ"));
  REQUIRE_THROWS_WITH(generate_batch(*model, o.block_size, {{1, 2, 3}, std::vector<int32_t>(9, 1)}, 4, sampling, {1, 1}),
                      Catch::Contains("their windows differ"));
  REQUIRE_THROWS(generate_batch(*model, o.block_size, {{1}, {2}}, 4, sampling, {1}));  // a seed per prompt
}

TEST_CASE("generate_batch: a sequence ends at the stop token, the others go on unchanged, and when all ended it stops",
          "[models][generate]") {
  models::GptOptions o{.n_layer = 1, .n_head = 2, .n_embd = 16, .vocab_size = 12, .block_size = 8};
  auto model = models::make_gpt(o);
  model->init(4);
  const SampleOptions free{.temperature = 1.0};
  const std::vector<std::vector<int32_t>> prompts{{5, 6, 7}, {1, 2, 3}, {7, 7, 7}};
  const std::vector<uint64_t> seeds{1, 2, 3};
  const auto full = generate_batch(*model, o.block_size, prompts, 19, free, seeds);
  // The stop token: sequence 0's second new token (its first is another here: it ends after 2).
  const int32_t stop = full[0][4];
  SampleOptions stopping = free;
  stopping.stop_token = stop;
  int64_t steps = 0;
  const auto got = generate_batch(*model, o.block_size, prompts, 19, stopping, seeds, true, [&](int64_t) { ++steps; });
  size_t last = 0;  // the step at which the last sequence ended (or 19)
  for (size_t i = 0; i < 3; ++i) {
    CAPTURE(i, stop);
    const auto from = full[i].begin() + 3;
    const auto at = std::find(from, full[i].end(), stop);
    const std::vector<int32_t> want(full[i].begin(), at == full[i].end() ? at : at + 1);
    REQUIRE(got[i] == want);
    last = std::max(last, want.size() - 3);
    // generate() of one prompt ends the same way.
    REQUIRE(generate(*model, o.block_size, prompts[i], 19, stopping, seeds[i]) == want);
  }
  REQUIRE(got[0].size() == 5);
  REQUIRE(static_cast<size_t>(steps) == last);
  // A prompt that holds the stop token is no stop: only sampled tokens are.
  const auto free_out = generate(*model, o.block_size, {stop, stop}, 6, free, 9);
  const auto at = std::find(free_out.begin() + 2, free_out.end(), stop);
  REQUIRE(generate(*model, o.block_size, {stop, stop}, 6, stopping, 9) ==
          std::vector<int32_t>(free_out.begin(), at == free_out.end() ? at : at + 1));
}

TEST_CASE("sample_token: top_p keeps the nucleus, as Hugging Face's TopPLogitsWarper after top-k", "[models][generate]") {
  // Probabilities 0.5, 0.3, 0.15, 0.05 (token 2 first, then 0, 3, 1). Each set below is the one transformers 4.45's
  // TemperatureLogitsWarper, TopKLogitsWarper and TopPLogitsWarper keep on these logits (checked by hand).
  const std::vector<float> logits{std::log(0.3f), std::log(0.05f), std::log(0.5f), std::log(0.15f)};
  const int n = 20000;
  const auto draw = [&](SampleOptions o) {
    std::mt19937_64 rng(3);
    std::map<int32_t, int> seen;
    for (int i = 0; i < n; ++i) ++seen[sample_token(logits.data(), 4, o, rng)];
    return seen;
  };
  // 0.75: 0.5 is below it, so the next token (0.3) joins and reaches it: {2, 0}, renormalised to 5/8 and 3/8.
  auto seen = draw({.top_p = 0.75});
  REQUIRE(seen.size() == 2);
  CHECK(seen[2] / double(n) == Approx(0.625).margin(0.015));
  CHECK(seen[0] / double(n) == Approx(0.375).margin(0.015));
  CHECK(draw({.top_p = 0.9}).size() == 3);       // 0.8 below 0.9: token 3 too
  CHECK(draw({.top_p = 0.4}) == std::map<int32_t, int>{{2, n}});  // the first token alone reaches it
  CHECK(draw({.top_p = 1.0}).size() == 4);       // off
  // After top-k = 2, the nucleus is of the renormalised pair: 0.5 / 0.8 = 0.625 is below 0.7, so both stay.
  CHECK(draw({.top_k = 2, .top_p = 0.7}).size() == 2);
  CHECK(draw({.top_k = 2, .top_p = 0.6}).size() == 1);
  // Temperature comes first: at 0.1 token 2 holds nearly all the mass, alone in a 0.9 nucleus.
  CHECK(draw({.temperature = 0.1, .top_p = 0.9}).size() == 1);
}

TEST_CASE("sample_token: top_k keeps every token tied with the k-th, as transformers' TopKLogitsWarper",
          "[models][generate]") {
  // TopKLogitsWarper(2) on [1, 3, 2, 2, 2, 0] removes the scores below the 2nd largest, 2: it keeps 1, 2, 3 and 4.
  const std::vector<float> logits{1.0f, 3.0f, 2.0f, 2.0f, 2.0f, 0.0f};
  std::mt19937_64 rng(5);
  std::map<int32_t, int> seen;
  const int n = 20000;
  for (int i = 0; i < n; ++i) ++seen[sample_token(logits.data(), 6, {.top_k = 2}, rng)];
  REQUIRE(seen.size() == 4);
  REQUIRE(!seen.contains(0));
  REQUIRE(!seen.contains(5));
  const double z = std::exp(3.0) + 3 * std::exp(2.0);
  CHECK(seen[1] / double(n) == Approx(std::exp(3.0) / z).margin(0.015));
  for (int32_t id : {2, 3, 4}) CHECK(seen[id] / double(n) == Approx(std::exp(2.0) / z).margin(0.015));
  // top_k = 3 reaches the same tie; top_k = 5 has no tie at its 5th (0 is alone below): all but token 5.
  seen.clear();
  for (int i = 0; i < 2000; ++i) ++seen[sample_token(logits.data(), 6, {.top_k = 3}, rng)];
  REQUIRE(seen.size() == 4);
  seen.clear();
  for (int i = 0; i < 4000; ++i) ++seen[sample_token(logits.data(), 6, {.temperature = 3.0, .top_k = 5}, rng)];
  REQUIRE(seen.size() == 5);
  REQUIRE(!seen.contains(5));
  // top_k = 1 stays greedy (generate(do_sample=False)): the lower index of a tie for the largest.
  const std::vector<float> twin{2.0f, 5.0f, 5.0f};
  for (int i = 0; i < 20; ++i) REQUIRE(sample_token(twin.data(), 3, {.top_k = 1}, rng) == 1);
}

namespace {

// sample_token as it was written first: one stable sort of every id by descending logit (the order its draws follow);
// top_k keeps the ties of the k-th too.
int32_t sample_token_by_stable_sort(const float* logits, int64_t vocab, const SampleOptions& o, std::mt19937_64& rng) {
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  const int64_t k = o.top_k == 0 ? vocab : std::min(o.top_k, vocab);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  if (k == 1) return order[0];
  size_t kept = static_cast<size_t>(k);  // and every logit equal to the k-th (TopKLogitsWarper's ties)
  while (kept < order.size() && logits[order[kept]] == logits[order[static_cast<size_t>(k) - 1]]) ++kept;
  order.resize(kept);
  std::vector<double> p(order.size());
  const double top = logits[order[0]];
  double sum = 0;
  for (size_t i = 0; i < order.size(); ++i) sum += p[i] = std::exp((logits[order[i]] - top) / o.temperature);
  if (o.top_p < 1) {
    double above = 0;
    size_t kept = 0;
    while (kept < p.size() && (kept == 0 || above < o.top_p * sum)) above += p[kept++];
    p.resize(kept);
    order.resize(kept);
    sum = above;
  }
  double u = uniform(rng, 0.0f, 1.0f) * sum;
  for (size_t i = 0; i < order.size(); ++i) {
    if (u < p[i]) return order[i];
    u -= p[i];
  }
  return order.back();
}

}  // namespace

TEST_CASE("sample_token draws what one stable sort of every id gives, ties, -0 and -inf included",
          "[models][generate]") {
  std::mt19937_64 gen(11);
  for (int round = 0; round < 60; ++round) {
    const int64_t vocab = 1 + static_cast<int64_t>(gen() % 700);
    std::vector<float> logits(static_cast<size_t>(vocab));
    for (auto& l : logits) {
      const uint64_t r = gen() % 10;  // many ties: a few values, signed zeros, -inf
      l = r == 0 ? -0.0f : r == 1 ? 0.0f : r == 2 ? -INFINITY : static_cast<float>(gen() % 7) - 3.0f;
    }
    logits[static_cast<size_t>(gen() % static_cast<uint64_t>(vocab))] = 1.0f;  // one finite top at least
    for (int64_t top_k : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{5}, vocab - 1, vocab, vocab + 3})
      for (double top_p : {1.0, 0.9, 0.3})
        for (double temperature : {1.0, 0.5}) {
          const SampleOptions o{.temperature = temperature, .top_k = std::max<int64_t>(top_k, 0), .top_p = top_p};
          std::mt19937_64 a(static_cast<uint64_t>(round)), b(static_cast<uint64_t>(round));
          for (int draw = 0; draw < 5; ++draw)
            REQUIRE(sample_token(logits.data(), vocab, o, a) ==
                    sample_token_by_stable_sort(logits.data(), vocab, o, b));
        }
  }
}

TEST_CASE("apply_repetition_penalty: transformers' RepetitionPenaltyLogitsProcessor on the ids seen",
          "[models][generate]") {
  // Positive logits divided, negative multiplied, 0 kept; each id once however often it occurs; ids outside the
  // vocabulary ignored; the others untouched.
  std::vector<float> logits{2.0f, -2.0f, 0.0f, 3.0f, -1.0f};
  const std::vector<int32_t> seen{0, 1, 2, 0, 0, 1, 7, -1};
  apply_repetition_penalty(logits.data(), 5, seen, 2.0);
  REQUIRE(logits == std::vector<float>{1.0f, -4.0f, 0.0f, 3.0f, -1.0f});
  // Below 1 it favours them: 1 / 0.5 and -4 * 0.5.
  apply_repetition_penalty(logits.data(), 5, seen, 0.5);
  REQUIRE(logits == std::vector<float>{2.0f, -2.0f, 0.0f, 3.0f, -1.0f});
  // In float, as torch computes score / penalty and score * penalty on float32 scores.
  std::vector<float> odd{0.7f, -0.3f};
  apply_repetition_penalty(odd.data(), 2, std::vector<int32_t>{0, 1}, 1.3);
  REQUIRE(odd == std::vector<float>{0.7f / 1.3f, -0.3f * 1.3f});
  std::vector<float> same = logits;
  apply_repetition_penalty(same.data(), 5, seen, 1.0);  // 1: off
  REQUIRE(same == logits);
  REQUIRE_THROWS_WITH(apply_repetition_penalty(same.data(), 5, seen, 0.0), Catch::Contains("must be > 0"));
  REQUIRE_THROWS_WITH(apply_repetition_penalty(same.data(), 5, seen, -1.5), Catch::Contains("must be > 0"));
}

TEST_CASE("generate_batch: repetition_penalty penalizes each sequence's own text, prompt included, before sampling",
          "[models][generate]") {
  models::GptOptions o{.n_layer = 2, .n_head = 2, .n_embd = 16, .vocab_size = 20, .block_size = 8};
  auto model = models::make_gpt(o);
  model->init(13);
  const std::vector<std::vector<int32_t>> prompts{{3, 4, 5}, {9, 9, 1}};
  // The reference: the sliding window's logits, the penalty over the whole sequence, argmax (lower id on a tie).
  const double penalty = 3.0;
  const auto reference = [&](std::vector<int32_t> seq, int64_t count) {
    model->set_training(false);
    for (int64_t n = 0; n < count; ++n) {
      const auto t = static_cast<int64_t>(std::min<size_t>(seq.size(), static_cast<size_t>(o.block_size)));
      Tensor x = Tensor::empty({1, t}, DType::I32);
      std::copy(seq.end() - t, seq.end(), x.data<int32_t>());
      const Tensor& logits = model->forward(x);
      const int64_t vocab = logits.dim(1);  // the model's, padded
      std::vector<float> row(logits.data<float>() + (t - 1) * vocab, logits.data<float>() + t * vocab);
      for (int32_t id = 0; id < vocab; ++id)
        if (std::find(seq.begin(), seq.end(), id) != seq.end()) row[id] = row[id] < 0 ? row[id] * 3.0f : row[id] / 3.0f;
      seq.push_back(static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin()));
    }
    return seq;
  };
  const SampleOptions greedy{.top_k = 1, .repetition_penalty = penalty};
  for (bool kv_cache : {true, false}) {
    CAPTURE(kv_cache);
    // 5 new tokens: within the block, where the cache and the window give the same logits.
    const auto got = generate_batch(*model, o.block_size, prompts, 5, greedy, {1, 2}, kv_cache);
    for (size_t i = 0; i < prompts.size(); ++i) REQUIRE(got[i] == reference(prompts[i], 5));
  }
  // The penalty changes this text (so the comparisons above can tell).
  const auto plain = generate(*model, o.block_size, prompts[0], 5, {.top_k = 1}, 1);
  REQUIRE(plain != generate(*model, o.block_size, prompts[0], 5, greedy, 1));
  // Sampled: the same seed, the same text; a penalty refused before any token is drawn.
  const SampleOptions sampled{.temperature = 0.7, .repetition_penalty = 1.5};
  REQUIRE(generate(*model, o.block_size, prompts[1], 12, sampled, 4) ==
          generate(*model, o.block_size, prompts[1], 12, sampled, 4));
  REQUIRE_THROWS_WITH(generate(*model, o.block_size, prompts[1], 3, {.repetition_penalty = 0}, 4),
                      Catch::Contains("repetition_penalty 0: must be > 0"));
}

TEST_CASE("ban_repeated_ngrams: transformers' NoRepeatNGramLogitsProcessor on the text so far", "[models][generate]") {
  const auto banned = [](std::vector<int32_t> seen, int64_t n, int64_t vocab = 6) {
    std::vector<float> logits(static_cast<size_t>(vocab), 1.0f);
    ban_repeated_ngrams(logits.data(), vocab, seen, n);
    std::vector<int32_t> ids;
    for (int32_t i = 0; i < vocab; ++i)
      if (logits[i] == -INFINITY) ids.push_back(i);
      else REQUIRE(logits[i] == 1.0f);
    return ids;
  };
  // 2-grams: the text ends in 1; 1 was followed by 2 and by 4 before: both banned.
  REQUIRE(banned({1, 2, 3, 1, 4, 1}, 2) == std::vector<int32_t>{2, 4});
  // 3-grams: "1 2" was followed by 3 once; "2 1" (the end of {.., 2, 1}) by nothing.
  REQUIRE(banned({1, 2, 3, 1, 2}, 3) == std::vector<int32_t>{3});
  REQUIRE(banned({1, 2, 3, 2, 1}, 3).empty());
  // 1-grams: every token of the text; 0: off; a text too short for an n-gram bans nothing (n - 1 tokens included).
  REQUIRE(banned({5, 0, 5}, 1) == std::vector<int32_t>{0, 5});
  REQUIRE(banned({1, 1, 1}, 0).empty());
  REQUIRE(banned({1, 1}, 3).empty());
  REQUIRE(banned({1, 1, 1}, 3) == std::vector<int32_t>{1});
  // Ids outside the vocabulary (the model's, when the text holds others) are skipped.
  REQUIRE(banned({7, 7, 7}, 2, 6).empty());
  std::vector<float> one{1.0f};
  REQUIRE_THROWS_WITH(ban_repeated_ngrams(one.data(), 1, std::vector<int32_t>{0}, -1), Catch::Contains(">= 0"));
}

TEST_CASE("generate_batch: no_repeat_ngram_size never repeats an n-gram, and refuses to sample when all are banned",
          "[models][generate]") {
  models::GptOptions o{.n_layer = 2, .n_head = 2, .n_embd = 16, .vocab_size = 6, .block_size = 32};
  auto model = models::make_gpt(o);
  model->init(13);
  const std::vector<int32_t> prompt{3, 4, 3};
  for (bool kv_cache : {true, false})
    for (const SampleOptions& s : {SampleOptions{.top_k = 1, .vocab_limit = 6, .no_repeat_ngram_size = 2},
                                   SampleOptions{.temperature = 2.0, .vocab_limit = 6, .no_repeat_ngram_size = 2}}) {
      CAPTURE(kv_cache, s.top_k);
      // 6 ids make 36 2-grams: 20 new tokens can avoid every repeat (and without the ban greedy text repeats).
      const auto got = generate(*model, o.block_size, prompt, 20, s, 3, kv_cache);
      REQUIRE(got.size() == 23);
      std::set<std::pair<int32_t, int32_t>> pairs;
      for (size_t i = 0; i + 1 < got.size(); ++i) REQUIRE(pairs.insert({got[i], got[i + 1]}).second);
    }
  const auto plain = generate(*model, o.block_size, prompt, 20, {.top_k = 1, .vocab_limit = 6}, 3);
  std::set<std::pair<int32_t, int32_t>> pairs;
  bool repeats = false;
  for (size_t i = 0; i + 1 < plain.size(); ++i) repeats |= !pairs.insert({plain[i], plain[i + 1]}).second;
  REQUIRE(repeats);
  // 1-grams over 6 ids: after the prompt's 2 distinct ids, 4 new tokens use up the vocabulary. Greedy then takes id 0
  // (torch's argmax of all -inf); sampling is refused, naming the option, instead of drawing the last id in silence.
  const SampleOptions once{.temperature = 1.0, .vocab_limit = 6, .no_repeat_ngram_size = 1};
  REQUIRE(generate(*model, o.block_size, prompt, 4, once, 3).size() == 7);
  REQUIRE_THROWS_WITH(generate(*model, o.block_size, prompt, 5, once, 3),
                      Catch::Contains("every token is banned (no_repeat_ngram_size 1"));
  auto greedy_once = once;
  greedy_once.top_k = 1;
  REQUIRE(generate(*model, o.block_size, prompt, 5, greedy_once, 3).back() == 0);
  REQUIRE(dynamic_cast<models::Gpt&>(model->root()).kv_cache_len() == 0);  // the cache ended with the error
}

TEST_CASE("generate_batch: min_new_tokens keeps the stop token out of each sequence's first new tokens",
          "[models][generate]") {
  models::GptOptions o{.n_layer = 1, .n_head = 2, .n_embd = 16, .vocab_size = 12, .block_size = 16};
  auto model = models::make_gpt(o);
  model->init(4);
  const std::vector<std::vector<int32_t>> prompts{{5, 6, 7}, {1, 2, 3}};
  // The stop token: sequence 0's first greedy token, so that without a minimum it ends at once.
  const int32_t stop = generate(*model, o.block_size, prompts[0], 1, {.top_k = 1}, 1)[3];
  SampleOptions s{.top_k = 1, .stop_token = stop};
  REQUIRE(generate_batch(*model, o.block_size, prompts, 10, s, {1, 2})[0].size() == 4);
  for (const SampleOptions& base : {s, SampleOptions{.temperature = 1.5, .stop_token = stop}})
    for (bool kv_cache : {true, false}) {
      SampleOptions at_least = base;
      at_least.min_new_tokens = 4;
      const auto got = generate_batch(*model, o.block_size, prompts, 10, at_least, {1, 2}, kv_cache);
      for (size_t i = 0; i < prompts.size(); ++i) {
        CAPTURE(kv_cache, base.top_k, i);
        REQUIRE(got[i].size() >= 7);  // 4 new tokens at least, none of them the stop token
        REQUIRE(std::find(got[i].begin() + 3, got[i].begin() + 7, stop) == got[i].begin() + 7);
        // After them it may end the text again: at its first stop token, if any.
        const auto at = std::find(got[i].begin() + 7, got[i].end(), stop);
        REQUIRE((at == got[i].end() ? got[i].size() == 13 : at + 1 == got[i].end()));
      }
    }
  // No stop token: nothing to keep out.
  REQUIRE(generate(*model, o.block_size, prompts[0], 6, {.top_k = 1, .min_new_tokens = 3}, 1) ==
          generate(*model, o.block_size, prompts[0], 6, {.top_k = 1}, 1));
  REQUIRE_THROWS(generate(*model, o.block_size, prompts[0], 6, {.top_k = 1, .min_new_tokens = -1}, 1));
}
