// tests/fuzz/fuzz_config.cpp: libFuzzer target for the config parser (trainer/config.cpp, with toml++
// compiled in, instrumented): the input is TOML text, optionally followed by a NUL byte and `key=value`
// overrides one per line. Bad input must end in dpt::ConfigError (any dpt::Error is accepted). A config that
// parses must print (to_toml) as TOML that parses back to the same config.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/check.h"
#include "trainer/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string text = input.substr(0, nul);
  std::vector<std::string> overrides;
  if (nul != std::string::npos) {
    size_t pos = nul + 1;
    while (pos <= input.size()) {
      size_t end = input.find('\n', pos);
      if (end == std::string::npos) end = input.size();
      overrides.push_back(input.substr(pos, end - pos));
      pos = end + 1;
    }
  }
  std::string printed;
  try {
    printed = dpt::trainer::to_toml(dpt::trainer::parse_config(text, "fuzz.toml", overrides));
  } catch (const dpt::Error&) {
    return 0;  // rejected with dptrain's own error: the expected outcome for bad input
  }
  // The effective config is stored in checkpoints and compared by hash on resume: it must read back as itself.
  std::string again;
  try {
    again = dpt::trainer::to_toml(dpt::trainer::parse_config(printed, "printed.toml"));
  } catch (const dpt::Error& e) {
    std::fprintf(stderr, "the printed config does not parse back: %s\n--- printed:\n%s\n", e.what(), printed.c_str());
    std::abort();
  }
  if (again != printed) {
    std::fprintf(stderr, "the printed config reads back differently:\n--- printed:\n%s\n--- again:\n%s\n",
                 printed.c_str(), again.c_str());
    std::abort();
  }
  return 0;
}
