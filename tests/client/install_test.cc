// libshardcache as trainers get it: installed to a prefix, then a C++17 program and a C program
// built against it with pkg-config, and a CMake project with find_package(shardcache), each
// reading an epoch from a running local service.
#include <catch2/catch.hpp>

#include <string>

#include "common/fs.h"
#include "testing/datasets.h"
#include "testing/process.h"
#include "testing/temp_dir.h"

using namespace shardcache;
using shardcache::testing::RunCommand;

namespace {

std::string Run(const std::string& cmd) {
  std::string out;
  const int rc = RunCommand(cmd + " 2>&1", &out);
  INFO(cmd << "\n" << out);
  REQUIRE(rc == 0);
  return out;
}

}  // namespace

TEST_CASE("trainers build against the installed library with pkg-config and CMake",
          "[client][integration]") {
  testing::TempDir tmp;
  const std::string prefix = tmp / "prefix";
  const std::string src = std::string(SC_SOURCE_DIR) + "/tests/client/trainer";
  Run("cmake --install " + std::string(SC_BINARY_DIR) + "/client --prefix " + prefix);
  REQUIRE(RunCommand("test -f " + prefix + "/include/shardcache/client.h -a -f " + prefix +
                     "/include/shardcache/common/status.h -a -f " + prefix +
                     "/include/shardcache/c_api.h") == 0);
  // No daemon-side headers leak into the include tree.
  std::string listing = Run("find " + prefix + "/include -type f | sort");
  REQUIRE(listing.find("local.pb.h") == std::string::npos);

  // lib/<multiarch triplet> on Debian (GNUInstallDirs, see the top CMakeLists.txt).
  const std::string libdir = prefix + "/" + SC_INSTALL_LIBDIR;
  const std::string pc = "PKG_CONFIG_PATH=" + libdir + "/pkgconfig pkg-config";
  const std::string rpath = " -Wl,-rpath," + libdir;
  const std::string flags = std::string(" ") + SC_TRAINER_FLAGS;  // sanitizer builds: their runtime
  Run("g++ -std=c++17" + flags + " -o " + tmp.path() + "/trainer_cc " + src + "/trainer.cc $(" + pc +
      " --cflags --libs shardcache)" + rpath);
  Run("gcc -std=c99" + flags + " -o " + tmp.path() + "/trainer_c " + src + "/trainer.c $(" + pc +
      " --cflags --libs shardcache)" + rpath);
  Run("cmake -S " + src + " -B " + tmp.path() + "/cmake-build -DCMAKE_PREFIX_PATH=" + prefix + " '-DCMAKE_C_FLAGS=" + flags +
      "' '-DCMAKE_CXX_FLAGS=" + flags + "'" +
      " >/dev/null && cmake --build " + tmp.path() + "/cmake-build");
  // The installed library needs protobuf-lite only.
  const std::string deps = Run("ldd " + libdir + "/libshardcache.so");
  REQUIRE(deps.find("grpc") == std::string::npos);
  REQUIRE(deps.find("rocksdb") == std::string::npos);
  REQUIRE(deps.find("libprotobuf.so") == std::string::npos);

  // Each reads the same epoch's bytes from a running service.
  REQUIRE(MakeDirs(tmp / "data").ok());
  auto ds = testing::MakeRecordsDataset(tmp / "data", "rec", 2, 100, 300, 16384);
  REQUIRE(ds.ok());
  const std::string sock = tmp / "s.sock";
  testing::Process server({testing::BinPath("local_serve_helper"), tmp / "data", sock},
                          tmp / "server.log");
  REQUIRE(testing::WaitForFile(sock));
  const std::string a = Run(tmp.path() + "/trainer_cc " + sock + " rec");
  const std::string b = Run(tmp.path() + "/trainer_c " + sock + " rec");
  const std::string c = Run(tmp.path() + "/cmake-build/trainer " + sock + " rec");
  REQUIRE(a.find("samples=200 bytes=60000") != std::string::npos);
  REQUIRE(a == b);
  REQUIRE(a == c);
}
