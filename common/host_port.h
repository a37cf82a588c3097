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

}  // namespace shardcache
