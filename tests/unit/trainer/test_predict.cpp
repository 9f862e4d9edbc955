// tests/unit/trainer/test_predict.cpp: `dptrain predict`'s parts (trainer/predict.h): image batches cover every
// input once, the same batches on any rank count, the softmax top-k in closed form, the jsonl and csv lines (parsed
// back: escaping and quoting), inputs from a folder or a list file, the gathered text in rank order on 1..3 ranks, the atomic write; prompts'
// batches (one window length each, every prompt once) and their lines gathered back into input order.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/check.h"
#include "data/image_io.h"
#include "tests/support/gloo_ranks.h"
#include "tests/support/temp_dir.h"
#include "trainer/predict_images.h"
#include "trainer/predict_prompts.h"

using namespace dpt;
using namespace dpt::trainer;
namespace fs = std::filesystem;

TEST_CASE("image batches: every input once, whole batches dealt in turn, the same batches on any rank count",
          "[predict]") {
  for (size_t n : {0, 1, 2, 7, 100, 101}) {
    for (size_t rows : {1, 3, 7, 64}) {
      for (int world : {1, 2, 3, 7}) {
        INFO("n " << n << " rows " << rows << " world " << world);
        std::vector<int> seen(n, 0);
        std::vector<ImageBatch> all;  // over the ranks, by batch index
        for (int r = 0; r < world; ++r) {
          for (const ImageBatch& b : image_batches(n, rows, r, world)) {
            REQUIRE(b.index % static_cast<size_t>(world) == static_cast<size_t>(r));  // batch j: rank j mod world
            REQUIRE(b.begin == b.index * rows);  // the same batches, rows and neighbours whatever the world size
            REQUIRE(b.end == std::min(n, b.begin + rows));
            REQUIRE(b.size() >= 1);
            for (size_t i = b.begin; i < b.end; ++i) ++seen[i];
            all.push_back(b);
          }
        }
        REQUIRE(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));
        REQUIRE(all.size() == image_batch_count(n, rows));
        std::sort(all.begin(), all.end(), [](const ImageBatch& a, const ImageBatch& b) { return a.index < b.index; });
        REQUIRE(all == image_batches(n, rows, 0, 1));  // one rank runs the same batches
      }
    }
  }
  // 200 images in batches of 7 on 2 ranks: rank 1 starts at image 7, not at 100 (a contiguous half).
  REQUIRE(image_batches(200, 7, 1, 2).front() == ImageBatch{1, 7, 14});
  REQUIRE(image_batches(200, 7, 0, 2).back() == ImageBatch{28, 196, 200});  // 29 batches, the last of 4 images
  REQUIRE(image_batches(3, 7, 1, 2).empty());  // fewer batches than ranks: a rank may have none
  REQUIRE_THROWS(image_batches(7, 3, 3, 3));
}

TEST_CASE("top_k: the softmax's largest, most likely first, ties by index", "[predict]") {
  // exp(logits - max) = {1/4, 1, 1/2, 1, 1/4}: sum 3, probabilities {1/12, 1/3, 1/6, 1/3, 1/12}.
  const float l2 = static_cast<float>(std::log(2.0));
  const std::vector<float> logits = {-2 * l2 + 5, 5, -l2 + 5, 5, -2 * l2 + 5};
  const auto top = top_k(logits.data(), 5, 3);
  REQUIRE(top.size() == 3);
  REQUIRE(top[0].index == 1);  // tie with 3: the lower index first
  REQUIRE(top[1].index == 3);
  REQUIRE(top[2].index == 2);
  REQUIRE(top[0].prob == Approx(1.0 / 3).epsilon(1e-6));
  REQUIRE(top[2].prob == Approx(1.0 / 6).epsilon(1e-6));
  REQUIRE(top_k(logits.data(), 5, 50).size() == 5);  // capped at the class count
  double sum = 0;
  for (const Scored& s : top_k(logits.data(), 5, 5)) sum += s.prob;
  REQUIRE(sum == Approx(1.0).epsilon(1e-12));
  // Large logits do not overflow (max subtracted).
  const std::vector<float> big = {1000.0f, 1000.0f};
  REQUIRE(top_k(big.data(), 2, 1)[0].prob == 0.5);
}

TEST_CASE("jsonl and csv lines parse back, names escaped and quoted", "[predict]") {
  const std::vector<std::string> classes = {"cat", "dog \"big\"", "a,b", "\xc3\xa9t\xc3\xa9"};
  const std::vector<Scored> top = {{2, 0.75}, {0, 0.1234567}};
  LineFormat f{.format = PredictFormat::jsonl, .k = 2, .classes = classes};
  REQUIRE(f.header().empty());
  const std::string line = f.prediction("val/x \"1\".png", top);
  REQUIRE(line == "{\"path\": \"val/x \\\"1\\\".png\", \"top\": [{\"index\": 2, \"class\": \"a,b\", \"prob\": 0.750000}, "
                  "{\"index\": 0, \"class\": \"cat\", \"prob\": 0.123457}]}\n");
  const auto j = nlohmann::json::parse(line);
  REQUIRE(j["path"] == "val/x \"1\".png");
  REQUIRE(j["top"][1]["prob"].get<double>() == 0.123457);
  const auto e = nlohmann::json::parse(f.error("b.png", "b.png: not a PNG or JPEG file"));
  REQUIRE(e["error"] == "b.png: not a PNG or JPEG file");
  REQUIRE(!e.contains("top"));
  REQUIRE(nlohmann::json::parse(f.prediction("u.png", {{3, 1.0}}))["top"][0]["class"] == classes[3]);

  f.format = PredictFormat::csv;
  REQUIRE(f.header() == "path,index_1,class_1,prob_1,index_2,class_2,prob_2,error\n");
  REQUIRE(f.prediction("a.png", top) == "a.png,2,\"a,b\",0.750000,0,cat,0.123457,\n");
  REQUIRE(f.prediction("x", {{1, 1.0}, {0, 0.0}}) == "x,1,\"dog \"\"big\"\"\",1.000000,0,cat,0.000000,\n");
  REQUIRE(f.error("b,c.png", "bad\nfile") == "\"b,c.png\",,,,,,,\"bad\nfile\"\n");  // as many columns as the header
  REQUIRE(parse_predict_format("csv") == PredictFormat::csv);
  REQUIRE_THROWS_AS(parse_predict_format("xml"), ConfigError);
}

TEST_CASE("csv fields replace invalid UTF-8 with U+FFFD as the JSON Lines output does", "[predict]") {
  const std::string fffd = "\xef\xbf\xbd";
  // A lone continuation byte (0xa5), a character cut short at the end, an overlong form, valid text around them.
  const std::string text = "caf\xc3\xa9 \xa5 ok, \xc0\xaf \xe2\x82";
  const std::string field = csv_field(text);
  REQUIRE(field.find('\xa5') == std::string::npos);
  REQUIRE(field.front() == '"');  // the comma quotes it
  const std::string unquoted = field.substr(1, field.size() - 2);
  REQUIRE(unquoted == nlohmann::json::parse(json_string(text)).get<std::string>());  // the same bytes as JSON's
  REQUIRE(unquoted.starts_with("caf\xc3\xa9 " + fffd + " ok, "));
  REQUIRE(unquoted.ends_with(fffd));
  REQUIRE(valid_utf8(unquoted) == unquoted);  // valid now: unchanged by another pass
  REQUIRE(csv_field("plain") == "plain");
  REQUIRE(csv_field("\xa5") == fffd);
  REQUIRE(valid_utf8("\xe6\x97\xa5\xf0\x9f\x99\x82") == "\xe6\x97\xa5\xf0\x9f\x99\x82");  // 日 and an emoji
}

TEST_CASE("prompts files: a line each, blank lines counted, or .jsonl records whose prompts span lines", "[predict]") {
  test::TempDir dir;
  std::ofstream(dir.file("p.txt")) << "Q: one\n\n   \r\n# kept\r\n\t\nlast";
  const PromptFile text = read_prompts(dir.file("p.txt"));
  REQUIRE(text.prompts == std::vector<std::string>{"Q: one", "# kept", "last"});
  REQUIRE(text.skipped == 3);
  REQUIRE_FALSE(text.jsonl);

  std::ofstream(dir.file("p.jsonl")) << R"({"prompt": "Q: 2+2?\nA:", "completion": " 4"})" "\n\n"
                                     << R"({"prompt": "   ", "id": 3})" "\r\n" << R"({"prompt": "x\ty"})";
  const PromptFile records = read_prompts(dir.file("p.jsonl"));
  REQUIRE(records.prompts == std::vector<std::string>{"Q: 2+2?\nA:", "   ", "x\ty"});
  REQUIRE(records.skipped == 1);
  REQUIRE(records.jsonl);

  std::ofstream(dir.file("bad.jsonl")) << R"({"prompt": "a"})" "\n" << R"({"text": "b"})" "\n";
  REQUIRE_THROWS_AS(read_prompts(dir.file("bad.jsonl")), ConfigError);
  REQUIRE_THROWS_WITH(read_prompts(dir.file("bad.jsonl")),
                      Catch::Contains(dir.file("bad.jsonl") + ":2: a {\"text\": ...} record holds no prompt"));
  std::ofstream(dir.file("broken.jsonl")) << "{\"prompt\": \"a\"\n";
  REQUIRE_THROWS_WITH(read_prompts(dir.file("broken.jsonl")), Catch::Contains("broken.jsonl:1: not JSON"));
  // A wrong --input is the command line's mistake (ConfigError: exit 2), as for images.
  REQUIRE_THROWS_AS(read_prompts(dir.file("missing.txt")), ConfigError);
  REQUIRE_THROWS_WITH(read_prompts(dir.file("missing.txt")), Catch::Contains("missing.txt not found"));
  REQUIRE_THROWS_AS(read_prompts(dir.path.string()), ConfigError);
  REQUIRE_THROWS_WITH(read_prompts(dir.path.string()),
                      Catch::Contains("is a directory: a GPT's or Llama's prompts are a file"));
}

TEST_CASE("inputs: a folder's images relative to it, or a list file's lines, sorted", "[predict]") {
  test::TempDir dir;
  const data::Image px{.height = 1, .width = 1, .channels = 1, .pixels = {9}};
  for (const char* name : {"b/2.png", "a.jpg", "b/10.PNG"}) data::write_png(dir.file(std::string("imgs/") + name), px.view());
  std::ofstream(dir.file("imgs/readme.txt")) << "not an image";
  const ImageInputs folder = list_image_inputs(dir.file("imgs"));
  REQUIRE(folder.names == std::vector<std::string>{"a.jpg", "b/10.PNG", "b/2.png"});
  REQUIRE(folder.file(1) == (dir.path / "imgs" / "b/10.PNG").string());

  std::ofstream(dir.file("list.txt")) << "z/1.png\n# a comment\n\n  \r\nc.jpg\r\n/abs/x.png\n";
  const ImageInputs list = list_image_inputs(dir.file("list.txt"));
  REQUIRE(list.root.empty());
  REQUIRE(list.names == std::vector<std::string>{"/abs/x.png", "c.jpg", "z/1.png"});
  REQUIRE(list.file(2) == "z/1.png");
  REQUIRE_THROWS_WITH(list_image_inputs(dir.file("missing")), Catch::Contains("missing not found"));
  // Prompts keep their order and '#' lines.
  REQUIRE(read_lines(dir.file("list.txt"), false) == std::vector<std::string>{"z/1.png", "# a comment", "c.jpg", "/abs/x.png"});
}

TEST_CASE("inputs: one image is one input, by its name or its first bytes, and a binary list is refused", "[predict]") {
  test::TempDir dir;
  const data::Image px{.height = 2, .width = 2, .channels = 1, .pixels = {9, 8, 7, 6}};
  data::write_png(dir.file("one.PNG"), px.view());
  data::write_jpeg(dir.file("photo.jpeg"), px.view(), 90);
  // An image is not a list of paths: its path, as given, is the one input.
  for (const char* name : {"one.PNG", "photo.jpeg"}) {
    const ImageInputs one = list_image_inputs(dir.file(name));
    REQUIRE(one.root.empty());
    REQUIRE(one.names == std::vector<std::string>{dir.file(name)});
    REQUIRE(one.file(0) == dir.file(name));
  }
  // Without an image's name, its signature tells (what read_image decodes by).
  fs::copy_file(dir.file("one.PNG"), dir.file("noext"));
  fs::copy_file(dir.file("photo.jpeg"), dir.file("photo.bin"));
  REQUIRE(list_image_inputs(dir.file("noext")).names == std::vector<std::string>{dir.file("noext")});
  REQUIRE(list_image_inputs(dir.file("photo.bin")).names == std::vector<std::string>{dir.file("photo.bin")});
  // A file named as an image but holding none is still one input (its decoding names it), not a list.
  std::ofstream(dir.file("garbage.jpg")) << "a.png\nb.png\n";
  REQUIRE(list_image_inputs(dir.file("garbage.jpg")).names == std::vector<std::string>{dir.file("garbage.jpg")});
  // A binary file that is no image (a GIF here) is no list either: a line holding a NUL byte is refused.
  const char gif[] = "GIF89a\x02\0\x02\0\n\0\0x.png\n";
  std::ofstream(dir.file("anim.gif"), std::ios::binary) << std::string(gif, sizeof gif - 1);
  REQUIRE_THROWS_AS(list_image_inputs(dir.file("anim.gif")), ConfigError);
  REQUIRE_THROWS_WITH(list_image_inputs(dir.file("anim.gif")),
                      Catch::Contains("anim.gif: its entry 1 (counting non-blank, non-comment lines) holds a NUL "
                                      "byte"));
}

TEST_CASE("batch_lines: an image that could not be read gets an error line, never a prediction", "[predict]") {
  const LineFormat jsonl{.format = PredictFormat::jsonl, .k = 1, .classes = {"a", "b"}};
  const std::vector<std::string> names{"x.png", "y.png", "z.png"};
  Tensor logits = Tensor::zeros({3, 2});
  for (int i = 0; i < 3; ++i) logits.data<float>()[2 * i + 1] = 1.0f;  // every row: class b
  // An error with an empty text (an exception whose what() is empty) is still an error.
  const std::vector<std::optional<std::string>> errors{std::nullopt, std::string(), std::string("z.png: bad")};
  size_t count = 0;
  const std::string text = batch_lines(jsonl, {.index = 0, .begin = 0, .end = 3}, errors, logits, names, &count);
  REQUIRE(count == 2);
  REQUIRE(text.starts_with("{\"path\": \"x.png\", \"top\": [{\"index\": 1, \"class\": \"b\""));
  REQUIRE(text.find("{\"path\": \"y.png\", \"error\": \"cannot be read\"}\n") != std::string::npos);
  REQUIRE(text.ends_with("{\"path\": \"z.png\", \"error\": \"z.png: bad\"}\n"));
}

TEST_CASE("gather_text: every rank's text on rank 0 in rank order, on 1, 2 and 3 ranks", "[predict][multirank]") {
  for (int world : {1, 2, 3}) {
    std::mutex mu;
    std::vector<std::string> got(static_cast<size_t>(world));
    const std::string errors = test::run_gloo_ranks(world, [&](comm::ProcessGroup& pg) {
      // Rank r: r + 1 lines, rank 1 none at all (an empty share).
      std::string mine;
      if (pg.rank() != 1)
        for (int i = 0; i <= pg.rank(); ++i) mine += fmt::format("rank {} line {}\n", pg.rank(), i);
      const std::string text = gather_text(mine, pg);
      std::lock_guard<std::mutex> lock(mu);
      got[static_cast<size_t>(pg.rank())] = text;
    });
    REQUIRE(errors.empty());
    std::string want = "rank 0 line 0\n";
    if (world == 3) want += "rank 2 line 0\nrank 2 line 1\nrank 2 line 2\n";
    REQUIRE(got[0] == want);
    for (int r = 1; r < world; ++r) REQUIRE(got[static_cast<size_t>(r)].empty());
  }
  // Nothing on any rank: nothing gathered.
  std::string empty = "x";
  REQUIRE(test::run_gloo_ranks(2, [&](comm::ProcessGroup& pg) {
            const std::string t = gather_text("", pg);
            if (pg.rank() == 0) empty = t;
          }).empty());
  REQUIRE(empty.empty());
}

TEST_CASE("prompt batches: prompts of one window length in input order, at most batch_size, every prompt once",
          "[predict]") {
  // Token counts; block_size 6: 6, 9 and 20 share the window 6.
  const std::vector<size_t> counts{3, 5, 3, 6, 3, 9, 3, 5, 20, 3};
  const std::vector<std::vector<size_t>> want{{0, 2, 4}, {1, 7}, {3, 5, 8}, {6, 9}};
  REQUIRE(prompt_batches(counts, 6, 3) == want);
  // Batch size 1: one prompt each, in input order; a batch size above the count: one batch per window length.
  const auto ones = prompt_batches(counts, 6, 1);
  REQUIRE(ones.size() == counts.size());
  for (size_t i = 0; i < ones.size(); ++i) REQUIRE(ones[i] == std::vector<size_t>{i});
  REQUIRE(prompt_batches(counts, 6, 64) == std::vector<std::vector<size_t>>{{0, 2, 4, 6, 9}, {1, 7}, {3, 5, 8}});
  // A larger block: 6, 9 and 20 apart.
  REQUIRE(prompt_batches(counts, 100, 2) ==
          std::vector<std::vector<size_t>>{{0, 2}, {1, 7}, {3}, {4, 6}, {5}, {8}, {9}});
  REQUIRE(prompt_batches({}, 6, 3).empty());
  REQUIRE_THROWS(prompt_batches(counts, 6, 0));
}

TEST_CASE("gather_in_order: lines given by index on any rank come back in index order on rank 0", "[predict][multirank]") {
  for (int world : {1, 2, 3}) {
    std::mutex mu;
    std::vector<std::string> got(static_cast<size_t>(world));
    const std::string errors = test::run_gloo_ranks(world, [&](comm::ProcessGroup& pg) {
      // Line i on rank (7 - i) mod world, last index first; lines with line breaks, commas, an empty one.
      std::vector<std::pair<size_t, std::string>> mine;
      for (size_t i = 8; i-- > 0;)
        if ((7 - i) % static_cast<size_t>(world) == static_cast<size_t>(pg.rank()))
          mine.emplace_back(i, i == 3 ? "" : fmt::format("\"line\n{}\",x\n", i));
      const std::string text = gather_in_order(mine, 8, pg);
      std::lock_guard<std::mutex> lock(mu);
      got[static_cast<size_t>(pg.rank())] = text;
    });
    REQUIRE(errors.empty());
    std::string want;
    for (size_t i = 0; i < 8; ++i)
      if (i != 3) want += fmt::format("\"line\n{}\",x\n", i);
    REQUIRE(got[0] == want);
    for (int r = 1; r < world; ++r) REQUIRE(got[static_cast<size_t>(r)].empty());
  }
  // A line missing: rank 0 says which.
  const std::string errors = test::run_gloo_ranks(1, [&](comm::ProcessGroup& pg) {
    gather_in_order({{0, "a\n"}, {2, "c\n"}}, 3, pg);
  });
  REQUIRE_THAT(errors, Catch::Contains("no rank gave line 1 of 3"));
}

TEST_CASE("write_file_atomically replaces the file whole and leaves no temporary", "[predict]") {
  test::TempDir dir;
  const std::string out = dir.file("preds.jsonl");
  std::ofstream(out) << "old contents, longer than the new ones\n";
  write_file_atomically(out, "new\n");
  REQUIRE(test::read_file(out) == "new\n");
  REQUIRE(!fs::exists(out + ".tmp"));
  REQUIRE_THROWS_AS(write_file_atomically((dir.path / "no/such/dir/x").string(), "x"), IoError);
}
