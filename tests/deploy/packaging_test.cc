// The Debian package: `cpack -G DEB` from the build tree into a temporary directory, unpacked
// with `dpkg -x` into a scratch root, layout and control files checked; and [slow], installed
// for real with dpkg and purged with a file system mounted at the cache directory.
#include <sys/mount.h>

#include <filesystem>
#include <regex>

#include <catch2/catch.hpp>

#include "common/fs.h"
#include "testing/other_user.h"
#include "testing/process.h"
#include "testing/temp_dir.h"

namespace shardcache::testing {
namespace {

namespace fs = std::filesystem;

std::string FindFile(const std::string& root, const std::regex& name) {
  if (!fs::exists(root)) return "";
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    if (std::regex_match(e.path().filename().string(), name)) return e.path().string();
  }
  return "";
}

bool Executable(const std::string& p) { return access(p.c_str(), X_OK) == 0; }

std::string Output(const std::string& command) {
  std::string out;
  const int rc = RunCommand(command + " 2>&1", &out);
  INFO(command << "\n" << out);
  REQUIRE(rc == 0);
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

// Builds the package into `out`; returns the .deb's path.
std::string BuildDeb(const TempDir& out) {
  std::string log;
  const int rc = RunCommand(std::string("cd ") + SC_BINARY_DIR + " && cpack -G DEB -B " + out.path() +
                            " --config " + SC_BINARY_DIR + "/CPackConfig.cmake", &log);
  INFO(log);
  REQUIRE(rc == 0);
  const std::string deb = FindFile(out.path(), std::regex(R"(shardcache_.*\.deb)"));
  REQUIRE_FALSE(deb.empty());
  std::printf("package: %s (%.1f MiB)\n", fs::path(deb).filename().c_str(),
              static_cast<double>(fs::file_size(deb)) / (1 << 20));
  return deb;
}

TEST_CASE("cpack builds a .deb with programs, unit, conffile, user creation and the client SDK",
          "[deploy][package]") {
  TempDir out;
  std::string log;
  const std::string deb = BuildDeb(out);

  const std::string root = out / "root", control = out / "control";
  REQUIRE(RunCommand("dpkg -x " + deb + " " + root, &log) == 0);
  REQUIRE(RunCommand("dpkg-deb -e " + deb + " " + control, &log) == 0);

  // Programs, the unit, the example config as a conffile, the sysusers entry.
  CHECK(Executable(root + "/usr/bin/shardcached"));
  CHECK(Executable(root + "/usr/bin/shardctl"));
  CHECK(fs::exists(root + "/lib/systemd/system/shardcached.service"));
  CHECK(fs::exists(root + "/etc/shardcache/shardcached.toml"));
  CHECK(fs::exists(root + "/usr/lib/sysusers.d/shardcache.conf"));
  CHECK(fs::exists(root + "/usr/share/doc/shardcache/gpu-metrics.conf"));
  CHECK(fs::exists(root + "/usr/share/doc/shardcache/README.md"));
  // The package's trainer group, created with the service user.
  auto sysusers = ReadFileToString(root + "/usr/lib/sysusers.d/shardcache.conf");
  REQUIRE(sysusers.ok());
  CHECK(std::regex_search(*sysusers, std::regex(R"(^g shardcache-users )", std::regex::multiline)));
  auto conffiles = ReadFileToString(control + "/conffiles");
  REQUIRE(conffiles.ok());
  CHECK(conffiles->find("/etc/shardcache/shardcached.toml") != std::string::npos);
  auto postinst = ReadFileToString(control + "/postinst");
  REQUIRE(postinst.ok());
  CHECK(postinst->find("adduser --system") != std::string::npos);
  CHECK(postinst->find("addgroup --system shardcache-users") != std::string::npos);
  for (const char* script : {"postinst", "prerm", "postrm"}) {
    INFO(script);
    CHECK(Executable(control + "/" + script));
    CHECK(RunCommand("sh -n " + control + "/" + script) == 0);
  }
  // The linker cache is refreshed when the library comes and goes.
  auto triggers = ReadFileToString(control + "/triggers");
  REQUIRE(triggers.ok());
  CHECK(std::regex_search(*triggers, std::regex(R"(^activate-noawait ldconfig$)", std::regex::multiline)));
  auto ctl = ReadFileToString(control + "/control");
  REQUIRE(ctl.ok());
  INFO(*ctl);
  // Runtime dependencies were computed from the binaries (dpkg-shlibdeps).
  CHECK(ctl->find("libgrpc++") != std::string::npos);
  CHECK(ctl->find("liburing") != std::string::npos);
#ifdef SC_TEST_JEMALLOC
  CHECK(ctl->find("libjemalloc2") != std::string::npos);  // the daemon's heap (common/allocator.h)
#endif

  // Debian policy: copyright and the changelog, whose top entry is the package's version.
  const std::string doc = root + "/usr/share/doc/shardcache";
  auto copyright = ReadFileToString(doc + "/copyright");
  REQUIRE(copyright.ok());
  CHECK(copyright->rfind("Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/", 0) == 0);
  const std::string version = Output("dpkg-deb -f " + deb + " Version");
  CHECK(version == Output("zcat " + doc + "/changelog.gz | dpkg-parsechangelog -l - -S Version"));
  // Both programs report that version.
  CHECK(Output(root + "/usr/bin/shardcached --version") == "shardcached " + version);
  CHECK(Output(root + "/usr/bin/shardctl --version") == "shardctl " + version);

  // The client SDK for trainers: library (in the multiarch directory), headers, pkg-config and
  // CMake package files.
  const std::string libdir = root + "/usr/lib/" + Output("dpkg-architecture -qDEB_HOST_MULTIARCH");
  CHECK(fs::exists(libdir + "/libshardcache.so.0"));
  CHECK(fs::exists(libdir + "/pkgconfig/shardcache.pc"));
  CHECK(fs::exists(root + "/usr/include/shardcache/client.h"));
  CHECK(fs::exists(libdir + "/cmake/shardcache/shardcacheConfig.cmake"));
  // The Python module, where Debian's python3 looks for it.
  const std::string py = root + "/usr/lib/python3/dist-packages/shardcache";
  CHECK(fs::exists(py + "/__init__.py"));
  CHECK(fs::exists(py + "/torch.py"));
  CHECK_FALSE(FindFile(py, std::regex(R"(_shardcache.*\.so)")).empty());

  // The packaged daemon accepts the packaged config (the binary runs from the scratch root).
  std::string check;
  CHECK(RunCommand(root + "/usr/bin/shardcached --check --config " + root + "/etc/shardcache/shardcached.toml",
                   &check) == 0);
  INFO(check);
}

// Undoes what installing the package did, whatever the test got to: unmounts the file system
// over the cache directory, purges the package, deletes the users and groups it created.
class InstalledPackage {
 public:
  InstalledPackage() : identities_({"shardcache"}, {"shardcache", "shardcache-users"}) {}
  ~InstalledPackage() {
    if (mounted_) ::umount2(kCacheDir, MNT_DETACH);
    RunCommand("dpkg --purge shardcache >/dev/null 2>&1");
    ::rmdir(kCacheDir);
  }
  void Mounted() { mounted_ = true; }
  static constexpr const char* kCacheDir = "/var/cache/shardcache";

 private:
  RemovesCreatedIdentities identities_;
  bool mounted_ = false;
};

std::string PackageStatus() {
  std::string out;
  RunCommand("dpkg-query -W -f='${Status}' shardcache 2>/dev/null", &out);
  return out;
}

TEST_CASE("purge succeeds with a file system mounted at the cache directory, and empties it",
          "[deploy][package][slow]") {
  if (geteuid() != 0) {
    WARN("not root: cannot install packages; skipped");
    return;
  }
  if (PackageStatus().find("installed") != std::string::npos && PackageStatus().find("not-installed") == std::string::npos) {
    WARN("a shardcache package is installed on this machine; not touching it; skipped");
    return;
  }
  TempDir out;
  const std::string deb = BuildDeb(out);
  InstalledPackage installed;
  Output("dpkg -i " + deb);
  CHECK(PackageStatus() == "install ok installed");
  // postinst made the trainer group, and the ldconfig trigger registered the library.
  CHECK_FALSE(Output("getent group shardcache-users").empty());
  CHECK(Output("ldconfig -p").find("libshardcache.so.0") != std::string::npos);

  // The cache disk is mounted at the cache directory, and the daemon has written to it.
  REQUIRE(MakeDirs(InstalledPackage::kCacheDir).ok());
  REQUIRE(::mount("tmpfs", InstalledPackage::kCacheDir, "tmpfs", 0, "size=16m") == 0);
  installed.Mounted();
  REQUIRE(MakeDirs(std::string(InstalledPackage::kCacheDir) + "/index").ok());
  REQUIRE(WriteFileAtomic(std::string(InstalledPackage::kCacheDir) + "/index/CURRENT", "x").ok());
  REQUIRE(WriteFileAtomic(std::string(InstalledPackage::kCacheDir) + "/segment-000000", "y").ok());
  REQUIRE(WriteFileAtomic(std::string(InstalledPackage::kCacheDir) + "/.hidden", "z").ok());

  std::string purge;
  const int rc = RunCommand("dpkg --purge shardcache 2>&1", &purge);
  INFO(purge);
  CHECK(rc == 0);
  // Gone, not left half-removed in state `ic`.
  CHECK(PackageStatus().find("installed") == std::string::npos);
  CHECK(PackageStatus().find("config-files") == std::string::npos);
  // The mount point stays (a mount point cannot be removed), empty.
  CHECK(Output("mountpoint " + std::string(InstalledPackage::kCacheDir)).find("is a mountpoint") != std::string::npos);
  CHECK(fs::is_empty(InstalledPackage::kCacheDir));
  CHECK(Output("ldconfig -p").find("libshardcache.so.0") == std::string::npos);
}

}  // namespace
}  // namespace shardcache::testing
