#include "routing/json_fields.h"

#include <cstdio>

#include "model/json_field.h"
#include "routing/api_error.h"

namespace strata {

std::string quoted(const std::string& param) { return "'" + param + "'"; }

RequestJson parse_request_body(std::string_view body) {
  RequestJson root;
  try {
    root = RequestJson::parse(body);
  } catch (const RequestJson::exception& e) {  // parse_error, and out_of_range for a number beyond a double (1e999)
    std::string what = e.what();  // "[json.exception.parse_error.101] parse error at line 1, column 2: ..."
    size_t start = what.find("] ");
    throw ApiError::invalid_request("", "request body is not valid JSON: " +
                                            (start == std::string::npos ? what : what.substr(start + 2)));
  }
  if (!root.is_object()) throw ApiError::invalid_request("", "request body must be a JSON object");
  return root;
}

const RequestJson* find_field(const RequestJson& object, const char* name) {
  auto it = object.find(name);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

namespace {

// A field read the wrong type (FieldError::wrong_type), answered 400 "invalid type for 'param': expected ..., got ...".
[[noreturn]] void throw_invalid_type(const FieldError& error) {
  throw ApiError::invalid_request(error.field(), "invalid type for " + quoted(error.field()) + ": " + error.problem());
}

// A value read by model/json_field.h, whose wrong type is answered the OpenAI way.
template <class Read>
decltype(auto) answering_wrong_type(Read read) {
  try {
    return read();
  } catch (const FieldError& e) {
    throw_invalid_type(e);
  }
}

}  // namespace

void throw_type(const std::string& param, const char* expected, const RequestJson& value) {
  throw_invalid_type(FieldError::wrong_type(param, expected, value));
}

void throw_required(const std::string& param) { throw ApiError::invalid_request(param, quoted(param) + " is required"); }

double read_number(const RequestJson& value, const std::string& param) {
  return answering_wrong_type([&] { return json_field::read_number(value, param); });
}

int64_t read_integer(const RequestJson& value, const std::string& param) {
  return answering_wrong_type([&] { return json_field::read_integer(value, param); });
}

bool read_bool(const RequestJson& value, const std::string& param) {
  return answering_wrong_type([&] { return json_field::read_bool(value, param); });
}

const std::string& read_string(const RequestJson& value, const std::string& param) {
  return answering_wrong_type([&]() -> const std::string& { return json_field::read_string(value, param); });
}

std::vector<int32_t> read_token_ids(const RequestJson& array, const std::string& param, int vocab_size) {
  if (!array.is_array()) throw_type(param, "an array of token ids", array);
  if (array.empty()) throw ApiError::invalid_request(param, quoted(param) + " must not be empty");
  std::vector<int32_t> ids;
  ids.reserve(array.size());
  for (size_t i = 0; i < array.size(); ++i) {
    const RequestJson& id = array[i];
    if (!id.is_number_integer()) throw_type(param, "token ids (integers)", id);
    const int64_t value = read_integer(id, param);
    if (value < 0 || value >= vocab_size) {
      throw ApiError::invalid_request(param, param + " token id " + id.dump() + " at index " + std::to_string(i) +
                                                 " is outside the vocabulary [0, " + std::to_string(vocab_size) +
                                                 ")");
    }
    ids.push_back(int32_t(value));
  }
  return ids;
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
