#pragma once
// Numbers within bounds, as grammars that are exact for the decimal spelling: a number is generated only if
// its value lies within the bounds, and every prefix the grammar accepts can still be completed within them
// (so decoding never reaches a dead end). Bounds are compared in decimal, digit by digit, never as doubles.
// Bounded numbers are spelled without exponent; docs/structured-output.md gives the rules.
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "grammar/json_grammar.h"

namespace strata::grammar {

// A decimal number: `integer` without leading zeros ("0" for zero), `fraction` without trailing zeros.
struct Decimal {
  bool negative = false;
  std::string integer = "0";
  std::string fraction;
};

// The decimal a JSON number spells (doubles: their shortest round-trip spelling). nullopt when it is not
// finite or its magnitude reaches 1e18.
std::optional<Decimal> decimal_from_json(const nlohmann::json& number);

struct NumberBounds {
  std::optional<Decimal> lower, upper;
  bool lower_exclusive = false, upper_exclusive = false;
};

// The numbers (integers only when `integer`) within `bounds`; nullopt when there is none.
std::optional<uint32_t> bounded_number(JsonGrammarBuilder& json, const NumberBounds& bounds, bool integer);

}  // namespace strata::grammar
