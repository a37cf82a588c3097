#include "common/units.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>

namespace shardcache {
namespace {

std::string Trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

// Splits "12.5GiB" into number 12.5 and suffix "GiB".
bool SplitNumber(const std::string& t, double* number, std::string* suffix, bool* fractional) {
  size_t i = 0;
  bool digits = false;
  *fractional = false;
  while (i < t.size() && (std::isdigit(static_cast<unsigned char>(t[i])) || t[i] == '.')) {
    if (t[i] == '.') *fractional = true; else digits = true;
    ++i;
  }
  if (!digits) return false;
  try {
    size_t used = 0;
    *number = std::stod(t.substr(0, i), &used);
    if (used != i) return false;
  } catch (...) {
    return false;
  }
  *suffix = Trim(t.substr(i));
  return true;
}

}  // namespace

Result<uint64_t> ParseBytes(const std::string& text) {
  const std::string t = Trim(text);
  double number = 0;
  std::string suffix;
  bool fractional = false;
  if (t.empty() || !SplitNumber(t, &number, &suffix, &fractional)) {
    return InvalidArgument("'" + text + "' is not a size (examples: 4096, 4MiB, 800GiB, 1.5TB)");
  }
  double mult = 0;
  if (suffix.empty() || suffix == "B") mult = 1;
  else if (suffix == "KiB" || suffix == "K" || suffix == "k") mult = 1024.0;
  else if (suffix == "MiB" || suffix == "M" || suffix == "m") mult = 1024.0 * 1024;
  else if (suffix == "GiB" || suffix == "G" || suffix == "g") mult = 1024.0 * 1024 * 1024;
  else if (suffix == "TiB" || suffix == "T" || suffix == "t") mult = 1024.0 * 1024 * 1024 * 1024;
  else if (suffix == "KB" || suffix == "kB") mult = 1e3;
  else if (suffix == "MB") mult = 1e6;
  else if (suffix == "GB") mult = 1e9;
  else if (suffix == "TB") mult = 1e12;
  else return InvalidArgument("'" + text + "' has an unknown size unit '" + suffix + "' (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)");
  if (fractional && suffix.empty()) {
    return InvalidArgument("'" + text + "' is a fractional number of bytes");
  }
  const double bytes = number * mult;
  if (!(bytes < 18446744073709551615.0)) return InvalidArgument("'" + text + "' is too large");
  return static_cast<uint64_t>(std::llround(bytes));
}

std::string FormatBytes(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 5) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  if (u == 0) std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  else std::snprintf(buf, sizeof buf, "%.2f %s", v, kUnits[u]);
  return buf;
}

Result<uint64_t> ParseRate(const std::string& text) {
  const std::string t = Trim(text);
  double number = 0;
  std::string suffix;
  bool fractional = false;
  if (t.empty() || !SplitNumber(t, &number, &suffix, &fractional)) {
    return InvalidArgument("'" + text + "' is not a rate (examples: 0, 1000Mbit, 10Gbit, 125MB/s)");
  }
  double bytes_per_s = 0;
  if (suffix.empty() || suffix == "B/s") bytes_per_s = number;
  else if (suffix == "Kbit" || suffix == "kbit") bytes_per_s = number * 1e3 / 8;
  else if (suffix == "Mbit") bytes_per_s = number * 1e6 / 8;
  else if (suffix == "Gbit") bytes_per_s = number * 1e9 / 8;
  else if (suffix.size() > 2 && suffix.substr(suffix.size() - 2) == "/s") {
    auto b = ParseBytes(t.substr(0, t.size() - 2));
    if (!b.ok()) return b.status();
    return *b;
  } else {
    return InvalidArgument("'" + text + "' has an unknown rate unit '" + suffix + "' (use Mbit, Gbit, MB/s, MiB/s or bytes per second)");
  }
  return static_cast<uint64_t>(std::llround(bytes_per_s));
}

}  // namespace shardcache
