// tests/unit/core/test_tensor.cpp: Tensor views share storage; checks throw typed errors with both values.
#include <catch2/catch.hpp>

#include "core/check.h"
#include "core/tensor.h"

using namespace dpt;

TEST_CASE("tensor views share the flat buffer", "[core]") {
  Tensor flat = Tensor::zeros({10});
  Tensor w = flat.view(2, {2, 3});
  REQUIRE(w.numel() == 6);
  REQUIRE(w.shape_str() == "[2, 3]");
  w.data<float>()[0] = 5.0f;
  w.data<float>()[5] = 7.0f;
  REQUIRE(flat.data<float>()[2] == 5.0f);
  REQUIRE(flat.data<float>()[7] == 7.0f);
  REQUIRE_THROWS_AS(flat.view(5, {6}), InternalError);      // past the end
  REQUIRE_THROWS_AS(flat.data<int32_t>(), InternalError);   // wrong dtype
  Tensor empty = Tensor::zeros({0, 4});
  REQUIRE(empty.numel() == 0);
}

TEST_CASE("DPT_CHECK_EQ reports both values and the location", "[core]") {
  int a = 3, b = 4;
  try {
    DPT_CHECK_EQ(a, b);
    FAIL("no throw");
  } catch (const InternalError& e) {
    std::string msg = e.what();
    REQUIRE_THAT(msg, Catch::Contains("a == b") && Catch::Contains("(3 vs 4)") && Catch::Contains("test_tensor.cpp:"));
  }
  REQUIRE_THROWS_WITH([&] { DPT_CHECK(a > b, "a={}", a); }(), Catch::Contains("a > b: a=3"));
}

TEST_CASE("a shape whose element or byte count overflows is refused, not allocated small", "[core]") {
  // llama's model.intermediate_size = 2^63 - 1 made an MLP weight of [2^63 - 1, 128], whose count wrapped: a small
  // buffer, then SIGSEGV writing past it.
  REQUIRE_THROWS_AS(Tensor::empty({INT64_MAX, 128}, DType::F32, Device::cpu()), OutOfMemoryError);
  REQUIRE_THROWS_WITH(Tensor::empty({int64_t{1} << 62, 4}, DType::F32, Device::cpu()),
                      Catch::Contains("cannot allocate a tensor of shape [4611686018427387904, 4]"));
  REQUIRE_THROWS_AS(Tensor::zeros({int64_t{1} << 61, 2}, DType::F32, Device::cpu()), OutOfMemoryError);  // bytes
  REQUIRE_THROWS_AS(Tensor::empty({int64_t{1} << 32, int64_t{1} << 32, 2}, DType::F32, Device::cpu()),
                    OutOfMemoryError);  // 2^65 wraps to 0 elements
  REQUIRE(Tensor::empty({0, INT64_MAX}, DType::F32, Device::cpu()).numel() == 0);
}
