#pragma once
// Reading one field of a request body with the error OpenAI clients expect: 400 invalid_request_error whose
// message and `param` name the field ("messages[2].content", "response_format.json_schema.name"). The readers are
// model/json_field.h's; here their FieldError becomes that 400.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace strata {

using RequestJson = nlohmann::ordered_json;

std::string quoted(const std::string& param);  // 'param'

// A request body: a JSON object, or 400 saying why it is not.
RequestJson parse_request_body(std::string_view body);

// The field's value, or nullptr when it is absent or null (OpenAI clients send null for "not set").
const RequestJson* find_field(const RequestJson& object, const char* name);

[[noreturn]] void throw_type(const std::string& param, const char* expected, const RequestJson& value);
[[noreturn]] void throw_required(const std::string& param);

double read_number(const RequestJson& value, const std::string& param);
// Integers beyond int64 (only positive ones parse as unsigned) saturate, so that range checks reject them.
int64_t read_integer(const RequestJson& value, const std::string& param);
bool read_bool(const RequestJson& value, const std::string& param);
const std::string& read_string(const RequestJson& value, const std::string& param);

// A non-empty array of token ids, each in [0, vocab_size); the error names param and the index.
std::vector<int32_t> read_token_ids(const RequestJson& array, const std::string& param, int vocab_size);

// value in [low, high], or (low, high] when low_open; `given` is quoted in the error.
void check_range(double value, double low, double high, bool low_open, const std::string& param,
                 const RequestJson& given);
void check_integer_range(int64_t value, int64_t low, int64_t high, const std::string& param, const RequestJson& given);

}  // namespace strata
