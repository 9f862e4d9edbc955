// trainer/choice.h: a configuration choice (a key that takes one of a few words) as an enum: the words it is written
// with, in the enum's order (ChoiceNames), the word of a value (choice_name) and the value of a word (parse_choice).
// The config layer parses each choice once (trainer/config.cpp's Kind<E>); the rest of the code switches on enums.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace dpt::trainer {

// Specialised beside each choice's enum: static constexpr std::array<std::string_view, N> names{...}.
template <class E> struct ChoiceNames;

template <class E>
concept Choice = requires { ChoiceNames<E>::names; };

// "adamw" for OptimizerKind::adamw: the word a config writes.
template <Choice E>
std::string choice_name(E e) {
  return std::string(ChoiceNames<E>::names.at(static_cast<size_t>(e)));
}

// The value written `word`; nullopt for a word the choice lacks.
template <Choice E>
std::optional<E> parse_choice(std::string_view word) {
  const auto& names = ChoiceNames<E>::names;
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == word) return static_cast<E>(i);
  return std::nullopt;
}

// "auto, cpu, cuda": the words, for an error message.
template <Choice E>
std::string choice_words(std::string_view separator = ", ") {
  std::string out;
  for (const std::string_view w : ChoiceNames<E>::names) {
    if (!out.empty()) out += separator;
    out += w;
  }
  return out;
}

}  // namespace dpt::trainer
