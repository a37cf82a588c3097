// The daemon started the way the shipped unit starts it, and trainers of other uids reading from
// it through the trainer group — the path every non-root trainer takes in production.
//
// This machine and CI run as root in a container without a running systemd, so the test is its
// own stand-in for systemd, driven by the unit file itself (deploy/systemd/shardcached.service),
// not by a copy of its settings:
//   - User=, Group=, UMask= and the Runtime/State/CacheDirectory= directories with their modes,
//     created below a scratch root and owned by the service user, as systemd creates them;
//   - the users and groups the package creates (deploy/debian/sysusers.conf, through
//     systemd-sysusers), removed again when the test created them;
//   - PrivateUsers=yes, when the unit sets it, emulated with an unprivileged user namespace that
//     maps the service user alone (`unshare --user --map-current-user`): like systemd's, it
//     leaves every trainer unmapped, so the daemon sees them as uid 65534. (systemd also maps
//     root; no trainer here is root.)
// The config is the shipped example with its paths moved below the scratch root, so the trainer
// group it allows by default (allowed_groups = ["shardcache-users"]) is what is tested.
#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <sstream>

#include <catch2/catch.hpp>

#include "common/fs.h"
#include "testing/datasets.h"
#include "testing/other_user.h"
#include "testing/process.h"
#include "testing/temp_dir.h"

namespace shardcache::testing {
namespace {

// A trainer's ids: on no test machine do they belong to anyone.
constexpr uid_t kTrainerUid = 47120;
constexpr gid_t kTrainerGid = 47120;

std::string Source(const std::string& rel) { return std::string(SC_SOURCE_DIR) + "/" + rel; }

// Whole file, /proc files too (they report size 0); "" when unreadable.
std::string Text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// What the test takes from the unit's [Service] section.
struct Unit {
  std::string user, group, umask = "0022";
  bool private_users = false;
  struct Directory {
    std::string base;  // /run, /var/lib, /var/cache
    std::string name;
    mode_t mode = 0755;
  };
  std::vector<Directory> directories;
};

Unit ParseUnit(const std::string& path) {
  std::map<std::string, std::string> keys;
  std::istringstream in(Text(path));
  std::string line, section;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (line[0] == '[') {
      section = line;
      continue;
    }
    const size_t eq = line.find('=');
    if (section == "[Service]" && eq != std::string::npos) keys[line.substr(0, eq)] = line.substr(eq + 1);
  }
  Unit u;
  u.user = keys["User"];
  u.group = keys.count("Group") ? keys["Group"] : u.user;
  if (keys.count("UMask")) u.umask = keys["UMask"];
  u.private_users = keys.count("PrivateUsers") && keys["PrivateUsers"] != "no" && keys["PrivateUsers"] != "false";
  for (auto [kind, base] : {std::pair{"Runtime", "/run"}, std::pair{"State", "/var/lib"}, std::pair{"Cache", "/var/cache"}}) {
    const std::string key = std::string(kind) + "Directory";
    if (!keys.count(key)) continue;
    const std::string mode = keys.count(key + "Mode") ? keys[key + "Mode"] : "0755";
    u.directories.push_back({base, keys[key], static_cast<mode_t>(std::stoul(mode, nullptr, 8))});
  }
  return u;
}

std::optional<uid_t> UserId(const std::string& name) {
  const passwd* p = getpwnam(name.c_str());
  return p ? std::optional<uid_t>(p->pw_uid) : std::nullopt;
}
std::optional<gid_t> GroupId(const std::string& name) {
  const group* g = getgrnam(name.c_str());
  return g ? std::optional<gid_t>(g->gr_gid) : std::nullopt;
}

// The shipped example config with every absolute path of the unit's directories moved below
// `root`, the upstream at `datasets`, and no admin port (nothing to collide with).
std::string ExampleConfigBelow(const std::string& root, const std::string& datasets) {
  std::string text = Text(Source("config/shardcached.toml"));
  text = std::regex_replace(text, std::regex(R"(^upstream = .*$)", std::regex::multiline),
                            "upstream = \"file://" + datasets + "\"");
  text = std::regex_replace(text, std::regex(R"(^metrics = .*$)", std::regex::multiline), "metrics = \"\"");
  for (const char* base : {"/run/", "/var/lib/", "/var/cache/"}) {
    text = std::regex_replace(text, std::regex(std::string("\"") + base), "\"" + root + base);
  }
  return text;
}

std::string TrainerGroupOf(const std::string& config) {
  std::smatch m;
  REQUIRE(std::regex_search(config, m, std::regex(R"re(allowed_groups = \["([^"]+)"\])re")));
  return m[1];
}

// The daemon as the unit runs it, below a scratch root.
struct UnitHarness {
  Unit unit = ParseUnit(Source("deploy/systemd/shardcached.service"));
  TempDir root;
  std::string config_text;
  std::string trainer_group;
  std::string socket;
  std::unique_ptr<RemovesCreatedIdentities> identities;
  std::unique_ptr<ProgramsForOtherUsers> programs;
  std::unique_ptr<Process> daemon;
  uid_t service_uid = 0;

  void Start() {
    REQUIRE_FALSE(unit.user.empty());
    REQUIRE(chmod(root.path().c_str(), 0755) == 0);
    const std::string datasets = root / "datasets";
    REQUIRE(MakeDirs(datasets).ok());
    REQUIRE(MakeRecordsDataset(datasets, "rec", 2, 64, 1024, 16 << 10).ok());
    REQUIRE(RunCommand("chmod -R a+rX " + datasets) == 0);
    config_text = ExampleConfigBelow(root.path(), datasets);
    trainer_group = TrainerGroupOf(config_text);
    // The users and groups the package creates, as it creates them.
    identities = std::make_unique<RemovesCreatedIdentities>(std::vector<std::string>{unit.user},
                                                            std::vector<std::string>{unit.group, trainer_group});
    std::string out;
    const int rc = RunCommand("systemd-sysusers " + Source("deploy/debian/sysusers.conf") + " 2>&1", &out);
    INFO(out);
    REQUIRE(rc == 0);
    const auto uid = UserId(unit.user);
    const auto gid = GroupId(unit.group);
    REQUIRE(uid);
    REQUIRE(gid);
    service_uid = *uid;
    for (const auto& d : unit.directories) {
      const std::string path = root.path() + d.base + "/" + d.name;
      REQUIRE(MakeDirs(path).ok());
      REQUIRE(chown(path.c_str(), *uid, *gid) == 0);
      REQUIRE(chmod(path.c_str(), d.mode) == 0);
    }
    const std::string config = root / "shardcached.toml";
    REQUIRE(WriteFileAtomic(config, config_text).ok());
    REQUIRE(chmod(config.c_str(), 0644) == 0);
    std::smatch m;
    REQUIRE(std::regex_search(config_text, m, std::regex(R"re(socket = "([^"]+)")re")));
    socket = m[1];
    REQUIRE(MakeDirs(root / "markers").ok());
    REQUIRE(chmod((root / "markers").c_str(), 0777) == 0);

    programs = std::make_unique<ProgramsForOtherUsers>(std::vector<std::string>{"shardcached", "local_client_helper"});
    std::vector<std::string> argv = {"/bin/sh", "-c", "umask " + unit.umask + " && exec \"$@\"", "sh",
                                     "setpriv", "--reuid=" + std::to_string(*uid), "--regid=" + std::to_string(*gid),
                                     "--init-groups"};
    if (unit.private_users) argv.insert(argv.end(), {"unshare", "--user", "--map-current-user"});
    argv.insert(argv.end(), {programs->Path("shardcached"), "--config", config});
    daemon = std::make_unique<Process>(argv, root / "daemon.log");
    const bool listening = WaitForFile(socket);
    INFO("daemon log:\n" << Text(root / "daemon.log"));
    REQUIRE(listening);
  }

  // Runs local_client_helper as kTrainerUid:kTrainerGid with the supplementary `groups`.
  std::vector<std::string> Trainer(const std::vector<gid_t>& groups, const std::string& marker) const {
    return programs->As(kTrainerUid, kTrainerGid, groups, "local_client_helper", {socket, "rec", "8", "1", marker});
  }
  // The same trainer saving checkpoint `name` of `bytes` bytes.
  std::vector<std::string> Saver(const std::vector<gid_t>& groups, const std::string& name, size_t bytes,
                                 const std::string& marker) const {
    return programs->As(kTrainerUid, kTrainerGid, groups, "local_client_helper",
                        {socket, name, std::to_string(bytes), "save", marker});
  }
};

TEST_CASE("under the shipped unit, a trainer of another uid in the trainer group reads a batch and one "
          "in no allowed group is refused",
          "[deploy][systemd][access]") {
  if (geteuid() != 0) {
    WARN("not root: cannot run the daemon and trainers as other users; skipped");
    return;
  }
  UnitHarness h;
  h.Start();
  INFO("unit: User=" << h.unit.user << " Group=" << h.unit.group << " UMask=" << h.unit.umask
                     << " PrivateUsers=" << (h.unit.private_users ? "yes" : "no"));
  // The daemon runs as the unit's user.
  CHECK(Text("/proc/" + std::to_string(h.daemon->pid()) + "/status").find("Uid:\t" + std::to_string(h.service_uid)) !=
        std::string::npos);
  const auto trainer_gid = GroupId(h.trainer_group);
  REQUIRE(trainer_gid);

  SECTION("in the trainer group as a supplementary group: reads a batch") {
    const std::string marker = h.root / "markers/admitted";
    Process trainer(h.Trainer({*trainer_gid}, marker), h.root / "trainer.log");
    const bool read = WaitForFile(marker);
    INFO("trainer log:\n" << Text(h.root / "trainer.log") << "\ndaemon log:\n" << Text(h.root / "daemon.log"));
    REQUIRE(read);
    CHECK(Text(marker).rfind("ready ", 0) == 0);
  }
  SECTION("in the trainer group: saves a checkpoint, durable in the unit's cache directory") {
    // The daemon creates the file in its own directory (0750, the service user's) and passes the
    // descriptor: the trainer writes it without any right to the directory.
    const std::string marker = h.root / "markers/saved";
    std::string out;
    const int rc = RunCommand(ShellCommand(h.Saver({*trainer_gid}, "run7/step1/rank0.pt", 3 << 20, marker)) + " 2>&1", &out);
    INFO(out << "\ndaemon log:\n" << Text(h.root / "daemon.log"));
    REQUIRE(rc == 0);
    CHECK(Text(marker) == "saved " + std::to_string(3 << 20) + "\n");
    std::smatch m;  // cache.dir, the first "dir =" of the config (checkpoints.dir "" = below it)
    REQUIRE(std::regex_search(h.config_text, m, std::regex(R"re(\ndir = "([^"]+)")re")));
    const std::string saved = Text(std::string(m[1]) + "/checkpoints/objects/run7/step1/rank0.pt");
    REQUIRE(saved.size() == (3u << 20));
    for (size_t i = 0; i < saved.size(); i += 4099) CHECK(static_cast<unsigned char>(saved[i]) == i % 251);
  }
  SECTION("in no allowed group: PermissionDenied") {
    std::string out;
    const int rc = RunCommand(ShellCommand(h.Trainer({}, h.root / "markers/refused")) + " 2>&1", &out);
    INFO(out);
    CHECK(rc == 7);  // StatusCode::kPermissionDenied
    CHECK(out.find("PermissionDenied") != std::string::npos);
    CHECK(out.find("uid " + std::to_string(kTrainerUid)) != std::string::npos);
  }
}

}  // namespace
}  // namespace shardcache::testing
