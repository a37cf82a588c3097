// The Debian maintainer scripts (deploy/debian/postinst, prerm, postrm) run as dpkg runs them,
// against stand-ins: systemctl, deb-systemd-invoke and systemd-sysusers earlier in PATH record
// their calls, "systemd is running" is a directory of the test's, and the cache and state
// directories are the test's. What an upgrade does to a running daemon, and what purge does to
// a cache directory that is a mount point, without touching the machine. (The package really
// installed and purged: packaging_test.cc, [slow].)
#include <sys/mount.h>
#include <unistd.h>

#include <filesystem>
#include <regex>

#include <catch2/catch.hpp>

#include "common/fs.h"
#include "testing/process.h"
#include "testing/temp_dir.h"

namespace shardcache::testing {
namespace {

namespace fs = std::filesystem;

struct Scripts {
  TempDir dir;
  std::string calls = dir / "calls.log";
  std::string cache = dir / "var/cache/shardcache";
  std::string state = dir / "var/lib/shardcache";

  Scripts() {
    REQUIRE(MakeDirs(dir / "bin").ok());
    REQUIRE(MakeDirs(dir / "run/systemd/system").ok());
    for (const char* tool : {"systemctl", "deb-systemd-invoke", "systemd-sysusers"}) {
      const std::string path = dir / (std::string("bin/") + tool);
      REQUIRE(WriteFileAtomic(path, "#!/bin/sh\necho \"" + std::string(tool) + " $*\" >> " + calls + "\n").ok());
      fs::permissions(path, fs::perms::owner_all);
    }
    for (const char* script : {"postinst", "prerm", "postrm"}) {
      auto text = ReadFileToString(std::string(SC_SOURCE_DIR) + "/deploy/debian/" + script);
      REQUIRE(text.ok());
      std::string s = std::regex_replace(*text, std::regex("/run/systemd/system"), dir / "run/systemd/system");
      s = std::regex_replace(s, std::regex("/var/cache/shardcache"), cache);
      s = std::regex_replace(s, std::regex("/var/lib/shardcache"), state);
      REQUIRE(WriteFileAtomic(dir / script, s).ok());
    }
  }

  // Runs `script args` as dpkg would (sh, set -e inside); returns its exit code.
  int Run(const std::string& script_and_args, std::string* output = nullptr) {
    return RunCommand("PATH=" + (dir / "bin") + ":$PATH sh " + (dir / script_and_args) + " 2>&1", output);
  }
  std::string Calls() {
    auto t = ReadFileToString(calls);
    return t.ok() ? *t : "";
  }
};

TEST_CASE("a first install creates the users and starts nothing; an upgrade restarts a running daemon",
          "[deploy][package]") {
  Scripts s;
  SECTION("first install") {
    REQUIRE(s.Run("postinst configure") == 0);
    INFO(s.Calls());
    CHECK(s.Calls().find("systemd-sysusers /usr/lib/sysusers.d/shardcache.conf") != std::string::npos);
    CHECK(s.Calls().find("systemctl daemon-reload") != std::string::npos);
    CHECK(s.Calls().find("restart") == std::string::npos);
    CHECK(s.Calls().find("start") == std::string::npos);
  }
  SECTION("upgrade from 0.0.9") {
    REQUIRE(s.Run("postinst configure 0.0.9") == 0);
    INFO(s.Calls());
    // try-restart: restarted only when running; a stopped daemon stays stopped.
    CHECK(s.Calls().find("deb-systemd-invoke try-restart shardcached.service") != std::string::npos);
  }
}

TEST_CASE("prerm stops the daemon on remove but not on upgrade", "[deploy][package]") {
  Scripts s;
  REQUIRE(s.Run("prerm upgrade 0.1.0") == 0);
  CHECK(s.Calls().find("stop") == std::string::npos);
  REQUIRE(s.Run("prerm remove") == 0);
  INFO(s.Calls());
  CHECK(s.Calls().find("systemctl stop shardcached.service") != std::string::npos);
}

TEST_CASE("postrm purge empties a cache directory that is a mount point and removes one that is not",
          "[deploy][package]") {
  if (geteuid() != 0) {
    WARN("not root: cannot mount; skipped");
    return;
  }
  Scripts s;
  REQUIRE(MakeDirs(s.cache).ok());
  REQUIRE(::mount("tmpfs", s.cache.c_str(), "tmpfs", 0, "size=4m") == 0);
  struct Unmount {
    std::string path;
    ~Unmount() { ::umount2(path.c_str(), MNT_DETACH); }
  } unmount{s.cache};
  for (const std::string& d : {s.cache, s.state}) {
    REQUIRE(MakeDirs(d + "/index").ok());
    REQUIRE(WriteFileAtomic(d + "/index/CURRENT", "x").ok());
    REQUIRE(WriteFileAtomic(d + "/.hidden", "y").ok());
  }
  std::string out;
  const int rc = s.Run("postrm purge", &out);
  INFO(out);
  CHECK(rc == 0);
  CHECK(fs::exists(s.cache));
  CHECK(fs::is_empty(s.cache));
  CHECK_FALSE(fs::exists(s.state));
  CHECK(out.find("left " + s.cache + " in place") != std::string::npos);
}

}  // namespace
}  // namespace shardcache::testing
