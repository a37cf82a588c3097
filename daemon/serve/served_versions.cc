#include "daemon/serve/served_versions.h"

#include <algorithm>

namespace shardcache::serve {

void ServedVersions::Remember(const DatasetPtr& dataset) {
  MutexLock lock(&mu_);
  auto& versions = by_name_[dataset->name];
  auto same = std::find_if(versions.begin(), versions.end(),
                           [&](const DatasetPtr& d) { return d->version == dataset->version; });
  if (same != versions.end()) versions.erase(same);
  versions.push_front(dataset);
  if (versions.size() > kVersionsPerName) versions.pop_back();
}

DatasetPtr ServedVersions::Find(const std::string& name, const std::string& version) const {
  MutexLock lock(&mu_);
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return nullptr;
  for (const DatasetPtr& d : it->second) {
    if (d->version == version) return d;
  }
  return nullptr;
}

}  // namespace shardcache::serve
