#include "common/host_port.h"

#include <algorithm>
#include <cctype>
#include <stdexcept>

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

Status SplitHostPort(const std::string& address, std::string* host, int* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) return InvalidArgument("'" + address + "' is not host:port");
  std::string h = address.substr(0, colon);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  try {
    size_t used = 0;
    *port = std::stoi(address.substr(colon + 1), &used);
    if (used != address.size() - colon - 1 || *port < 0 || *port > 65535) throw std::out_of_range("port");
  } catch (const std::exception&) {
    return InvalidArgument("'" + address + "' has no valid port");
  }
  *host = h;
  return Status::Ok();
}

}  // namespace shardcache
