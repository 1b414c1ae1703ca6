#include "routing/tool_call_output.h"

#include <algorithm>
#include <cstdio>
#include <random>

namespace strata {
namespace {

std::string_view trim_left(std::string_view text) {
  const size_t start = text.find_first_not_of(" \t\r\n");
  return start == std::string_view::npos ? std::string_view() : text.substr(start);
}

std::string call_id() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  char hex[25];
  std::snprintf(hex, sizeof hex, "%016llx%08llx", static_cast<unsigned long long>(rng()),
                static_cast<unsigned long long>(rng() & 0xffffffffull));
  return "call_" + std::string(hex);
}

}  // namespace

ToolCallReader::ToolCallReader(const ChatTemplate& chat_template, std::vector<std::string> tool_names)
    : chat_template_(&chat_template),
      prefix_(chat_template.tool_call_syntax().prefix),
      tool_names_(std::move(tool_names)) {
  if (prefix_.empty()) prefix_ = "{";
}

std::optional<std::vector<ParsedToolCall>> ToolCallReader::read(std::string_view text) const {
  std::optional<std::vector<ParsedToolCall>> calls = chat_template_->parse_tool_calls(text);
  if (!calls) return std::nullopt;
  for (const ParsedToolCall& call : *calls) {
    if (std::find(tool_names_.begin(), tool_names_.end(), call.name) == tool_names_.end()) return std::nullopt;
  }
  return calls;
}

bool ToolCallReader::may_become_call(std::string_view text) const {
  const std::string_view start = trim_left(text);
  return start.size() <= prefix_.size() ? std::string_view(prefix_).starts_with(start) : start.starts_with(prefix_);
}

nlohmann::ordered_json tool_calls_json(const std::vector<ParsedToolCall>& calls, bool with_index) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    nlohmann::ordered_json call;
    if (with_index) call["index"] = i;
    call["id"] = call_id();
    call["type"] = "function";
    call["function"] = {{"name", calls[i].name}, {"arguments", calls[i].arguments}};
    out.push_back(std::move(call));
  }
  return out;
}

}  // namespace strata
