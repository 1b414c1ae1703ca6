#pragma once
// Which top-level fields of a request body Strata answers, per dialect, so that none is silently ignored: a field
// of the OpenAI API that Strata does not implement gets 400 naming it (unless its value asks for nothing: null, or
// the API's default, such as response_format {"type": "text"}); a field unknown to the OpenAI API gets 400 too, as
// OpenAI answers, unless the operator set server.ignore_unknown_fields. README, "The API", lists the same fields.
#include <nlohmann/json.hpp>

#include "routing/openai_protocol.h"

namespace strata {

// Throws ApiError (400, param = the field) for the first field of `body` (an object) that is not answered.
void check_request_fields(const nlohmann::ordered_json& body, ApiDialect dialect, bool ignore_unknown_fields);

}  // namespace strata
