#include "daemon/cache/cache_options.h"

#include <algorithm>
#include <cstdlib>

#include "common/fs.h"
#include "common/units.h"

namespace shardcache::cache {

Result<EvictionPolicyKind> ParseEvictionPolicy(const std::string& text) {
  if (text == "lru") return EvictionPolicyKind::kLru;
  if (text == "static") return EvictionPolicyKind::kStatic;
  if (text == "clairvoyant") return EvictionPolicyKind::kClairvoyant;
  return InvalidArgument("'" + text + "' is not an eviction policy (lru, static or clairvoyant)");
}

const char* EvictionPolicyName(EvictionPolicyKind kind) {
  switch (kind) {
    case EvictionPolicyKind::kLru: return "lru";
    case EvictionPolicyKind::kStatic: return "static";
    case EvictionPolicyKind::kClairvoyant: return "clairvoyant";
  }
  return "?";
}

uint64_t CacheOptions::EffectiveIndexReserve() const {
  if (index_reserve_bytes != 0) return index_reserve_bytes;
  return (8ull << 20) + size_bytes / 512;
}

Status CacheOptions::Validate() const {
  if (size_bytes > 0 && dir.empty()) return InvalidArgument("cache.dir is required when cache.size > 0");
  if (segment_bytes == 0 || segment_bytes % kDirectIoAlign != 0) {
    return InvalidArgument("cache segment_bytes " + std::to_string(segment_bytes) +
                           " is not a positive multiple of 4096");
  }
  if (segment_bytes > (1ull << 40)) return InvalidArgument("cache segment_bytes above 1 TiB");
  if (!(min_free.fraction >= 0 && min_free.fraction < 1)) {
    return InvalidArgument("cache.min_free fraction " + std::to_string(min_free.fraction) +
                           " is outside [0, 1)");
  }
  if (size_bytes > 0 && size_bytes < EffectiveIndexReserve() + segment_bytes) {
    return InvalidArgument("cache.size " + FormatBytes(size_bytes) +
                           " is smaller than one segment (" + FormatBytes(segment_bytes) +
                           ") plus the index reserve (" + FormatBytes(EffectiveIndexReserve()) + ")");
  }
  if (max_fetch_run_chunks == 0) return InvalidArgument("cache max_fetch_run_chunks must be > 0");
  if (commit_bytes == 0) return InvalidArgument("cache commit_bytes must be > 0");
  if (writer_idle_tick_ms == 0 || disk_probe_interval_ms == 0) {
    return InvalidArgument("cache writer_idle_tick_ms and disk_probe_interval_ms must be > 0");
  }
  return Status::Ok();
}

uint64_t MinFree::BytesFor(uint64_t fs_bytes) const {
  return std::max<uint64_t>(static_cast<uint64_t>(fraction * static_cast<double>(fs_bytes)), bytes);
}

Result<MinFree> ParseMinFree(const std::string& text) {
  if (!text.empty() && text.back() == '%') {
    const std::string num = text.substr(0, text.size() - 1);
    char* end = nullptr;
    const double pct = std::strtod(num.c_str(), &end);
    if (num.empty() || end != num.c_str() + num.size() || !(pct >= 0 && pct < 100)) {
      return InvalidArgument("'" + text + "' is not a percentage in [0%, 100%)");
    }
    return MinFree{pct / 100.0, 0};
  }
  SC_ASSIGN_OR_RETURN(uint64_t bytes, ParseBytes(text));
  return MinFree{0, bytes};
}

}  // namespace shardcache::cache
