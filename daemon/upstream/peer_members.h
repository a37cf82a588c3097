// PeerMembers: who is in a peer group (peer_group.h), from the platform rather than a protocol
// of our own — a static list of "host:port" in the config, and/or a DNS name that resolves to
// every member (a Kubernetes headless Service gives exactly this), re-resolved every
// peers.refresh so members appear and leave without a restart — and which member is this
// daemon.
//
// Self: the member named peers.self, or, when that is empty, the member whose port is this
// daemon's Origin port and whose host resolves to an address of one of this machine's
// interfaces (getifaddrs; loopback included, so several daemons on one machine tell
// themselves apart by port).
//
// Thread safety: pure functions (they call the system resolver).
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/host_port.h"

namespace shardcache::upstream {

struct PeerMembersOptions {
  std::vector<std::string> members;  // "host:port", as listed
  std::string dns;                   // "name:port": every address the name resolves to; "" = none
  std::string self;                  // how members name this daemon; "" = find it (see above)
  int origin_port = 0;               // this daemon's Origin port (to find itself)
};

struct Member {
  std::string address;  // "host:port" ("[v6]:port")
  bool self = false;
  bool operator==(const Member&) const = default;
};

// The members now: the static list, then the DNS name's addresses, sorted, without duplicates,
// self marked. A DNS name that does not resolve is an error naming it (the caller keeps the
// members it had).
Result<std::vector<Member>> ResolveMembers(const PeerMembersOptions& options);

}  // namespace shardcache::upstream
