#include "daemon/upstream/peer_group.h"

#include <algorithm>
#include <map>
#include <set>

#include <spdlog/spdlog.h>
#include <xxhash.h>

#include "common/log.h"
#include "common/thread_name.h"

namespace shardcache::upstream {
namespace {

using stats::Family;
constexpr Family kPeerChunks{"shardcache_peer_chunks_total", "Chunks a peer group member delivered to this node"};
constexpr Family kPeerBytes{"shardcache_peer_bytes_total", "Chunk bytes a peer group member delivered to this node"};
constexpr Family kPeerErrors{"shardcache_peer_errors_total",
                             "Reads of a peer group member that failed and went on to the next member"};
constexpr Family kPeerUsable{"shardcache_peer_usable", "1 while a peer group member is used, 0 while set aside"};
constexpr Family kPeerShare{"shardcache_peer_share", "Share of the chunks a peer group member owns now"};
constexpr Family kPeerSelf{"shardcache_peer_self",
                           "1 for the member that is this node (its chunks cross its own upstream link)"};

// A read that failed for the caller's own reasons, not the member's.
bool CallerEnded(const Status& s, const ReadOptions& options) {
  return s.code() == StatusCode::kCancelled || s.code() == StatusCode::kInvalidArgument ||
         std::chrono::steady_clock::now() >= options.deadline;
}

}  // namespace

struct PeerGroupSource::Peer {
  std::string address;
  bool self = false;
  uint64_t seed = 0;                    // xxh3-64 of the address: the rendezvous seed
  std::unique_ptr<GrpcSource> source;   // null: the own upstream
  std::atomic<bool> set_aside{false};
  std::atomic<int64_t> aside_until_ns{0};
  std::atomic<uint64_t> chunks{0}, bytes{0}, errors{0};
  stats::Labels labels;

  bool Usable(Clock::time_point now) {
    if (!set_aside.load(std::memory_order_acquire)) return true;
    if (now.time_since_epoch().count() < aside_until_ns.load(std::memory_order_relaxed)) return false;
    if (source == nullptr || !source->health().up) return false;
    set_aside.store(false, std::memory_order_release);
    spdlog::info("peer group: member {} answers again; its chunks are read from it", address);
    return true;
  }
};

PeerGroupSource::PeerGroupSource(PeerGroupOptions options, std::unique_ptr<ChunkSource> upstream)
    : options_(std::move(options)), upstream_(std::move(upstream)) {
  upstream_peer_ = std::make_shared<Peer>();
  upstream_peer_->address = "upstream";
  upstream_peer_->self = true;
  upstream_peer_->labels = {{"member", "upstream"}};
  peers_ = std::make_shared<const PeerList>();
}

Result<std::unique_ptr<PeerGroupSource>> PeerGroupSource::Create(PeerGroupOptions options,
                                                                 std::unique_ptr<ChunkSource> upstream) {
  std::unique_ptr<PeerGroupSource> g(new PeerGroupSource(std::move(options), std::move(upstream)));
  auto members = ResolveMembers(g->options_.members);
  if (!members.ok()) {
    if (g->options_.members.dns.empty()) return members.status();
    spdlog::warn("peer group: {}; starting with the static members, resolving again every {} ms",
                 members.status().ToString(), g->options_.refresh.count());
    PeerMembersOptions fixed = g->options_.members;
    fixed.dns.clear();
    members = ResolveMembers(fixed);
    SC_RETURN_IF_ERROR(members.status());
  }
  g->SetMembers(*members);
  if (!g->options_.members.dns.empty())
    g->refresher_ = std::thread([p = g.get()] {
      NameThisThread("sc-peer-dns");
      p->RefreshLoop();
    });
  g->stats_source_ = metrics::Registry::Global().AddSource(g.get());
  return g;
}

PeerGroupSource::~PeerGroupSource() {
  stats_source_.Reset();
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.NotifyAll();
  if (refresher_.joinable()) refresher_.join();
}

void PeerGroupSource::Shutdown() {
  upstream_->Shutdown();
  for (const auto& p : *Snapshot()) {
    if (p->source) p->source->Shutdown();
  }
}

std::shared_ptr<const PeerGroupSource::PeerList> PeerGroupSource::Snapshot() const {
  MutexLock lock(&mu_);
  return peers_;
}

ChunkSource& PeerGroupSource::SourceOf(Peer& p) { return p.source ? *p.source : *upstream_; }

void PeerGroupSource::SetMembers(const std::vector<Member>& members) {
  const auto old = Snapshot();
  std::map<std::string, std::shared_ptr<Peer>> kept;
  for (const auto& p : *old) kept[p->address] = p;
  auto next = std::make_shared<PeerList>();
  std::vector<std::string> added;
  for (const Member& m : members) {
    auto it = kept.find(m.address);
    if (it != kept.end() && it->second->self == m.self) {
      next->push_back(it->second);
      kept.erase(it);
      continue;
    }
    auto p = std::make_shared<Peer>();
    p->address = m.address;
    p->self = m.self;
    p->seed = XXH3_64bits(m.address.data(), m.address.size());
    p->labels = {{"member", m.address}};
    if (!m.self) {
      GrpcSourceOptions o = options_.connection;
      o.target = m.address;
      o.from_peer = true;
      o.report_metrics = false;
      o.outage_timeout = options_.timeout;
      auto source = GrpcSource::Create(std::move(o));
      if (!source.ok()) {
        spdlog::error("peer group: member {} left out: {}", m.address, source.status().ToString());
        continue;
      }
      p->source = std::move(*source);
    }
    added.push_back(m.address + (m.self ? " (self)" : ""));
    next->push_back(std::move(p));
  }
  {
    MutexLock lock(&mu_);
    peers_ = std::move(next);
  }
  if (!added.empty() || !kept.empty()) {
    std::string gone;
    for (const auto& [address, p] : kept) gone += (gone.empty() ? "" : ", ") + address;
    spdlog::info("peer group: {} members; joined: {}; left: {}", members.size(),
                 added.empty() ? "none" : fmt::format("{}", fmt::join(added, ", ")), gone.empty() ? "none" : gone);
  }
}

PeerGroupSource::Peer* PeerGroupSource::OwnerOf(const PeerList& peers, const ChunkKey& key) const {
  const auto now = Clock::now();
  const uint64_t fp = Fingerprint(key);
  Peer* best = nullptr;
  uint64_t best_score = 0;
  for (const auto& p : peers) {
    if (!p->Usable(now)) continue;
    const uint64_t score = XXH3_64bits_withSeed(&fp, sizeof(fp), p->seed);
    if (best == nullptr || score > best_score) {
      best = p.get();
      best_score = score;
    }
  }
  return best != nullptr ? best : upstream_peer_.get();
}

void PeerGroupSource::SetAside(Peer& p, const Status& why) {
  p.errors.fetch_add(1, std::memory_order_relaxed);
  const auto until = Clock::now() + std::chrono::seconds(1);
  p.aside_until_ns.store(until.time_since_epoch().count(), std::memory_order_relaxed);
  if (!p.set_aside.exchange(true)) {
    spdlog::warn("peer group: member {} failed a read ({}); its chunks go to the next member until it answers",
                 p.address, why.ToString());
  }
}

Status PeerGroupSource::ReadChunks(const DatasetPtr& dataset, uint32_t shard, uint64_t first, uint64_t count,
                                   const ReadOptions& options, const ChunkSink& sink) {
  if (!options.via_peers) return upstream_->ReadChunks(dataset, shard, first, count, options, sink);
  SC_RETURN_IF_ERROR(CheckChunkRange(dataset, shard, first, count));
  const auto peers = Snapshot();
  const Hash128 vid = VersionId(dataset->version);
  const uint64_t end = first + count;
  uint64_t next = first;
  while (next < end) {
    Peer* owner = OwnerOf(*peers, ChunkKey{vid, shard, next});
    uint64_t run_end = next + 1;
    while (run_end < end && OwnerOf(*peers, ChunkKey{vid, shard, run_end}) == owner) ++run_end;
    Status sink_status;
    uint64_t delivered = next;
    const Status s = SourceOf(*owner).ReadChunks(
        dataset, shard, next, run_end - next, options, [&](uint64_t c, const ChunkPtr& chunk) -> Status {
          owner->chunks.fetch_add(1, std::memory_order_relaxed);
          owner->bytes.fetch_add(chunk->bytes.size(), std::memory_order_relaxed);
          delivered = c + 1;
          sink_status = sink(c, chunk);
          return sink_status;
        });
    if (!sink_status.ok()) return sink_status;
    if (s.ok()) {
      next = run_end;
      continue;
    }
    if (owner->source == nullptr || CallerEnded(s, options)) return s;
    SetAside(*owner, s);
    next = delivered;  // the rest from the next member in hash order
  }
  return Status::Ok();
}

Status PeerGroupSource::ReadPieces(const DatasetPtr& dataset, uint32_t shard, std::span<const ChunkPiece> pieces,
                                   const ReadOptions& options) {
  if (!options.via_peers) return upstream_->ReadPieces(dataset, shard, pieces, options);
  const auto peers = Snapshot();
  const Hash128 vid = VersionId(dataset->version);
  std::vector<ChunkPiece> todo(pieces.begin(), pieces.end());
  while (!todo.empty()) {
    std::map<Peer*, std::vector<ChunkPiece>> by_owner;
    for (const ChunkPiece& p : todo) by_owner[OwnerOf(*peers, ChunkKey{vid, shard, p.chunk})].push_back(p);
    todo.clear();
    for (auto& [owner, group] : by_owner) {
      const Status s = SourceOf(*owner).ReadPieces(dataset, shard, group, options);
      if (s.ok()) {
        uint64_t bytes = 0;
        for (const ChunkPiece& p : group) bytes += p.length;
        owner->bytes.fetch_add(bytes, std::memory_order_relaxed);
        continue;
      }
      if (owner->source == nullptr || CallerEnded(s, options)) return s;
      SetAside(*owner, s);
      todo.insert(todo.end(), group.begin(), group.end());
    }
  }
  return Status::Ok();
}

std::vector<PeerMemberStats> PeerGroupSource::Members() const {
  const auto peers = Snapshot();
  const auto now = Clock::now();
  std::vector<PeerMemberStats> out;
  size_t usable = 0;
  for (const auto& p : *peers) usable += p->Usable(now) ? 1 : 0;
  auto stats_of = [&](const Peer& p, bool ok, double share) {
    return PeerMemberStats{p.address, p.self, ok, share, p.chunks.load(), p.bytes.load(), p.errors.load()};
  };
  bool self_member = false;
  for (const auto& p : *peers) {
    const bool ok = p->Usable(now);
    self_member = self_member || p->self;
    out.push_back(stats_of(*p, ok, ok && usable > 0 ? 1.0 / static_cast<double>(usable) : 0.0));
  }
  if (!self_member) out.push_back(stats_of(*upstream_peer_, true, usable == 0 ? 1.0 : 0.0));
  return out;
}

void PeerGroupSource::VisitStats(const stats::Visitor& visit) const {
  for (const PeerMemberStats& m : Members()) {
    const stats::Labels labels = {{"member", m.address}};
    stats::Counter(visit, kPeerChunks, m.chunks, &labels);
    stats::Counter(visit, kPeerBytes, m.bytes, &labels);
    stats::Counter(visit, kPeerErrors, m.errors, &labels);
    stats::Gauge(visit, kPeerUsable, m.usable ? 1 : 0, &labels);
    stats::Gauge(visit, kPeerShare, m.share, &labels);
    stats::Gauge(visit, kPeerSelf, m.self ? 1 : 0, &labels);
  }
}

void PeerGroupSource::RefreshLoop() {
  MutexLock lock(&mu_);
  while (!stopping_) {
    cv_.WaitFor(&mu_, options_.refresh);
    if (stopping_) break;
    lock.Unlock();
    auto members = ResolveMembers(options_.members);
    if (members.ok()) {
      SetMembers(*members);
    } else {
      SC_LOG_RATE_LIMITED(spdlog::level::warn, "peer group: {}; keeping the members it had", members.status().ToString());
    }
    lock.Lock();
  }
}

}  // namespace shardcache::upstream
