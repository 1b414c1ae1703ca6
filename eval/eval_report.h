#pragma once
// The JSON results of `strata eval`: the machine, the command, the settings, and one entry per case with its raw
// scores, so that tools/eval_report.py can make the tables and plots and anyone can recompute them.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "eval/eval_suite.h"

namespace strata {

nlohmann::ordered_json settings_json(const EvalSettings& settings);
nlohmann::ordered_json case_json(const EvalCaseResult& result);

}  // namespace strata
