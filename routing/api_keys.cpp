#include "routing/api_keys.h"

#include <algorithm>

#include <boost/asio/ip/address.hpp>

namespace strata {
namespace {

std::string_view trim(std::string_view text) {
  const size_t begin = text.find_first_not_of(" \t\r\n");
  if (begin == std::string_view::npos) return {};
  const size_t end = text.find_last_not_of(" \t\r\n");
  return text.substr(begin, end - begin + 1);
}

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return (x | 0x20) == (y | 0x20);  // ASCII letters only, which is all a scheme name holds
         });
}

// 0 when equal, non-zero otherwise, after reading max(|a|, |b|) bytes of both whatever they hold.
unsigned difference(std::string_view a, std::string_view b) {
  unsigned diff = unsigned(a.size() != b.size());
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= unsigned(x ^ y);
  }
  return diff;
}

}  // namespace

ApiKeys::ApiKeys(std::vector<std::string> keys) : keys_(std::move(keys)) {}

bool ApiKeys::accepts(std::string_view authorization) const {
  authorization = trim(authorization);
  const size_t space = authorization.find(' ');
  if (space == std::string_view::npos || !iequals(authorization.substr(0, space), "bearer")) return false;
  const std::string_view presented = trim(authorization.substr(space + 1));
  if (presented.empty()) return false;
  // Every key is compared in full, without stopping at the one that matches.
  unsigned matched = 0;
  for (const std::string& key : keys_) matched |= unsigned(difference(presented, key) == 0);
  return matched != 0;
}

std::vector<std::string> parse_api_key_lines(std::string_view text) {
  std::vector<std::string> keys;
  while (!text.empty()) {
    const size_t newline = std::min(text.find('\n'), text.size());
    const std::string_view line = trim(text.substr(0, newline));
    if (!line.empty() && line.front() != '#') keys.emplace_back(line);
    text.remove_prefix(std::min(newline + 1, text.size()));
  }
  return keys;
}

std::string api_key_problem(std::string_view key) {
  if (key.empty()) return "an API key is empty";
  for (char c : key) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte <= 0x20 || byte == 0x7f) return "an API key holds whitespace or a control character";
  }
  return "";
}

bool is_loopback_host(const std::string& host) {
  if (host == "localhost") return true;
  boost::system::error_code ec;
  const boost::asio::ip::address address = boost::asio::ip::make_address(host, ec);
  return !ec && address.is_loopback();
}

}  // namespace strata
