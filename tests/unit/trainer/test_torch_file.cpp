// tests/unit/trainer/test_torch_file.cpp: the restricted unpickler of torch.save's data.pkl (trainer/torch_file.h)
// on pickles written by hand, opcode by opcode: a state dict as torch.save writes one, and the inputs it must refuse
// with a CheckpointError naming the problem (globals beyond the allowed ones, opcodes a state dict does not use,
// truncation, bad memo indices, tensors reaching past their storage, expanded views, a cycle). half_to_float against
// a closed form over all 65536 halves. Files torch itself writes: integration.torch_weights.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "core/check.h"
#include "trainer/torch_file.h"

using namespace dpt;
using namespace dpt::trainer;

namespace {

// A pickle under construction: opcodes and their arguments.
struct Pickle {
  std::string b = "\x80\x02";  // PROTO 2
  Pickle& op(const std::string& s) {
    b += s;
    return *this;
  }
  Pickle& str(const std::string& s) {  // SHORT_BINUNICODE
    b += '\x8c';
    b += static_cast<char>(s.size());
    b += s;
    return *this;
  }
  Pickle& i(int v) {  // BININT1 or BININT
    if (v >= 0 && v < 256) {
      b += 'K';
      b += static_cast<char>(v);
    } else {
      b += 'J';
      b.append(reinterpret_cast<const char*>(&v), 4);
    }
    return *this;
  }
  Pickle& global(const std::string& module, const std::string& name) { return op("c" + module + "\n" + name + "\n"); }
  // _rebuild_tensor_v2(storage KEY of TYPE with NUMEL elements, offset, size, stride, False, OrderedDict())
  Pickle& tensor(const std::string& key, const std::string& type, int numel, int offset, const std::vector<int>& size,
                 const std::vector<int>& stride) {
    global("torch._utils", "_rebuild_tensor_v2").op("(");
    op("(").str("storage").global("torch", type).str(key).str("cpu").i(numel).op("tQ");  // the persistent id
    i(offset).op("(");
    for (int s : size) i(s);
    op("t(");
    for (int s : stride) i(s);
    op("t\x89");                                                   // NEWFALSE: requires_grad
    global("collections", "OrderedDict").op(")R");                  // backward hooks
    return op("tR");
  }
};

// A string literal with its embedded NULs.
template <size_t N>
std::string raw(const char (&s)[N]) {
  return std::string(s, N - 1);
}

std::vector<uint8_t> floats(std::initializer_list<float> v) {
  std::vector<uint8_t> out(v.size() * 4);
  std::memcpy(out.data(), v.begin(), out.size());
  return out;
}

SafetensorsFile unpickle(const std::string& pkl, const std::map<std::string, std::vector<uint8_t>>& storages = {}) {
  return unpickle_state_dict(reinterpret_cast<const uint8_t*>(pkl.data()), pkl.size(),
                             [&](const std::string& key) -> const std::vector<uint8_t>* {
                               auto it = storages.find(key);
                               return it == storages.end() ? nullptr : &it->second;
                             },
                             "test.pth");
}

}  // namespace

TEST_CASE("a state dict as torch.save writes one: OrderedDict, shared storage, strides, memo", "[torch_file]") {
  // OrderedDict() with {'w': [2, 3] of storage 0, 'wT': its transpose, 'row': row 1 (offset 3)}, the storage
  // reached again through the memo as torch.save's pickler does.
  Pickle p;
  p.global("collections", "OrderedDict").op(")R").op(raw("q\x00")).op("(");
  p.str("w").tensor("0", "FloatStorage", 6, 0, {2, 3}, {3, 1});
  p.str("wT").tensor("0", "FloatStorage", 6, 0, {3, 2}, {1, 3});
  p.str("row").tensor("0", "FloatStorage", 6, 3, {3}, {1});
  p.op("u.");
  const auto f = unpickle(p.b, {{"0", floats({1, 2, 3, 4, 5, 6})}});
  REQUIRE(f.tensors.size() == 3);
  CHECK(f.tensors[0].name == "w");
  CHECK(f.tensors[1].name == "wT");
  CHECK(f.tensors[2].name == "row");
  const Tensor& wt = f.tensors[1].tensor;
  REQUIRE(wt.shape() == std::vector<int64_t>{3, 2});
  const float want_t[] = {1, 4, 2, 5, 3, 6};
  for (int k = 0; k < 6; ++k) CHECK(wt.data<float>()[k] == want_t[k]);
  const Tensor& row = f.tensors[2].tensor;
  CHECK(row.data<float>()[0] == 4);
  CHECK(row.data<float>()[2] == 6);
}

TEST_CASE("a training checkpoint's 'model' is the state dict, other tops are refused naming them", "[torch_file]") {
  Pickle inner;
  inner.op("}").op("(").str("epoch").i(3).str("model").op("}").op("(").str("b");
  inner.tensor("0", "HalfStorage", 2, 0, {2}, {1}).op("u").op("u.");
  const uint16_t halves[] = {0x3C00, 0xC000};  // 1.0, -2.0
  std::vector<uint8_t> bytes(4);
  std::memcpy(bytes.data(), halves, 4);
  const auto f = unpickle(inner.b, {{"0", bytes}});
  REQUIRE(f.tensors.size() == 1);
  CHECK(f.tensors[0].tensor.dtype() == DType::F32);  // float16 widened
  CHECK(f.tensors[0].tensor.data<float>()[1] == -2.0f);

  // PyTorch's tutorial's general checkpoint: {'epoch': 3, 'model_state_dict': {...}, 'loss': 0.5}.
  Pickle tutorial;
  tutorial.op("}").op("(").str("epoch").i(3).str("model_state_dict").op("}").op("(").str("b");
  tutorial.tensor("0", "HalfStorage", 2, 0, {2}, {1}).op("u").str("loss");
  tutorial.op(raw("G\x3f\xe0\x00\x00\x00\x00\x00\x00")).op("u.");  // BINFLOAT 0.5
  const auto t = unpickle(tutorial.b, {{"0", bytes}});
  REQUIRE(t.tensors.size() == 1);
  CHECK(t.tensors[0].name == "b");
  CHECK(t.tensors[0].tensor.data<float>()[0] == 1.0f);

  Pickle notdict;
  notdict.op("]").str("x").op("a.");
  CHECK_THROWS_WITH(unpickle(notdict.b), Catch::Contains("holds a list, not a dict of tensors"));
  Pickle intval;
  intval.op("}").str("epoch").i(3).op("s.");
  CHECK_THROWS_WITH(unpickle(intval.b), Catch::Contains("'epoch' is an int, not a tensor"));
}

TEST_CASE("globals and opcodes a state dict does not use are refused, naming them", "[torch_file]") {
  Pickle sys;
  sys.global("os", "system").str("touch /tmp/x").op("\x85R.");
  CHECK_THROWS_AS(unpickle(sys.b), CheckpointError);
  CHECK_THROWS_WITH(unpickle(sys.b), Catch::Contains("names the global os.system") && Catch::Contains("test.pth"));
  Pickle posix;
  posix.global("posix", "system").op(".");
  CHECK_THROWS_WITH(unpickle(posix.b), Catch::Contains("posix.system"));
  Pickle stack;
  stack.str("builtins").str("getattr").op("\x93.");
  CHECK_THROWS_WITH(unpickle(stack.b), Catch::Contains("builtins.getattr"));
  Pickle torch_other;
  torch_other.global("torch", "load").op(".");
  CHECK_THROWS_WITH(unpickle(torch_other.b), Catch::Contains("torch.load"));
  for (const char* op : {"i", "o", "\x81", "\x92", "P", "d", "l", "0", "2", "\x8f"}) {
    Pickle p;
    p.op("}").op(op).op(".");
    INFO("opcode " << static_cast<int>(static_cast<uint8_t>(op[0])));
    CHECK_THROWS_WITH(unpickle(p.b), Catch::Contains("which torch.save of a state dict does not write"));
  }
  // torch.save(model): the whole module pickled, its class the first global. The refusal says what to save instead.
  for (const auto& [module, name] : {std::pair{"torch.nn.modules.container", "Sequential"}, {"__main__", "Net"},
                                     {"transformers.models.gpt2.modeling_gpt2", "GPT2LMHeadModel"}}) {
    Pickle whole;
    whole.global(module, name).op(")\x81.");
    CHECK_THROWS_WITH(unpickle(whole.b), Catch::Contains(std::string("names the global ") + module + "." + name) &&
                                             Catch::Contains("torch.save(model.state_dict(), PATH)"));
  }
  CHECK_THROWS_WITH(unpickle(sys.b), !Catch::Contains("torch.save(model)"));  // os.system is no model's class
  Pickle storage_call;  // a storage type is a global, not something to call
  storage_call.global("torch", "FloatStorage").op(")R.");
  CHECK_THROWS_WITH(unpickle(storage_call.b), Catch::Contains("torch.FloatStorage called"));
}

TEST_CASE("malformed pickles end in a CheckpointError, never a crash", "[torch_file]") {
  auto refused = [](const std::string& pkl, const char* why, std::map<std::string, std::vector<uint8_t>> st = {}) {
    INFO(why);
    CHECK_THROWS_WITH(unpickle(pkl, st), Catch::Contains(why));
  };
  refused(std::string("\x80\x02}"), "ends without STOP");
  refused(raw("\x80\x02X\xff\xff\x00\x00"), "past the end");
  refused(std::string("\x80\x02h\x05."), "memo entry 5 was never stored");
  refused(std::string("\x80\x02."), "pop from an empty stack");
  refused(std::string("\x80\x02(."), "pop from an empty stack");  // a MARK hides what is below it
  refused(std::string("\x80\x02t."), "no MARK");
  refused(std::string("\x80\x02}K\x01s."), "an empty stack");
  refused(std::string("\x80\x02]K\x01K\x02s."), "SETITEM is a list");
  refused(std::string("\x80\x02}}."), "STOP with more on the stack");
  refused(std::string("\x80\x09}."), "pickle protocol 9");
  refused(std::string("\x80\x02\x8a\x09") + std::string(9, '\x01') + ".", "an integer of 9 bytes");
  refused(std::string("\x80\x02") + "c" + std::string(300, 'a') + "\nb\n.", "longer than 256 bytes");
  // A list appended to itself (a cycle) is no tensor dict, and costs nothing to throw away.
  refused(raw("\x80\x02]q\x00h\x00" "a."), "holds a list");

  Pickle past;  // a [4] tensor from offset 3 of a 6-element storage
  past.op("}").str("w").tensor("0", "FloatStorage", 6, 3, {4}, {1}).op("s.");
  refused(past.b, "reaching element 6 of storage 0, which has 6", {{"0", floats({1, 2, 3, 4, 5, 6})}});
  Pickle expanded;  // 1000 elements of a 1-element storage (stride 0)
  expanded.op("}").str("w").tensor("0", "FloatStorage", 1, 0, {1000}, {0}).op("s.");
  refused(expanded.b, "an expanded view", {{"0", floats({1})}});
  Pickle short_storage;  // the pickle claims 6 elements, the archive holds 2
  short_storage.op("}").str("w").tensor("0", "FloatStorage", 6, 0, {6}, {1}).op("s.");
  refused(short_storage.b, "holds only 8 bytes", {{"0", floats({1, 2})}});
  Pickle missing;
  missing.op("}").str("w").tensor("7", "FloatStorage", 1, 0, {1}, {1}).op("s.");
  refused(missing.b, "storage 7 is not in the archive", {});
  Pickle negative;
  negative.op("}").str("w").tensor("0", "FloatStorage", 2, 0, {2}, {-1}).op("s.");
  refused(negative.b, "a negative stride", {{"0", floats({1, 2})}});
  Pickle mismatch;  // the same storage key with two types
  mismatch.op("}(").str("a").tensor("0", "FloatStorage", 2, 0, {2}, {1});
  mismatch.str("b").tensor("0", "LongStorage", 1, 0, {1}, {1}).op("u.");
  refused(mismatch.b, "named twice with different types", {{"0", floats({1, 2})}});
}

TEST_CASE("views copied over and over are refused, and a safetensors header of 640 bytes is not the legacy format",
          "[torch_file]") {
  // 100 views of one 16-element storage: 1600 elements of copies, past four times the storage (and 1 MiB) only
  // for larger storages; with a 64 Ki-element storage, 100 views are 25 MiB of copies for a 256 KiB storage.
  Pickle p;
  p.op("}(");
  for (int k = 0; k < 100; ++k) p.str(std::string("v").append(std::to_string(k))).tensor("0", "FloatStorage", 65536, 0, {65536}, {1});
  p.op("u.");
  std::vector<uint8_t> big(65536 * 4, 0);
  CHECK_THROWS_WITH(unpickle(p.b, {{"0", big}}), Catch::Contains("more than 4 times its storages'"));
  Pickle few;  // two views (a tied head) are fine
  few.op("}(").str("a").tensor("0", "FloatStorage", 65536, 0, {65536}, {1});
  few.str("b").tensor("0", "FloatStorage", 65536, 0, {256, 256}, {1, 256}).op("u.");
  CHECK(unpickle(few.b, {{"0", big}}).tensors.size() == 2);

  const uint8_t legacy[] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc};
  const uint8_t st640[] = {0x80, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, '{'};  // a header of 640 bytes
  CHECK(looks_like_legacy_torch(legacy, sizeof(legacy)));
  CHECK_FALSE(looks_like_legacy_torch(st640, sizeof(st640)));
  CHECK_FALSE(looks_like_zip(st640, sizeof(st640)));
  // Such a file reads as safetensors through read_weights_file.
  std::string header = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  header.resize(640, ' ');
  std::string file(8, '\0');
  file[0] = static_cast<char>(0x80);
  file[1] = 0x02;
  file += header;
  const float w[2] = {1.5f, -2.0f};
  file.append(reinterpret_cast<const char*>(w), 8);
  const std::string path = "/tmp/dpt_test_st640.safetensors";
  {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    REQUIRE(f);
    std::fwrite(file.data(), 1, file.size(), f);
    std::fclose(f);
  }
  const SafetensorsFile read = read_weights_file(path);
  std::remove(path.c_str());
  REQUIRE(read.tensors.size() == 1);
  CHECK(read.tensors[0].tensor.data<float>()[1] == -2.0f);
}

TEST_CASE("a torch.save file cut short is refused as truncated, not as no zip at all", "[torch_file]") {
  // The fuzz seed torch.save's layout (tests/fuzz/make_corpus.py): a zip whose central directory comes last.
  std::FILE* f = std::fopen(DPT_SOURCE_DIR "/tests/fuzz/corpus/torch_file/state_dict.pth", "rb");
  REQUIRE(f);
  std::vector<uint8_t> bytes(1 << 16);
  bytes.resize(std::fread(bytes.data(), 1, bytes.size(), f));
  std::fclose(f);
  REQUIRE(looks_like_zip(bytes.data(), bytes.size()));
  REQUIRE(read_torch_zip(bytes.data(), bytes.size(), "whole.pth").tensors.size() > 0);
  for (const size_t keep : {bytes.size() - 1, bytes.size() - 22, bytes.size() / 2, size_t{64}}) {
    INFO("the first " << keep << " of " << bytes.size() << " bytes");
    CHECK_THROWS_WITH(read_torch_zip(bytes.data(), keep, "cut.pth"),
                      Catch::Contains("cut.pth") && Catch::Contains("truncated"));
  }
  const uint8_t not_zip[] = {'n', 'o', 't', ' ', 'a', ' ', 'z', 'i', 'p', '!'};  // no zip's start: no such claim
  CHECK_THROWS_WITH(read_torch_zip(not_zip, sizeof(not_zip), "other"), !Catch::Contains("truncated"));
}

TEST_CASE("half_to_float: every half, against the closed form", "[torch_file]") {
  for (uint32_t h = 0; h < 65536; ++h) {
    const int sign = (h >> 15) ? -1 : 1, exp = (h >> 10) & 31, mant = h & 1023;
    const float got = half_to_float(static_cast<uint16_t>(h));
    if (exp == 31) {
      if (mant == 0) {
        REQUIRE(std::isinf(got));
        REQUIRE((got < 0) == (sign < 0));
      } else {
        REQUIRE(std::isnan(got));
      }
      continue;
    }
    const double want = sign * (exp == 0 ? std::ldexp(mant, -24) : std::ldexp(1024 + mant, exp - 25));
    INFO("half 0x" << std::hex << h);
    REQUIRE(static_cast<double>(got) == want);
    REQUIRE(std::signbit(got) == (sign < 0));
  }
}
