// The Kubernetes manifests (deploy/k8s) and the container image (deploy/Dockerfile,
// .dockerignore), checked by check_k8s.py beside this file: every manifest parses, no daemon
// runs as root, startupProbe on /ready and liveness after it, an admin port on the pod network
// only behind a NetworkPolicy that admits namespaces alone (POST /evict is unauthenticated),
// each ConfigMap accepted by the built shardcached --check with a memory limit above the buffers
// it reports plus 1 GiB, the config-hash annotation current, the trainer group the same in the
// config, the trainer pod example and the image, the Secrets' keys defined.
#include <catch2/catch.hpp>

#include "testing/process.h"

namespace shardcache::testing {
namespace {

TEST_CASE("the Kubernetes manifests run the daemon non-root, probe it after start-up, fence the admin "
          "port and size memory from the config",
          "[deploy][k8s]") {
  std::string out;
  const int rc = RunCommand("/usr/bin/python3 " + std::string(SC_SOURCE_DIR) + "/tests/deploy/check_k8s.py " +
                                BinPath("shardcached") + " " + SC_SOURCE_DIR + "/deploy 2>&1",
                            &out);
  INFO(out);
  CHECK(rc == 0);
  CHECK(out.find("PROBLEM") == std::string::npos);
}

}  // namespace
}  // namespace shardcache::testing
