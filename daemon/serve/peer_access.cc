#include "daemon/serve/peer_access.h"

#include <grp.h>
#include <pwd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <fstream>
#include <functional>
#include <optional>

#include <spdlog/spdlog.h>

namespace shardcache::serve {
namespace {

// The id the kernel reports for an id the reader's user namespace does not map
// (/proc/sys/kernel/overflowuid and overflowgid; 65534 unless an administrator changed them).
constexpr uint32_t kOverflowId = 65534;

std::string JoinIds(const std::vector<uint32_t>& ids) {
  std::string out;
  for (uint32_t id : ids) out += (out.empty() ? "" : ", ") + std::to_string(id);
  return out;
}

// getgrnam_r / getpwuid_r fill a caller buffer and answer ERANGE when it is too small. `call`
// gets the buffer, copies what it needs out of the entry, and returns the function's result.
void CallWithBuffer(const std::function<int(char*, size_t)>& call) {
  std::vector<char> buf(4096);
  while (call(buf.data(), buf.size()) == ERANGE && buf.size() < (1u << 24)) buf.resize(buf.size() * 4);
}

std::optional<gid_t> GroupId(const std::string& name) {
  std::optional<gid_t> id;
  CallWithBuffer([&](char* buf, size_t size) {
    group entry{};
    group* found = nullptr;
    const int rc = getgrnam_r(name.c_str(), &entry, buf, size, &found);
    if (rc == 0 && found != nullptr) id = found->gr_gid;
    return rc;
  });
  return id;
}

std::optional<std::string> UserName(uid_t uid) {
  std::optional<std::string> name;
  CallWithBuffer([&](char* buf, size_t size) {
    passwd entry{};
    passwd* found = nullptr;
    const int rc = getpwuid_r(uid, &entry, buf, size, &found);
    if (rc == 0 && found != nullptr) name = found->pw_name;
    return rc;
  });
  return name;
}

// How many uids this process's user namespace maps (4294967295 in the initial namespace; 0 when
// /proc does not say).
uint64_t MappedUids() {
  std::ifstream in("/proc/self/uid_map");
  uint64_t inside = 0, outside = 0, count = 0, total = 0;
  while (in >> inside >> outside >> count) total += count;
  return total;
}

}  // namespace

Result<PeerCredentials> ReadPeerCredentials(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return ErrnoStatus(errno, "SO_PEERCRED");
  }
  PeerCredentials peer;
  peer.pid = cred.pid;
  peer.uid = cred.uid;
  peer.gid = cred.gid;
  // SO_PEERGROUPS answers ERANGE with the size it needs when the buffer is too small.
  std::vector<gid_t> groups(64);
  for (;;) {
    socklen_t bytes = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &bytes) == 0) {
      groups.resize(bytes / sizeof(gid_t));
      peer.groups = std::move(groups);
      return peer;
    }
    if (errno == ERANGE && bytes > groups.size() * sizeof(gid_t)) {
      groups.resize(bytes / sizeof(gid_t));
      continue;
    }
    break;
  }
  if (errno != ENOPROTOOPT) return ErrnoStatus(errno, "SO_PEERGROUPS");
  static std::atomic<bool> logged{false};
  if (!logged.exchange(true)) {
    spdlog::warn("this kernel has no SO_PEERGROUPS (Linux < 4.13): trainers' supplementary groups are "
                 "taken from the group database instead of from the connecting process");
  }
  peer.groups = GroupsFromDatabase(peer.uid, peer.gid);
  return peer;
}

std::vector<gid_t> GroupsFromDatabase(uid_t uid, gid_t gid) {
  const auto name = UserName(uid);
  if (!name) return {gid};
  std::vector<gid_t> groups(64);
  for (;;) {
    int n = static_cast<int>(groups.size());
    if (getgrouplist(name->c_str(), gid, groups.data(), &n) >= 0) {
      groups.resize(static_cast<size_t>(n));
      return groups;
    }
    // -1: n now holds the number needed.
    groups.resize(static_cast<size_t>(std::max(n, static_cast<int>(groups.size()) * 2)));
  }
}

PeerAccess::PeerAccess(const PeerAccessOptions& o)
    : self_(geteuid()), allow_root_and_self_(o.allow_root_and_self), uids_(o.allowed_uids), gids_(o.allowed_gids) {
  const uint64_t mapped_uids = MappedUids();
  hides_peers_ = mapped_uids > 0 && mapped_uids < 4294967295ull;
  std::vector<std::string> allowed;
  if (allow_root_and_self_) allowed.push_back(self_ == 0 ? "root" : "root and uid " + std::to_string(self_));
  if (!uids_.empty()) allowed.push_back("uids " + JoinIds(uids_));
  std::string names;
  for (const auto& name : o.allowed_groups) {
    const auto id = GroupId(name);
    if (!id) {
      spdlog::warn("local.allowed_groups: there is no group '{}' on this system; it admits nobody "
                   "(the shardcache package creates shardcache-users)", name);
      continue;
    }
    gids_.push_back(*id);
    names += (names.empty() ? "" : ", ") + name + " (" + std::to_string(*id) + ")";
  }
  if (!names.empty()) allowed.push_back("members of " + names);
  if (!o.allowed_gids.empty()) allowed.push_back("gids " + JoinIds(o.allowed_gids));
  for (const auto& a : allowed) how_to_allow_ += (how_to_allow_.empty() ? "" : "; ") + a;
  if (hides_peers_) {
    spdlog::warn("this daemon runs in a user namespace that maps only {} uids: trainers outside it appear as "
                 "uid/gid {} and are refused whatever local.allowed_* say (systemd PrivateUsers=yes does "
                 "this; the shipped unit does not set it)",
                 mapped_uids, kOverflowId);
  }
}

bool PeerAccess::Allowed(const PeerCredentials& peer) const {
  if (allow_root_and_self_ && (peer.uid == 0 || peer.uid == self_)) return true;
  if (std::find(uids_.begin(), uids_.end(), peer.uid) != uids_.end()) return true;
  auto listed = [&](gid_t g) { return std::find(gids_.begin(), gids_.end(), g) != gids_.end(); };
  return listed(peer.gid) || std::any_of(peer.groups.begin(), peer.groups.end(), listed);
}

Status PeerAccess::Check(const PeerCredentials& peer) const {
  if (Allowed(peer)) return Status::Ok();
  std::string m = "uid " + std::to_string(peer.uid) + " gid " + std::to_string(peer.gid) + " (groups " +
                  (peer.groups.empty() ? "none" : JoinIds(std::vector<uint32_t>(peer.groups.begin(), peer.groups.end()))) +
                  ") is not allowed to use this shardcached; allowed: " +
                  (how_to_allow_.empty() ? "nobody" : how_to_allow_);
  if (peer.uid == kOverflowId && hides_peers_) {
    m += ". uid " + std::to_string(kOverflowId) +
         " is how the daemon's user namespace shows a process it does not map (systemd PrivateUsers=yes): "
         "run the daemon without it";
  }
  return PermissionDenied(m);
}

}  // namespace shardcache::serve
