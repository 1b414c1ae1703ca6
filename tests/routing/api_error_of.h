#pragma once
// The ApiError a call throws, for the routing tests that check a request's 4xx; fails the test when it throws none.
#include <gtest/gtest.h>

#include "routing/api_error.h"

namespace strata::test {

template <typename F>
ApiError error_of(F&& call) {
  try {
    call();
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "no ApiError thrown";
  return ApiError(0, "", "");
}

}  // namespace strata::test
