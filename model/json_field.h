#pragma once
// Reading the fields of JSON a client sent (a request body, the `tools` it offers, a conversation's messages), in
// one form whichever folder reads it: a field that is not what it must be is a FieldError that names it as the
// client wrote it ("messages[2].content", "tools[1].function.name"). routing/ answers one with a 400 whose `param`
// is field().
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>

namespace strata {

class FieldError : public std::invalid_argument {
 public:
  FieldError(std::string field, std::string problem);  // what(): "<field>: <problem>"

  // A value of the wrong JSON type: "expected <expected>, got <its type>" ("expected a string, got number").
  template <class Json>
  static FieldError wrong_type(std::string field, const char* expected, const Json& value) {
    return FieldError(std::move(field), std::string("expected ") + expected + ", got " + value.type_name());
  }

  const std::string& field() const { return field_; }
  const std::string& problem() const { return problem_; }

 private:
  std::string field_;
  std::string problem_;
};

[[noreturn]] void throw_field(std::string field, std::string problem);

// The value as the type the field must have, or FieldError::wrong_type. Json: nlohmann::json or ordered_json.
namespace json_field {

template <class Json>
const std::string& read_string(const Json& value, const std::string& field) {
  if (!value.is_string()) throw FieldError::wrong_type(field, "a string", value);
  return value.template get_ref<const std::string&>();
}

template <class Json>
bool read_bool(const Json& value, const std::string& field) {
  if (!value.is_boolean()) throw FieldError::wrong_type(field, "a boolean", value);
  return value.template get<bool>();
}

template <class Json>
double read_number(const Json& value, const std::string& field) {
  if (!value.is_number()) throw FieldError::wrong_type(field, "a number", value);
  return value.template get<double>();
}

// Integers beyond int64 (only positive ones parse as unsigned) saturate, so that range checks reject them.
template <class Json>
int64_t read_integer(const Json& value, const std::string& field) {
  if (!value.is_number_integer()) throw FieldError::wrong_type(field, "an integer", value);
  if (value.is_number_unsigned() && value.template get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max())) {
    return std::numeric_limits<int64_t>::max();
  }
  return value.template get<int64_t>();
}

}  // namespace json_field
}  // namespace strata
