// Who may use the local service: the policy on credentials (any group, primary or
// supplementary, counts; names resolve to groups), the credentials the kernel reports for a
// socket, and trainers of other uids admitted or refused by a running service.
#include <grp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

#include <catch2/catch.hpp>

#include "common/fs.h"
#include "daemon/serve/local_service.h"
#include "daemon/serve/peer_access.h"
#include "local_fixture.h"
#include "testing/other_user.h"
#include "testing/process.h"

namespace shardcache::serve {
namespace {

// Ids no test machine gives to anyone.
constexpr uid_t kTrainerUid = 47110;
constexpr gid_t kTrainerGid = 47110;
constexpr gid_t kTrainerGroup = 47111;

PeerCredentials Peer(uid_t uid, gid_t gid, std::vector<gid_t> groups) {
  PeerCredentials p;
  p.uid = uid;
  p.gid = gid;
  p.groups = std::move(groups);
  return p;
}

PeerAccess Policy(std::vector<uint32_t> gids, std::vector<std::string> names = {}) {
  PeerAccessOptions o;
  o.allowed_gids = std::move(gids);
  o.allowed_groups = std::move(names);
  o.allow_root_and_self = false;
  return PeerAccess(o);
}

TEST_CASE("a peer is allowed when any of its groups, primary or supplementary, is allowed", "[serve][access]") {
  const PeerAccess access = Policy({kTrainerGroup});
  CHECK(access.Check(Peer(kTrainerUid, kTrainerGid, {kTrainerGid, kTrainerGroup})).ok());
  CHECK(access.Check(Peer(kTrainerUid, kTrainerGroup, {})).ok());
  const Status refused = access.Check(Peer(kTrainerUid, kTrainerGid, {kTrainerGid, 5}));
  CHECK(refused.code() == StatusCode::kPermissionDenied);
  INFO(refused.message());
  CHECK(refused.message().find("uid 47110 gid 47110 (groups 47110, 5)") != std::string::npos);
  CHECK(refused.message().find("gids 47111") != std::string::npos);
}

TEST_CASE("allowed group names resolve to their gids, and an unknown name admits nobody", "[serve][access]") {
  // Every system has a group named root with gid 0.
  const PeerAccess access = Policy({}, {"no-such-group-shardcache", "root"});
  CHECK(access.Check(Peer(kTrainerUid, kTrainerGid, {0})).ok());
  const Status refused = access.Check(Peer(kTrainerUid, kTrainerGid, {}));
  CHECK(refused.code() == StatusCode::kPermissionDenied);
  CHECK(refused.message().find("members of root (0)") != std::string::npos);
}

TEST_CASE("the kernel reports a socket peer's uid, gid and supplementary groups", "[serve][access]") {
  int fds[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  UniqueFd a(fds[0]), b(fds[1]);
  auto peer = ReadPeerCredentials(a.get());
  REQUIRE(peer.ok());
  CHECK(peer->pid == getpid());
  CHECK(peer->uid == geteuid());
  CHECK(peer->gid == getegid());
  std::vector<gid_t> mine(static_cast<size_t>(getgroups(0, nullptr)));
  REQUIRE(getgroups(static_cast<int>(mine.size()), mine.data()) == static_cast<int>(mine.size()));
  std::sort(mine.begin(), mine.end());
  std::vector<gid_t> reported = peer->groups;
  std::sort(reported.begin(), reported.end());
  CHECK(reported == mine);
}

TEST_CASE("the group database fallback gives a user's groups, and only the gid for an unknown uid",
          "[serve][access]") {
  const auto root = GroupsFromDatabase(0, 0);
  CHECK(std::find(root.begin(), root.end(), 0u) != root.end());
  CHECK(GroupsFromDatabase(kTrainerUid, kTrainerGid) == std::vector<gid_t>{kTrainerGid});
}

TEST_CASE("a trainer of another uid is admitted through a supplementary group and refused in none",
          "[serve][access][integration]") {
  if (geteuid() != 0) {
    WARN("not root: cannot run trainers as other uids; skipped");
    return;
  }
  testing::Fixture f;
  auto opts = f.Options();
  opts.allowed_gids = {kTrainerGroup};
  LocalService svc(*f.files, opts);
  REQUIRE(svc.Start().ok());
  // Let the trainers reach the socket, so that what refuses them is the service.
  REQUIRE(chmod(f.tmp.path().c_str(), 0755) == 0);
  const testing::ProgramsForOtherUsers programs({"local_client_helper"});
  const std::string markers = f.tmp / "markers";
  REQUIRE(MakeDirs(markers).ok());
  REQUIRE(chmod(markers.c_str(), 0777) == 0);

  SECTION("primary gid not allowed, a supplementary group allowed: reads a batch") {
    const std::string marker = markers + "/admitted";
    testing::Process trainer(
        programs.As(kTrainerUid, kTrainerGid, {kTrainerGroup}, "local_client_helper", {f.socket, "rec", "8", "1", marker}),
        f.tmp / "trainer.log");
    const bool read = testing::WaitForFile(marker);
    const auto log = ReadFileToString(f.tmp / "trainer.log");
    INFO((log.ok() ? *log : std::string()));
    REQUIRE(read);
  }
  SECTION("in no allowed group: PermissionDenied naming its ids") {
    std::string out;
    const int rc = testing::RunCommand(
        testing::ShellCommand(programs.As(kTrainerUid, kTrainerGid, {kTrainerGid + 5}, "local_client_helper",
                                          {f.socket, "rec", "8", "1", markers + "/refused"})) + " 2>&1",
        &out);
    INFO(out);
    CHECK(rc == static_cast<int>(StatusCode::kPermissionDenied));
    CHECK(out.find("PermissionDenied") != std::string::npos);
    CHECK(out.find("uid 47110 gid 47110 (groups 47115)") != std::string::npos);
  }
}

}  // namespace
}  // namespace shardcache::serve
