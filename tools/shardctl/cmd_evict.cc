// shardctl evict DATASET [--metrics-addr HOST:PORT]
// Drops every cached chunk of DATASET (all versions) from a running daemon's cache tiers.
#include <cstdio>

#include "tools/shardctl/admin_client.h"
#include "tools/shardctl/command.h"

namespace shardcache::shardctl {
namespace {

std::string UrlEncode(const std::string& s) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

int RunEvict(const std::string& addr, const std::string& dataset) {
  AdminClient client(addr);
  auto body = client.Post("/evict?dataset=" + UrlEncode(dataset));
  if (!body.ok()) {
    std::fprintf(stderr, "shardctl evict: %s\n", body.status().message().c_str());
    return body.status().code() == StatusCode::kInvalidArgument ? 2 : 1;
  }
  std::printf("evicted dataset '%s' from %s\n", dataset.c_str(), addr.c_str());
  return 0;
}

const CommandRegistration kEvict("evict", "drop a dataset's chunks from a running daemon's cache",
                                 [](CLI::App* sub) -> std::function<int()> {
  auto addr = std::make_shared<std::string>();
  auto dataset = std::make_shared<std::string>();
  sub->add_option("dataset", *dataset, "dataset name")->required();
  AddMetricsAddrOption(sub, addr.get());
  return [addr, dataset] { return RunEvict(*addr, *dataset); };
});

}  // namespace
}  // namespace shardcache::shardctl
