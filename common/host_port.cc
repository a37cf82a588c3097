#include "common/host_port.h"

#include <algorithm>
#include <cctype>

namespace shardcache {

Status CheckHostPort(const std::string& s) {
  const std::string quoted = "'" + s + "'";
  const size_t colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return InvalidArgument(quoted + " is not host:port (e.g. 0.0.0.0:7443, [::1]:7443)");
  }
  const std::string host = s.substr(0, colon), port = s.substr(colon + 1);
  if (host.find(':') != std::string::npos && !(host.front() == '[' && host.back() == ']')) {
    return InvalidArgument(quoted + ": write IPv6 addresses in brackets, e.g. [::1]:7443");
  }
  const bool digits = !port.empty() && port.size() <= 5 &&
                      std::all_of(port.begin(), port.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
  if (!digits || std::stoi(port) < 1 || std::stoi(port) > 65535) {
    return InvalidArgument(quoted + " has no valid port (1-65535)");
  }
  return Status::Ok();
}

}  // namespace shardcache
