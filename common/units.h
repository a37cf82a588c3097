// Parsing and printing of byte sizes and rates as operators write them in config files and
// on command lines: "800GiB", "4MiB", "1.5GB", "512k", plain bytes "4096".
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace shardcache {

// Binary suffixes (KiB, MiB, GiB, TiB, and K/M/G/T/k/m/g/t as shorthand for them) multiply by
// 1024^n; decimal suffixes (KB, MB, GB, TB) by 1000^n; "B" or none is bytes. Fractions are
// allowed with a suffix ("1.5GiB"). Returns InvalidArgument naming the text on anything else,
// negative numbers, or overflow.
Result<uint64_t> ParseBytes(const std::string& text);

// "1.50 GiB", "512 KiB", "17 B".
std::string FormatBytes(uint64_t bytes);

// Network rate, e.g. "1000Mbit", "1Gbit", "125MB/s", or plain bytes per second.
// Returns bytes per second.
Result<uint64_t> ParseRate(const std::string& text);

}  // namespace shardcache
