// PeerGroupSource: an upstream *set* — several shardcached daemons that share fetching a
// dataset over the long link, so each chunk crosses it once per group, not once per node.
//
// Ownership: each chunk has an owner among the members by rendezvous (highest-random-weight)
// hashing: score(member, chunk) = xxh3-64 of the chunk key's fingerprint seeded with the
// member's address hash; the member with the highest score owns it, the next is the runner-up,
// and so on. Adding or removing a member moves only that member's share.
//
// Reads (ReadChunks, ReadPieces; consecutive chunks with one owner go as one call):
//   * a chunk another member owns is read from that member's Origin service (a GrpcSource
//     whose requests say from_peer, so the member never forwards them again);
//   * a chunk this daemon owns (self is a member), or one no member can serve, goes to this
//     daemon's own upstream — the origin, or the city tier;
//   * a read that itself came from a member (ReadOptions::via_peers false) goes to the own
//     upstream directly: no request loops.
//   A member whose read fails (unreachable for peers.timeout, reset past its retries, or bad
//   data) is set aside: its chunks go to the next member in hash order, the read resumes at
//   the first chunk not delivered. It is used again once its connection's probe hears from it
//   (at most a second later than it answers), so a restarted member rejoins by itself.
//   Two members that disagree about the membership for a moment may each wait on the other
//   for a chunk; peers.timeout ends that wait and the chunk comes from the own upstream.
//
// Manifests, sample indexes and listings come from the own upstream.
//
// Membership: the static list and DNS name of peer_members.h, re-resolved every
// peers.refresh by a thread of this source; connections of members that stay are kept.
//
// Visible: per member, chunks and bytes it delivered, failed reads, whether it is used now and
// its share of the hash space (shardcache_peer_*{member="host:port"}; Members() for /status);
// the own upstream counts as the member marked self (or "upstream" when self is no member).
//
// Thread safety: all methods are safe from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/metrics.h"
#include "common/mutex.h"
#include "common/stats.h"
#include "daemon/source/chunk_source.h"
#include "daemon/upstream/grpc_source.h"
#include "daemon/upstream/peer_members.h"

namespace shardcache::upstream {

inline constexpr std::chrono::milliseconds kDefaultPeerRefresh{10000};  // peers.refresh
inline constexpr std::chrono::milliseconds kDefaultPeerTimeout{5000};   // peers.timeout

struct PeerGroupOptions {
  PeerMembersOptions members;
  std::chrono::milliseconds refresh = kDefaultPeerRefresh;
  // A member that does not answer for this long fails the read (which then goes on elsewhere).
  std::chrono::milliseconds timeout = kDefaultPeerTimeout;
  // Connections to members: TLS, token, pool sizes (target, from_peer, report_metrics and the
  // outage bound are set per member).
  GrpcSourceOptions connection;
};

// One member as /status shows it.
struct PeerMemberStats {
  std::string address;
  bool self = false;
  bool usable = false;   // not set aside after a failure
  double share = 0;      // of the hash space, among usable members
  uint64_t chunks = 0;   // delivered by it
  uint64_t bytes = 0;
  uint64_t errors = 0;   // reads that failed over to another member
};

class PeerGroupSource final : public ChunkSource, public stats::Source {
 public:
  // Resolves the members (a DNS name that does not resolve yet is a warning: the group starts
  // with the static list and keeps resolving) and starts the refresh thread when there is a
  // DNS name.
  static Result<std::unique_ptr<PeerGroupSource>> Create(PeerGroupOptions options,
                                                         std::unique_ptr<ChunkSource> upstream);
  ~PeerGroupSource() override;

  Result<std::vector<v1::DatasetSummary>> ListDatasets() override { return upstream_->ListDatasets(); }
  Result<DatasetPtr> OpenDataset(const std::string& name) override { return upstream_->OpenDataset(name); }
  Result<std::string> GetSampleIndex(const DatasetPtr& dataset, uint32_t shard) override {
    return upstream_->GetSampleIndex(dataset, shard);
  }
  Status ReadChunks(const DatasetPtr& dataset, uint32_t shard, uint64_t first, uint64_t count,
                    const ReadOptions& options, const ChunkSink& sink) override;
  Status ReadPieces(const DatasetPtr& dataset, uint32_t shard, std::span<const ChunkPiece> pieces,
                    const ReadOptions& options) override;
  bool FetchesBlockRanges() override { return upstream_->FetchesBlockRanges(); }
  bool BatchesBlockRanges() override { return upstream_->BatchesBlockRanges(); }
  void Expedite(const ChunkKey& key) override { upstream_->Expedite(key); }
  void Shutdown() override;

  // Replaces the membership (the refresh thread calls it; tests too).
  void SetMembers(const std::vector<Member>& members);
  std::vector<PeerMemberStats> Members() const;
  void VisitStats(const stats::Visitor& visit) const override;
  ChunkSource& upstream() { return *upstream_; }

 private:
  struct Peer;
  using PeerList = std::vector<std::shared_ptr<Peer>>;
  using Clock = std::chrono::steady_clock;

  PeerGroupSource(PeerGroupOptions options, std::unique_ptr<ChunkSource> upstream);
  std::shared_ptr<const PeerList> Snapshot() const;
  // The member that serves `key` now: the highest-scoring usable one; the own upstream's entry
  // when that is self or no member is usable.
  Peer* OwnerOf(const PeerList& peers, const ChunkKey& key) const;
  ChunkSource& SourceOf(Peer& p);
  // Counts a failed read of `p` and sets it aside until its connection answers again.
  void SetAside(Peer& p, const Status& why);
  void RefreshLoop();

  const PeerGroupOptions options_;
  const std::unique_ptr<ChunkSource> upstream_;
  std::shared_ptr<Peer> upstream_peer_;  // the own upstream when self is not a member

  mutable Mutex mu_;
  CondVar cv_;
  std::shared_ptr<const PeerList> peers_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  std::thread refresher_;
  metrics::SourceHandle stats_source_;  // last
};

}  // namespace shardcache::upstream
