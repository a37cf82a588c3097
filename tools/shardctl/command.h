// shardctl subcommands register themselves: each cmd_<name>.cc defines one static
// CommandRegistration, so adding a subcommand touches only its own file and the list in
// CMakeLists.txt.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace shardcache::shardctl {

// Adds options to `sub` and returns the function that runs the command once parsed; that
// function returns the process exit code (0 ok, 1 failure, 2 bad usage).
using CommandSetup = std::function<std::function<int()>(CLI::App* sub)>;

struct CommandInfo {
  std::string name;
  std::string help;
  CommandSetup setup;
};

std::vector<CommandInfo>& Commands();

struct CommandRegistration {
  CommandRegistration(std::string name, std::string help, CommandSetup setup) {
    Commands().push_back({std::move(name), std::move(help), std::move(setup)});
  }
};

}  // namespace shardcache::shardctl
