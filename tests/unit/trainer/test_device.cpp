// tests/unit/trainer/test_device.cpp: choose_device: train.device = auto | cpu | cuda, one GPU per local
// rank (mod the device count), and the errors when the request cannot be met.
#include <catch2/catch.hpp>

#include "core/check.h"
#include "trainer/trainer.h"

using namespace dpt;
using dpt::trainer::choose_device;
using Catch::Matchers::Contains;

TEST_CASE("choose_device: cuda:LOCAL_RANK mod the device count, else cpu", "[device]") {
  CHECK(choose_device("auto", 0, 0, "no driver") == Device::cpu());
  CHECK(choose_device("cpu", 3, 8, "") == Device::cpu());
  CHECK(choose_device("auto", 0, 1, "") == Device::cuda(0));
  CHECK(choose_device("auto", 3, 8, "") == Device::cuda(3));
  CHECK(choose_device("cuda", 5, 4, "") == Device::cuda(1));  // more local ranks than GPUs: they share
  CHECK(choose_device("auto", 1, 1, "") == Device::cuda(0));
  CHECK_THROWS_AS(choose_device("cuda", 0, 0, "CUDA driver version is insufficient"), ConfigError);
  CHECK_THROWS_WITH(choose_device("cuda", 0, 0, "CUDA driver version is insufficient"),
                    Contains("no usable GPU") && Contains("CUDA driver version is insufficient") &&
                        Contains("train.device = auto or cpu"));
  CHECK_THROWS_WITH(choose_device("tpu", 0, 0, ""), Contains("auto, cpu, cuda"));
}
