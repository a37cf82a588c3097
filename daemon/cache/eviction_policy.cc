#include "daemon/cache/eviction_policy.h"

#include "daemon/cache/clairvoyant_policy.h"
#include "daemon/cache/lru_policy.h"
#include "daemon/cache/static_policy.h"

namespace shardcache::cache {

std::unique_ptr<EvictionPolicy> MakeEvictionPolicy(EvictionPolicyKind kind, const AccessPlan* plan) {
  switch (kind) {
    case EvictionPolicyKind::kStatic: return std::make_unique<StaticPolicy>();
    case EvictionPolicyKind::kClairvoyant:
      if (plan != nullptr) return std::make_unique<ClairvoyantPolicy>(*plan);
      return std::make_unique<LruPolicy>();
    case EvictionPolicyKind::kLru: break;
  }
  return std::make_unique<LruPolicy>();
}

}  // namespace shardcache::cache
