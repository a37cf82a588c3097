// "host:port" network addresses as operators write them in config and URIs.
//
// Thread safety: pure functions.
#pragma once

#include <string>

#include "common/status.h"

namespace shardcache {

// OK for "host:port" or "[v6]:port" with a port in 1..65535; InvalidArgument quoting the text
// and saying what is wrong otherwise.
Status CheckHostPort(const std::string& address);
// Splits "host:port" / "[v6]:port" into host (without brackets) and port (0 allowed: a listen
// address that takes any free port); InvalidArgument quoting the text otherwise.
Status SplitHostPort(const std::string& address, std::string* host, int* port);

}  // namespace shardcache
