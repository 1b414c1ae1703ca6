#include "model/json_field.h"

#include <utility>

namespace strata {

FieldError::FieldError(std::string field, std::string problem)
    : std::invalid_argument(field + ": " + problem), field_(std::move(field)), problem_(std::move(problem)) {}

void throw_field(std::string field, std::string problem) { throw FieldError(std::move(field), std::move(problem)); }

}  // namespace strata
