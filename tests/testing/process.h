// Runs real programs (daemons, nginx, wanem.py) from tests: spawn with arguments, wait for a
// TCP port or a file, signal, and always reap on scope exit so no test leaves a process behind.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace shardcache::testing {

class Process {
 public:
  // Starts argv[0] (searched in PATH when it has no '/'), stdout+stderr to `log_path`
  // (or inherited when empty). Throws std::runtime_error when fork/exec fails.
  Process(std::vector<std::string> argv, const std::string& log_path = "");
  ~Process();  // SIGKILL + reap when still running
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  bool Running();
  void Signal(int sig);
  // Waits for exit; returns the exit code, 128+signal when killed, -1 on timeout.
  int Wait(std::chrono::milliseconds timeout = std::chrono::seconds(30));
  void Kill();  // SIGKILL and reap

 private:
  pid_t pid_ = -1;
  int status_ = 0;
  bool reaped_ = false;
};

// A TCP port on 127.0.0.1 that was free a moment ago.
int FreePort();
// Polls until host:port (an IPv4 address) accepts a connection; false on timeout.
bool WaitForPort(int port, std::chrono::milliseconds timeout = std::chrono::seconds(20),
                 const std::string& host = "127.0.0.1");
bool WaitForFile(const std::string& path, std::chrono::milliseconds timeout = std::chrono::seconds(20));
// Path of a built program: <build>/bin/<name>.
std::string BinPath(const std::string& name);
// Path to ../shared/tools/wanem.py beside the checkout, or "" when absent.
std::string WanemPath();
// Runs a shell command, returns its exit code; output appended to *output when non-null.
int RunCommand(const std::string& command, std::string* output = nullptr);

}  // namespace shardcache::testing
