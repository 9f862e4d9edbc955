// core/cli_checks.h: the command-line checks dptrain's programs share. CLI11's own PositiveNumber and
// NonNegativeNumber name the whole double range when they refuse a value ("Value 0 not in range 0.000000 to
// 1797693134862315708145..."); these say what the value must be.
#pragma once

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "core/edit_distance.h"

namespace dpt::cli {

namespace detail {
inline CLI::Validator at_least(bool strict, const char* desc) {
  return CLI::Validator(
      [strict](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (text.empty() || end != text.c_str() + text.size()) return "'" + text + "' is not a number";
        if (!std::isfinite(v)) return "must be a finite number (got " + text + ")";
        if (strict ? !(v > 0) : !(v >= 0))
          return std::string("must be ") + (strict ? "> 0" : ">= 0") + " (got " + text + ")";
        return {};
      },
      desc);
}
}  // namespace detail

// A finite number above 0 (inf and nan refused).
inline const CLI::Validator Positive = detail::at_least(true, "POSITIVE");
// A finite number of 0 or more.
inline const CLI::Validator NonNegative = detail::at_least(false, "NONNEGATIVE");
// A probability mass: above 0, at most 1.
inline const CLI::Validator Fraction = CLI::Validator(
    [](std::string& text) -> std::string {
      char* end = nullptr;
      const double v = std::strtod(text.c_str(), &end);
      if (text.empty() || end != text.c_str() + text.size()) return "'" + text + "' is not a number";
      if (!(v > 0 && v <= 1)) return "must be in (0, 1] (got " + text + ")";
      return {};
    },
    "(0, 1]");

using dpt::edit_distance;  // the nearest name to a misspelt subcommand or option

// The name among `names` fewest edits from `word`, if fewer than `limit`; else "".
inline std::string nearest_name(const std::string& word, const std::vector<std::string>& names, size_t limit = 3) {
  std::string nearest;
  for (const std::string& n : names) {
    const size_t d = edit_distance(word, n);
    if (d < limit) limit = d, nearest = n;
  }
  return nearest;
}

}  // namespace dpt::cli
