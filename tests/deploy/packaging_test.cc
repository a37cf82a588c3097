// The Debian package: `cpack -G DEB` from the build tree into a temporary directory, unpacked
// with `dpkg -x` into a scratch root, layout and control files checked. Also: the Kubernetes
// manifest parses and shares the socket directory with trainer pods.
#include <filesystem>
#include <regex>

#include <catch2/catch.hpp>

#include "common/fs.h"
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

TEST_CASE("cpack builds a .deb with programs, unit, conffile, user creation and the client SDK",
          "[deploy][package]") {
  TempDir out;
  std::string log;
  const int rc = RunCommand(std::string("cd ") + SC_BINARY_DIR + " && cpack -G DEB -B " + out.path() +
                            " --config " + SC_BINARY_DIR + "/CPackConfig.cmake", &log);
  INFO(log);
  REQUIRE(rc == 0);
  const std::string deb = FindFile(out.path(), std::regex(R"(shardcache_.*\.deb)"));
  REQUIRE_FALSE(deb.empty());
  std::printf("package: %s (%.1f MiB)\n", fs::path(deb).filename().c_str(),
              static_cast<double>(fs::file_size(deb)) / (1 << 20));

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
  auto conffiles = ReadFileToString(control + "/conffiles");
  REQUIRE(conffiles.ok());
  CHECK(conffiles->find("/etc/shardcache/shardcached.toml") != std::string::npos);
  auto postinst = ReadFileToString(control + "/postinst");
  REQUIRE(postinst.ok());
  CHECK(postinst->find("adduser --system") != std::string::npos);
  CHECK(Executable(control + "/postinst"));
  CHECK(RunCommand("sh -n " + control + "/postinst") == 0);
  auto ctl = ReadFileToString(control + "/control");
  REQUIRE(ctl.ok());
  INFO(*ctl);
  // Runtime dependencies were computed from the binaries (dpkg-shlibdeps).
  CHECK(ctl->find("libgrpc++") != std::string::npos);
  CHECK(ctl->find("liburing") != std::string::npos);

  // The client SDK for trainers: library, headers, pkg-config and CMake package files.
  CHECK_FALSE(FindFile(root + "/usr/lib", std::regex(R"(libshardcache\.so.*)")).empty());
  CHECK(fs::exists(root + "/usr/include/shardcache/client.h"));
  CHECK_FALSE(FindFile(root + "/usr/lib", std::regex(R"(shardcache\.pc)")).empty());
  CHECK_FALSE(FindFile(root + "/usr/lib", std::regex(R"(shardcacheConfig\.cmake)")).empty());
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

TEST_CASE("the Kubernetes DaemonSet shares the socket directory and mounts the cache from the host",
          "[deploy][k8s]") {
  const std::string manifest = std::string(SC_SOURCE_DIR) + "/deploy/k8s/daemonset.yaml";
  // Parse every document with PyYAML (Debian's python3) and check the volumes and probes.
  const std::string script =
      "import sys, yaml\n"
      "docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]\n"
      "kinds = {d['kind'] for d in docs}\n"
      "assert {'DaemonSet', 'ConfigMap'} <= kinds, kinds\n"
      "ds = next(d for d in docs if d['kind'] == 'DaemonSet')\n"
      "pod = ds['spec']['template']['spec']\n"
      "vols = {v['name']: v for v in pod['volumes']}\n"
      "paths = {v['hostPath']['path'] for v in vols.values() if 'hostPath' in v}\n"
      "assert '/run/shardcache' in paths and '/var/cache/shardcache' in paths, paths\n"
      "c = pod['containers'][0]\n"
      "mounts = {m['mountPath'] for m in c['volumeMounts']}\n"
      "assert {'/run/shardcache', '/var/cache/shardcache', '/etc/shardcache'} <= mounts, mounts\n"
      "assert c['readinessProbe']['httpGet']['path'] == '/ready'\n"
      "cm = next(d for d in docs if d['kind'] == 'ConfigMap')\n"
      "open(sys.argv[2], 'w').write(cm['data']['shardcached.toml'])\n"
      "print('ok')\n";
  TempDir dir;
  REQUIRE(WriteFileAtomic(dir / "check.py", script).ok());
  std::string out;
  CHECK(RunCommand("/usr/bin/python3 " + (dir / "check.py") + " " + manifest + " " + (dir / "k8s.toml"), &out) == 0);
  INFO(out);
  // The config shipped in the ConfigMap is valid for the daemon.
  out.clear();
  CHECK(RunCommand(BinPath("shardcached") + " --check --config " + (dir / "k8s.toml"), &out) == 0);
  INFO(out);
}

}  // namespace
}  // namespace shardcache::testing
