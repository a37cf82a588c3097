// ServedVersions: the dataset versions an Origin service handed to its downstreams, so that a
// request naming a version that is no longer the current one — the dataset was re-indexed at
// the origin after the downstream opened it — is still answered. A node's loaders keep reading
// the version they started with (its shard files are unchanged when only the chunk size or the
// name changed; anything else fails verification, never serves wrong bytes), while datasets
// opened afterwards get the new one.
//
// Kept: the kVersionsPerName most recently handed out versions of each name (the current one
// and those it replaced). A manifest holds 16 bytes per chunk (40 MiB for a 10 TiB dataset in
// 4 MiB chunks), so this bounds the memory to a few manifests per dataset; a request naming an
// older version gets FailedPrecondition, as it would after a restart.
//
// Thread safety: safe for concurrent use.
#pragma once

#include <cstddef>
#include <deque>
#include <map>
#include <string>

#include "common/mutex.h"
#include "daemon/source/chunk_source.h"

namespace shardcache::serve {

class ServedVersions {
 public:
  static constexpr size_t kVersionsPerName = 3;

  // Remembers `dataset` as the most recently handed out version of its name.
  void Remember(const DatasetPtr& dataset);
  // The remembered dataset `name` at `version`; nullptr when it is not remembered.
  DatasetPtr Find(const std::string& name, const std::string& version) const;

 private:
  mutable Mutex mu_;
  std::map<std::string, std::deque<DatasetPtr>> by_name_ GUARDED_BY(mu_);  // newest first
};

}  // namespace shardcache::serve
