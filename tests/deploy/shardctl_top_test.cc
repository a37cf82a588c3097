// shardctl top's frame, computed from two synthetic scrapes one second apart, and the
// Prometheus text parser it reads them with.
#include <catch2/catch.hpp>

#include "tools/shardctl/admin_client.h"
#include "tools/shardctl/top_view.h"

namespace shardcache::shardctl {
namespace {

Samples Parse(const std::string& text) {
  auto s = ParsePrometheusText(text);
  REQUIRE(s.ok());
  return *s;
}

TEST_CASE("the Prometheus text parser keeps label sets and survives quoted braces", "[deploy][shardctl]") {
  const auto s = Parse("# HELP x y\n# TYPE x counter\nx{a=\"1\",b=\"}{ \\\"q\\\"\"} 5\ny 2.5e3\nz{le=\"+Inf\"} 7 1700000000\n");
  CHECK(Value(s, "x{a=\"1\",b=\"}{ \\\"q\\\"\"}") == 5);
  CHECK(Value(s, "y") == 2500);
  CHECK(Sum(s, "z") == 7);
  CHECK(LabelValue("a=\"1\",ba=\"2\",b=\"3\"", "b") == "3");
  CHECK_FALSE(ParsePrometheusText("x{a=\"1\" 5\n").ok());
  CHECK_FALSE(ParsePrometheusText("x notanumber\n").ok());
}

TEST_CASE("a top frame shows interval hit ratio, tier rates and the most stalled dataset and rank first",
          "[deploy][shardctl]") {
  const Samples prev = Parse(
      "shardcache_process_uptime_seconds 100\n"
      "shardcache_cache_hits_total{tier=\"dram\"} 100\nshardcache_cache_hits_total{tier=\"nvme\"} 0\n"
      "shardcache_cache_misses_total 100\n"
      "shardcache_cache_served_bytes_total{tier=\"dram\"} 0\nshardcache_cache_served_bytes_total{tier=\"nvme\"} 0\n"
      "shardcache_cache_served_bytes_total{tier=\"upstream\"} 0\n"
      "shardcache_upstream_payload_bytes_total 0\nshardcache_upstream_wire_bytes_total 0\n"
      "shardcache_loader_bytes_total{dataset=\"tokens\",rank=\"0\"} 0\n"
      "shardcache_loader_stall_seconds_total{dataset=\"tokens\",rank=\"0\"} 0\n"
      "shardcache_loader_bytes_total{dataset=\"tokens\",rank=\"1\"} 0\n"
      "shardcache_loader_stall_seconds_total{dataset=\"tokens\",rank=\"1\"} 0\n"
      "shardcache_loader_bytes_total{dataset=\"old\",rank=\"0\"} 4096\n");
  const Samples cur = Parse(
      "shardcache_process_uptime_seconds 101\n"
      "shardcache_cache_hits_total{tier=\"dram\"} 160\nshardcache_cache_hits_total{tier=\"nvme\"} 30\n"
      "shardcache_cache_misses_total 110\n"
      "shardcache_cache_served_bytes_total{tier=\"dram\"} 1048576\nshardcache_cache_served_bytes_total{tier=\"nvme\"} 524288\n"
      "shardcache_cache_served_bytes_total{tier=\"upstream\"} 0\n"
      "shardcache_upstream_payload_bytes_total 2097152\nshardcache_upstream_wire_bytes_total 1048576\n"
      "shardcache_loader_bytes_total{dataset=\"tokens\",rank=\"0\"} 1048576\n"
      "shardcache_loader_stall_seconds_total{dataset=\"tokens\",rank=\"0\"} 0.05\n"
      "shardcache_loader_open{dataset=\"tokens\",rank=\"0\"} 1\n"
      "shardcache_loader_bytes_total{dataset=\"tokens\",rank=\"1\"} 524288\n"
      "shardcache_loader_stall_seconds_total{dataset=\"tokens\",rank=\"1\"} 0.8\n"
      "shardcache_loader_open{dataset=\"tokens\",rank=\"1\"} 2\n"
      "shardcache_loader_bytes_total{dataset=\"old\",rank=\"0\"} 4096\n"
      "shardcache_loader_open{dataset=\"old\",rank=\"0\"} 0\n");
  const std::string frame = RenderTopFrame(prev, cur, 1.0, "127.0.0.1:9750");
  INFO(frame);
  // 60 dram + 30 nvme hits, 10 misses in the interval.
  CHECK(frame.find("hit ratio  90.0%  (dram 60.0%, nvme 30.0%, miss 10.0%; last interval)") != std::string::npos);
  CHECK(frame.find("served    1.50 MiB/s  (dram 1.00 MiB/s, nvme 512.00 KiB/s, upstream 0 B/s)") != std::string::npos);
  CHECK(frame.find("upstream  2.00 MiB/s verified  wire 1.00 MiB/s (x2.00)") != std::string::npos);
  const size_t rank1 = frame.find("tokens                           1       2"),
               rank0 = frame.find("tokens                           0       1");
  REQUIRE(rank1 != std::string::npos);
  REQUIRE(rank0 != std::string::npos);
  CHECK(rank1 < rank0);  // 40% stalled per loader (0.8 s over 2 loaders) before 5% stalled
  CHECK(frame.find("  40.0%") != std::string::npos);
  CHECK(frame.find("   5.0%") != std::string::npos);
  CHECK(frame.find("old") == std::string::npos);  // no loader open and nothing read: not shown
}

}  // namespace
}  // namespace shardcache::shardctl
