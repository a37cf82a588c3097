// The adapter between libshardcache and GPU staging, used by the Python binding
// (stager_binding.cc): a client Loader becomes the stager's HostBatchSource, a connected Client
// gives the stager its arena. It lives here, on the bindings' side, so that gpu/ knows nothing
// of the client library; templates, so that this header needs neither client.h nor its library
// (any type with Loader's Next()/Batch shape works; tests/gpu/stager_test.cc uses a fake).
//
// Thread safety: the returned source is called by the stager's worker only; see gpu/stager.h.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <thread>
#include <type_traits>
#include <utility>

#include "common/status.h"
#include "gpu/stager.h"

namespace shardcache {

// Adapts a libshardcache Loader (shardcache/client.h) into a HostBatchSource: each Batch
// becomes a HostBatch whose release returns the arena slot (Batch::Release) from the stager's
// release thread; OutOfRange ("end of epoch") ends the epoch. A template so that this header
// needs neither client.h nor its library; any type with Loader's Next()/Batch shape works.
// REQUIRES: loader outlives the epoch being staged.
template <typename LoaderT>
gpu::HostBatchSource SourceFromLoader(LoaderT& loader) {
  return [&loader]() -> Result<std::optional<gpu::HostBatch>> {
    // Slots of staged batches come back from the stager's release thread, which can lag the
    // worker on a loaded machine: wait for them for a while before reporting exhaustion (a
    // trainer that really holds every slot still gets ResourceExhausted).
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    auto next = loader.Next();
    while (!next.ok() && next.status().code() == StatusCode::kResourceExhausted &&
           std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      next = loader.Next();
    }
    if (!next.ok()) {
      if (next.status().code() == StatusCode::kOutOfRange) return std::optional<gpu::HostBatch>();
      return next.status();
    }
    // std::function needs a copyable callable: share the move-only Batch.
    auto batch = std::make_shared<std::decay_t<decltype(*next)>>(std::move(*next));
    gpu::HostBatch hb;
    hb.data = batch->data();
    hb.bytes = batch->payload_bytes();
    hb.records = batch->size();
    hb.record_bytes = batch->record_bytes();
    hb.sample_ids.assign(batch->sample_ids().begin(), batch->sample_ids().end());
    if (hb.record_bytes == 0) {
      uint64_t off = 0;
      for (size_t i = 0; i < batch->size(); ++i) {
        // Samples lie back to back in batch order (client.h).
        hb.sample_offsets.push_back(off);
        hb.sample_lengths.push_back(batch->sample(i).size);
        off += batch->sample(i).size;
      }
    }
    hb.release = [batch] { (void)batch->Release(); };
    return std::optional<gpu::HostBatch>(std::move(hb));
  };
}

// StagerOptions for a connected libshardcache Client: its arena (registered read-only, as the
// client maps it) and slot size. Set depth, conversion, device tier and record_bytes on top.
template <typename ClientT>
gpu::StagerOptions StagerOptionsForClient(const ClientT& client) {
  gpu::StagerOptions o;
  o.arena = const_cast<uint8_t*>(client.arena_data());
  o.arena_bytes = client.arena_bytes();
  o.arena_read_only = true;
  o.max_batch_bytes = client.slot_bytes();
  return o;
}

}  // namespace shardcache
