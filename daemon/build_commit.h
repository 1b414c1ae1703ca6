#pragma once
// The commit this binary was built from, so that a result file, /metrics and `strata --version` say which code
// produced them: the short hash, with "-dirty" where tracked files differed from it, or "unknown" outside a git
// checkout. Written at every build by daemon/build_commit.cmake.
namespace strata {

const char* build_commit();

}  // namespace strata
