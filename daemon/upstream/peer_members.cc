#include "daemon/upstream/peer_members.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <set>

namespace shardcache::upstream {
namespace {

// Numeric addresses `host` resolves to; an error naming it when it does not.
Result<std::set<std::string>> Addresses(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0) return Unavailable("cannot resolve '" + host + "': " + ::gai_strerror(rc));
  std::set<std::string> out;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    char buf[NI_MAXHOST];
    if (::getnameinfo(a->ai_addr, a->ai_addrlen, buf, sizeof(buf), nullptr, 0, NI_NUMERICHOST) == 0) out.insert(buf);
  }
  ::freeaddrinfo(res);
  return out;
}

std::set<std::string> LocalAddresses() {
  std::set<std::string> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr) continue;
    const int family = i->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    const socklen_t len = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    char buf[NI_MAXHOST];
    if (::getnameinfo(i->ifa_addr, len, buf, sizeof(buf), nullptr, 0, NI_NUMERICHOST) == 0) out.insert(buf);
  }
  ::freeifaddrs(list);
  return out;
}

std::string JoinHostPort(const std::string& host, int port) {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

bool IsSelf(const std::string& address, const PeerMembersOptions& o, const std::set<std::string>& local) {
  if (!o.self.empty()) return address == o.self;
  std::string host;
  int port = 0;
  if (!SplitHostPort(address, &host, &port).ok() || port != o.origin_port) return false;
  auto resolved = Addresses(host);
  if (!resolved.ok()) return false;
  return std::any_of(resolved->begin(), resolved->end(), [&](const std::string& a) { return local.count(a) > 0; });
}

}  // namespace

Result<std::vector<Member>> ResolveMembers(const PeerMembersOptions& options) {
  std::set<std::string> addresses(options.members.begin(), options.members.end());
  if (!options.dns.empty()) {
    std::string host;
    int port = 0;
    SC_RETURN_IF_ERROR(SplitHostPort(options.dns, &host, &port).WithContext("peers.dns"));
    auto resolved = Addresses(host);
    if (!resolved.ok()) return resolved.status().WithContext("peers.dns");
    for (const std::string& a : *resolved) addresses.insert(JoinHostPort(a, port));
  }
  const std::set<std::string> local = options.self.empty() ? LocalAddresses() : std::set<std::string>();
  std::vector<Member> out;
  for (const std::string& a : addresses) out.push_back(Member{a, IsSelf(a, options, local)});
  return out;
}

}  // namespace shardcache::upstream
