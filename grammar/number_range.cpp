#include "grammar/number_range.h"

#include <cmath>
#include <utility>
#include <vector>

namespace strata::grammar {

namespace {

constexpr uint64_t kLargestUnbounded = 999'999'999'999'999'999ULL;  // kMaxIntegerDigits nines

// A bound on a magnitude (a number without its sign).
struct MagnitudeBound {
  Decimal value;
  bool strict = false;
};

// While generating a fraction digit by digit, each bound is either still "tight" (the digits so far equal the
// bound's: the rest of its digits still constrain) or satisfied for good (nullopt).
using Tight = std::optional<std::string>;

Decimal canonical(bool negative, std::string integer, std::string fraction) {
  size_t first = integer.find_first_not_of('0');
  integer = first == std::string::npos ? "0" : integer.substr(first);
  size_t last = fraction.find_last_not_of('0');
  fraction = last == std::string::npos ? "" : fraction.substr(0, last + 1);
  bool zero = integer == "0" && fraction.empty();
  return Decimal{negative && !zero, integer, fraction};
}

class NumberRangeBuilder {
 public:
  explicit NumberRangeBuilder(GrammarBuilder& builder) : g_(builder) {}

  uint32_t integer_range(uint64_t first, uint64_t last);
  std::optional<uint32_t> magnitude(const MagnitudeBound& lower, const std::optional<MagnitudeBound>& upper);

 private:
  uint32_t same_length_range(const std::string& first, const std::string& last);
  uint32_t any_digits(uint32_t count) { return g_.repeat(g_.byte_range('0', '9'), count, count); }
  std::optional<uint32_t> fraction(const Tight& lower, bool lower_strict, const Tight& upper, bool upper_strict);
  std::optional<uint32_t> fraction_digits(const Tight& lower, bool lower_strict, const Tight& upper,
                                          bool upper_strict, int remaining);
  std::optional<uint32_t> fraction_tail(const Tight& lower, bool lower_strict, const Tight& upper,
                                        bool upper_strict, int remaining);

  GrammarBuilder& g_;
  int fraction_cap_ = kMaxFractionDigits;
};

// Can the fraction stop here (the remaining digits being all zeros)?
bool can_end(const Tight& lower, bool lower_strict, const Tight& upper, bool upper_strict) {
  bool lower_ok = !lower || (lower->empty() && !lower_strict);
  bool upper_ok = !upper || !upper->empty() || !upper_strict;
  return lower_ok && upper_ok;
}

// The bound after digit `d`: satisfied for good, still tight (its next digits), or violated (false).
std::pair<bool, Tight> after_digit(const Tight& bound, char d, bool is_lower) {
  if (!bound) return {true, std::nullopt};
  char digit = bound->empty() ? '0' : (*bound)[0];
  if (d == digit) return {true, bound->empty() ? std::string() : bound->substr(1)};
  bool beyond = is_lower ? d > digit : d < digit;
  return {beyond, std::nullopt};
}

uint32_t NumberRangeBuilder::same_length_range(const std::string& first, const std::string& last) {
  if (first == last) return g_.literal(first);
  if (first.size() == 1) return g_.byte_range(first[0], last[0]);
  std::string first_rest = first.substr(1), last_rest = last.substr(1);
  uint32_t rest_length = static_cast<uint32_t>(first_rest.size());
  if (first_rest.find_first_not_of('0') == std::string::npos &&
      last_rest.find_first_not_of('9') == std::string::npos) {
    return g_.sequence({g_.byte_range(first[0], last[0]), any_digits(rest_length)});
  }
  if (first[0] == last[0]) {
    return g_.sequence({g_.literal(first.substr(0, 1)), same_length_range(first_rest, last_rest)});
  }
  std::vector<uint32_t> alternatives{g_.sequence(
      {g_.literal(first.substr(0, 1)), same_length_range(first_rest, std::string(rest_length, '9'))})};
  if (first[0] + 1 <= last[0] - 1) {
    alternatives.push_back(g_.sequence({g_.byte_range(first[0] + 1, last[0] - 1), any_digits(rest_length)}));
  }
  alternatives.push_back(
      g_.sequence({g_.literal(last.substr(0, 1)), same_length_range(std::string(rest_length, '0'), last_rest)}));
  return g_.choice(std::move(alternatives));
}

// [first, last] in canonical decimal (no leading zeros): one same-length range per number of digits.
uint32_t NumberRangeBuilder::integer_range(uint64_t first, uint64_t last) {
  std::vector<uint32_t> alternatives;
  uint64_t length_start = 0, length_end = 9;
  for (int length = 1; length <= 20 && length_start <= last; ++length) {
    uint64_t lo = std::max(first, length_start), hi = std::min(last, length_end);
    if (lo <= hi) alternatives.push_back(same_length_range(std::to_string(lo), std::to_string(hi)));
    if (length_end > UINT64_MAX / 10) break;
    length_start = length_end + 1;
    length_end = length_end * 10 + 9;
  }
  return g_.choice(std::move(alternatives));
}

std::optional<uint32_t> NumberRangeBuilder::fraction_tail(const Tight& lower, bool lower_strict, const Tight& upper,
                                                          bool upper_strict, int remaining) {
  std::vector<uint32_t> alternatives;
  if (can_end(lower, lower_strict, upper, upper_strict)) alternatives.push_back(g_.empty());
  if (auto more = fraction_digits(lower, lower_strict, upper, upper_strict, remaining)) {
    alternatives.push_back(*more);
  }
  if (alternatives.empty()) return std::nullopt;
  return g_.choice(std::move(alternatives));
}

// One digit or more, each bound followed while it is tight; digits with the same outcome share a byte range.
std::optional<uint32_t> NumberRangeBuilder::fraction_digits(const Tight& lower, bool lower_strict,
                                                            const Tight& upper, bool upper_strict, int remaining) {
  if (remaining == 0) return std::nullopt;
  if (!lower && !upper) return g_.repeat(g_.byte_range('0', '9'), 1, remaining);
  std::vector<uint32_t> alternatives;
  char d = '0';
  while (d <= '9') {
    auto [lower_ok, next_lower] = after_digit(lower, d, true);
    auto [upper_ok, next_upper] = after_digit(upper, d, false);
    char last = d;
    while (last < '9' && after_digit(lower, last + 1, true) == std::pair(lower_ok, next_lower) &&
           after_digit(upper, last + 1, false) == std::pair(upper_ok, next_upper)) {
      ++last;
    }
    if (lower_ok && upper_ok) {
      if (auto tail = fraction_tail(next_lower, lower_strict, next_upper, upper_strict, remaining - 1)) {
        alternatives.push_back(g_.sequence({g_.byte_range(d, last), *tail}));
      }
    }
    d = last + 1;
  }
  if (alternatives.empty()) return std::nullopt;
  return g_.choice(std::move(alternatives));
}

// No fraction, or "." and digits, such that 0.<digits> lies within the tight bounds.
std::optional<uint32_t> NumberRangeBuilder::fraction(const Tight& lower, bool lower_strict, const Tight& upper,
                                                     bool upper_strict) {
  std::vector<uint32_t> alternatives;
  if (can_end(lower, lower_strict, upper, upper_strict)) alternatives.push_back(g_.empty());
  if (auto digits = fraction_digits(lower, lower_strict, upper, upper_strict, fraction_cap_)) {
    alternatives.push_back(g_.sequence({g_.literal("."), *digits}));
  }
  if (alternatives.empty()) return std::nullopt;
  return g_.choice(std::move(alternatives));
}

// Magnitudes m with lower <= m <= upper (or <), integer part then fraction: the integer part equal to a bound's
// keeps that bound tight in the fraction; one strictly between leaves the fraction free.
std::optional<uint32_t> NumberRangeBuilder::magnitude(const MagnitudeBound& lower,
                                                      const std::optional<MagnitudeBound>& upper) {
  uint64_t lower_int = std::stoull(lower.value.integer);
  uint64_t upper_int = upper ? std::stoull(upper->value.integer) : kLargestUnbounded;
  fraction_cap_ = std::max<int>(kMaxFractionDigits,
                                2 + std::max(lower.value.fraction.size(), upper ? upper->value.fraction.size() : 0));
  if (lower_int > upper_int) return std::nullopt;
  std::vector<uint32_t> alternatives;
  auto add = [&](uint32_t integer_part, std::optional<uint32_t> fraction_part) {
    if (fraction_part) alternatives.push_back(g_.sequence({integer_part, *fraction_part}));
  };
  if (upper && lower_int == upper_int) {
    add(g_.literal(lower.value.integer),
        fraction(lower.value.fraction, lower.strict, upper->value.fraction, upper->strict));
  } else {
    add(g_.literal(lower.value.integer), fraction(lower.value.fraction, lower.strict, std::nullopt, false));
    uint64_t middle_last = upper ? upper_int - 1 : kLargestUnbounded;
    if (lower_int + 1 <= middle_last) {
      add(integer_range(lower_int + 1, middle_last), fraction(std::nullopt, false, std::nullopt, false));
    }
    if (upper) add(g_.literal(upper->value.integer), fraction(std::nullopt, false, upper->value.fraction, upper->strict));
  }
  if (alternatives.empty()) return std::nullopt;
  return g_.choice(std::move(alternatives));
}

int64_t signed_integer(const Decimal& d) {
  int64_t magnitude = std::stoll(d.integer);
  return d.negative ? -magnitude : magnitude;
}

// The integer bounds [first, last] (inclusive) that `bounds` leaves to integers.
std::pair<int64_t, int64_t> integer_bounds(const NumberBounds& bounds) {
  int64_t first = -static_cast<int64_t>(kLargestUnbounded), last = kLargestUnbounded;
  if (bounds.lower) {
    int64_t whole = signed_integer(*bounds.lower);  // truncated towards zero
    bool has_fraction = !bounds.lower->fraction.empty();
    first = has_fraction ? (bounds.lower->negative ? whole : whole + 1) : whole + (bounds.lower_exclusive ? 1 : 0);
  }
  if (bounds.upper) {
    int64_t whole = signed_integer(*bounds.upper);
    bool has_fraction = !bounds.upper->fraction.empty();
    last = has_fraction ? (bounds.upper->negative ? whole - 1 : whole) : whole - (bounds.upper_exclusive ? 1 : 0);
  }
  return {first, last};
}

std::optional<uint32_t> bounded_integer(GrammarBuilder& g, const NumberBounds& bounds) {
  auto [first, last] = integer_bounds(bounds);
  if (first > last) return std::nullopt;
  NumberRangeBuilder ranges(g);
  std::vector<uint32_t> alternatives;
  if (last >= 0) alternatives.push_back(ranges.integer_range(std::max<int64_t>(first, 0), last));
  if (first < 0) {
    uint64_t smallest = last < 0 ? static_cast<uint64_t>(-last) : 1;
    alternatives.push_back(
        g.sequence({g.literal("-"), ranges.integer_range(smallest, static_cast<uint64_t>(-first))}));
  }
  return g.choice(std::move(alternatives));
}

}  // namespace

std::optional<Decimal> decimal_from_json(const nlohmann::json& number) {
  if (number.is_number_integer()) {
    std::string text = number.dump();
    bool negative = text[0] == '-';
    Decimal value = canonical(negative, negative ? text.substr(1) : text, "");
    if (value.integer.size() > static_cast<size_t>(kMaxIntegerDigits)) return std::nullopt;
    return value;
  }
  if (!number.is_number_float() || !std::isfinite(number.get<double>())) return std::nullopt;
  if (std::fabs(number.get<double>()) >= 1e18) return std::nullopt;
  std::string text = number.dump();  // shortest round trip: "0.1", "-2.5", "1e-07", "1.5e+17"
  bool negative = text[0] == '-';
  if (negative) text.erase(0, 1);
  size_t e = text.find_first_of("eE");
  int exponent = e == std::string::npos ? 0 : std::stoi(text.substr(e + 1));
  std::string mantissa = text.substr(0, e);
  size_t point = mantissa.find('.');
  std::string digits = mantissa;
  int point_at = static_cast<int>(mantissa.size());
  if (point != std::string::npos) {
    digits = mantissa.substr(0, point) + mantissa.substr(point + 1);
    point_at = static_cast<int>(point);
  }
  point_at += exponent;
  if (point_at <= 0) return canonical(negative, "0", std::string(-point_at, '0') + digits);
  if (point_at >= static_cast<int>(digits.size())) {
    return canonical(negative, digits + std::string(point_at - digits.size(), '0'), "");
  }
  return canonical(negative, digits.substr(0, point_at), digits.substr(point_at));
}

std::optional<uint32_t> bounded_number(JsonGrammarBuilder& json, const NumberBounds& bounds, bool integer) {
  GrammarBuilder& g = json.builder();
  if (integer) return bounded_integer(g, bounds);
  NumberRangeBuilder ranges(g);
  std::vector<uint32_t> alternatives;
  const std::optional<Decimal>& lower = bounds.lower;
  const std::optional<Decimal>& upper = bounds.upper;
  if (!upper || !upper->negative) {  // zero and positive numbers
    MagnitudeBound low = lower && !lower->negative ? MagnitudeBound{*lower, bounds.lower_exclusive} : MagnitudeBound{};
    std::optional<MagnitudeBound> high;
    if (upper) high = MagnitudeBound{*upper, bounds.upper_exclusive};
    if (auto part = ranges.magnitude(low, high)) alternatives.push_back(*part);
  }
  if (!lower || lower->negative) {  // negative numbers: "-" and a magnitude above zero
    MagnitudeBound low{Decimal{}, true};
    if (upper && upper->negative) low = MagnitudeBound{Decimal{false, upper->integer, upper->fraction}, bounds.upper_exclusive};
    std::optional<MagnitudeBound> high;
    if (lower) high = MagnitudeBound{Decimal{false, lower->integer, lower->fraction}, bounds.lower_exclusive};
    if (auto part = ranges.magnitude(low, high)) alternatives.push_back(g.sequence({g.literal("-"), *part}));
  }
  if (alternatives.empty()) return std::nullopt;
  return g.choice(std::move(alternatives));
}

}  // namespace strata::grammar
