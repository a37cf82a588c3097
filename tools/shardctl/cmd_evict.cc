// shardctl evict DATASET [--config PATH | --metrics-addr HOST:PORT]
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

int RunEvict(const AdminTarget& target, const std::string& dataset) {
  auto client = AdminClient::For(target);
  if (!client.ok()) {
    std::fprintf(stderr, "shardctl evict: %s\n", client.status().message().c_str());
    return 1;
  }
  auto body = client->Post("/evict?dataset=" + UrlEncode(dataset));
  if (!body.ok()) {
    std::fprintf(stderr, "shardctl evict: %s\n", body.status().message().c_str());
    return body.status().code() == StatusCode::kInvalidArgument ? 2 : 1;
  }
  std::printf("evicted dataset '%s' from %s\n", dataset.c_str(), client->address().c_str());
  return 0;
}

const CommandRegistration kEvict("evict", "drop a dataset's chunks from a running daemon's cache",
                                 [](CLI::App* sub) -> std::function<int()> {
  auto target = std::make_shared<AdminTarget>();
  auto dataset = std::make_shared<std::string>();
  sub->add_option("dataset", *dataset, "dataset name")->required();
  target->AddOptions(sub);
  return [target, dataset] { return RunEvict(*target, *dataset); };
});

}  // namespace
}  // namespace shardcache::shardctl
