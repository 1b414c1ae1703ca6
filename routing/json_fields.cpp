#include "routing/json_fields.h"

#include <cstdio>
#include <limits>

#include "routing/api_error.h"

namespace strata {

std::string quoted(const std::string& param) { return "'" + param + "'"; }

const RequestJson* find_field(const RequestJson& object, const char* name) {
  auto it = object.find(name);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

void throw_type(const std::string& param, const char* expected, const RequestJson& value) {
  throw ApiError::invalid_request(
      param, "invalid type for " + quoted(param) + ": expected " + expected + ", got " + value.type_name());
}

void throw_required(const std::string& param) { throw ApiError::invalid_request(param, quoted(param) + " is required"); }

double read_number(const RequestJson& value, const std::string& param) {
  if (!value.is_number()) throw_type(param, "a number", value);
  return value.get<double>();
}

int64_t read_integer(const RequestJson& value, const std::string& param) {
  if (!value.is_number_integer()) throw_type(param, "an integer", value);
  if (value.is_number_unsigned() && value.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max())) {
    return std::numeric_limits<int64_t>::max();
  }
  return value.get<int64_t>();
}

bool read_bool(const RequestJson& value, const std::string& param) {
  if (!value.is_boolean()) throw_type(param, "a boolean", value);
  return value.get<bool>();
}

const std::string& read_string(const RequestJson& value, const std::string& param) {
  if (!value.is_string()) throw_type(param, "a string", value);
  return value.get_ref<const std::string&>();
}

void check_range(double value, double low, double high, bool low_open, const std::string& param,
                 const RequestJson& given) {
  bool ok = (low_open ? value > low : value >= low) && value <= high;
  if (!ok) {
    char interval[64];
    std::snprintf(interval, sizeof interval, "%c%g, %g]", low_open ? '(' : '[', low, high);
    throw ApiError::invalid_request(param, quoted(param) + " must be in " + interval + ", got " + given.dump());
  }
}

void check_integer_range(int64_t value, int64_t low, int64_t high, const std::string& param, const RequestJson& given) {
  if (value < low || value > high) {
    throw ApiError::invalid_request(param, quoted(param) + " must be in [" + std::to_string(low) + ", " +
                                               std::to_string(high) + "], got " + given.dump());
  }
}

}  // namespace strata
