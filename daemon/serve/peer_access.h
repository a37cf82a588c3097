// Peer access: which processes may use the local service, decided from what the kernel recorded
// about the connecting process when it called connect() — never from anything the client sends.
//
// Credentials: SO_PEERCRED gives pid, uid and primary gid; SO_PEERGROUPS (Linux >= 4.13) gives
// the supplementary groups. On an older kernel (ENOPROTOOPT) the supplementary groups come from
// the group database instead (getgrouplist of the uid's user name): the groups the administrator
// gave that user, not necessarily those the process holds. That fallback is logged once.
//
// Policy: a peer is allowed when it is root or the daemon's own uid (unless allow_root_and_self
// is false), when its uid is listed, or when ANY of its groups — primary or supplementary — is
// listed, by number or by name. Names (e.g. the package's trainer group "shardcache-users") are
// resolved once, when the policy is built; a name with no group is a warning and admits nobody.
//
// User namespaces: the kernel reports ids as seen from the daemon's user namespace. A peer whose
// ids are not mapped there (systemd's PrivateUsers=yes maps only root and the service user)
// appears as the overflow uid/gid 65534, so no list can match it. Building the policy inside such
// a namespace logs a warning, and refusals of an overflow id say why.
//
// Thread safety: PeerAccess is immutable after construction; Check() may run on any thread.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace shardcache::serve {

struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;                // primary group
  std::vector<gid_t> groups;    // supplementary groups (may repeat gid)
};

// Reads the credentials of the peer of a connected Unix socket. Internal / the errno's status
// when SO_PEERCRED itself fails.
Result<PeerCredentials> ReadPeerCredentials(int fd);

// The fallback for kernels without SO_PEERGROUPS: the groups of `uid`'s user in the group
// database, with `gid`. Only {gid} when the uid has no user entry (e.g. a uid that exists only
// in a container's /etc/passwd).
std::vector<gid_t> GroupsFromDatabase(uid_t uid, gid_t gid);

struct PeerAccessOptions {
  std::vector<uint32_t> allowed_uids;
  std::vector<uint32_t> allowed_gids;
  std::vector<std::string> allowed_groups;  // group names
  bool allow_root_and_self = true;
};

class PeerAccess {
 public:
  explicit PeerAccess(const PeerAccessOptions& options);

  // OK when the peer is allowed; PermissionDenied naming its ids and how to allow it otherwise.
  Status Check(const PeerCredentials& peer) const;

 private:
  bool Allowed(const PeerCredentials& peer) const;

  const uid_t self_;
  const bool allow_root_and_self_;
  const std::vector<uint32_t> uids_;
  std::vector<uint32_t> gids_;   // allowed_gids plus the resolved names
  std::string how_to_allow_;     // the allow lists, for refusals
  bool hides_peers_ = false;     // this user namespace does not map every uid
};

}  // namespace shardcache::serve
