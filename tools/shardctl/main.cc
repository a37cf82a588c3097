// shardctl: the operator's and data engineer's command line (index, pack, fetch, warm, ls,
// status, top, evict). Each subcommand lives in its own cmd_<name>.cc.
#include <algorithm>
#include <map>

#include "common/log.h"
#include "common/version.h"
#include "tools/shardctl/command.h"

namespace shardcache::shardctl {
std::vector<CommandInfo>& Commands() {
  static std::vector<CommandInfo> commands;
  return commands;
}
}  // namespace shardcache::shardctl

int main(int argc, char** argv) {
  using namespace shardcache::shardctl;
  CLI::App app{"shardctl — manage shardcache datasets and daemons"};
  app.set_version_flag("--version", std::string("shardctl ") + shardcache::Version());
  app.require_subcommand(1);
  std::string log_level = "warn";
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error")->capture_default_str();
  auto& commands = Commands();
  std::sort(commands.begin(), commands.end(),
            [](const CommandInfo& a, const CommandInfo& b) { return a.name < b.name; });
  std::map<CLI::App*, std::function<int()>> runners;
  for (auto& c : commands) {
    CLI::App* sub = app.add_subcommand(c.name, c.help);
    runners[sub] = c.setup(sub);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (auto s = shardcache::SetupLogging(log_level); !s.ok()) {
    std::fprintf(stderr, "shardctl: %s\n", s.ToString().c_str());
    return 2;
  }
  for (auto* sub : app.get_subcommands()) return runners[sub]();
  return 2;
}
