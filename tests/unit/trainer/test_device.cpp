// tests/unit/trainer/test_device.cpp: choose_device: train.device = auto | cpu | cuda, one GPU per local
// rank (mod the device count), and the errors when the request cannot be met.
#include <catch2/catch.hpp>

#include "core/check.h"
#include "trainer/trainer.h"

using namespace dpt;
using dpt::trainer::choose_device;
using Catch::Matchers::Contains;
constexpr auto Auto = dpt::trainer::DeviceChoice::automatic, Cpu = dpt::trainer::DeviceChoice::cpu,
               Cuda = dpt::trainer::DeviceChoice::cuda;

TEST_CASE("choose_device: cuda:LOCAL_RANK mod the device count, else cpu", "[device]") {
  CHECK(choose_device(Auto, 0, 0, "no driver") == Device::cpu());
  CHECK(choose_device(Cpu, 3, 8, "") == Device::cpu());
  CHECK(choose_device(Auto, 0, 1, "") == Device::cuda(0));
  CHECK(choose_device(Auto, 3, 8, "") == Device::cuda(3));
  CHECK(choose_device(Cuda, 5, 4, "") == Device::cuda(1));  // more local ranks than GPUs: they share
  CHECK(choose_device(Auto, 1, 1, "") == Device::cuda(0));
  CHECK_THROWS_AS(choose_device(Cuda, 0, 0, "CUDA driver version is insufficient"), ConfigError);
  CHECK_THROWS_WITH(choose_device(Cuda, 0, 0, "CUDA driver version is insufficient"),
                    Contains("no usable GPU") && Contains("CUDA driver version is insufficient") &&
                        Contains("train.device = auto or cpu"));
  // generate's --device: the option it names is the one the user gave.
  CHECK_THROWS_WITH(choose_device(Cuda, 0, 0, "no driver", "--device"),
                    Contains("--device cuda, but there is no usable GPU") && Contains("use --device auto or cpu"));
  // Another word never gets this far: the config refuses it.
  CHECK_THROWS_WITH(trainer::load_config("", {"train.device=tpu"}), Contains("must be one of: auto, cpu, cuda"));
  CHECK(trainer::load_config("", {"train.device=cuda"}).train.device == Cuda);
}
