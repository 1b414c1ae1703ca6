#include "router/replica_endpoint.h"

#include <stdexcept>

namespace strata {

ReplicaEndpoint parse_replica_url(const std::string& url) {
  const std::string scheme = "http://";
  auto fail = [&](const std::string& why) {
    return std::invalid_argument("replica '" + url + "': " + why + " (expected http://host:port)");
  };
  if (url.rfind(scheme, 0) != 0) throw fail("not an http:// URL");
  std::string rest = url.substr(scheme.size());
  if (!rest.empty() && rest.back() == '/') rest.pop_back();
  if (rest.find('/') != std::string::npos) throw fail("a replica is named by host and port, without a path");
  ReplicaEndpoint endpoint;
  endpoint.url = scheme + rest;
  const size_t colon = rest.rfind(':');
  const bool bracketed_v6 = !rest.empty() && rest.front() == '[';
  const bool has_port = colon != std::string::npos && (!bracketed_v6 || rest.find(']') < colon);
  endpoint.host = has_port ? rest.substr(0, colon) : rest;
  if (bracketed_v6) endpoint.host = endpoint.host.substr(1, endpoint.host.find(']') - 1);
  if (endpoint.host.empty()) throw fail("no host");
  if (has_port) {
    const std::string port = rest.substr(colon + 1);
    if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
        std::stoi(port) < 1 || std::stoi(port) > 65535) {
      throw fail("port '" + port + "' is not a number in [1, 65535]");
    }
    endpoint.port = uint16_t(std::stoi(port));
  }
  return endpoint;
}

}  // namespace strata
