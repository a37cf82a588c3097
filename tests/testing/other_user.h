// Running built programs as another user, for tests of access control and of the daemon as the
// shipped unit runs it.
//
// The build tree may sit below a directory other users cannot traverse (a clone under /root,
// any `mktemp -d` folder), where a program run as another uid cannot even be loaded. So tests
// run world-readable copies: ProgramsForOtherUsers copies the named programs from <build>/bin,
// and the client library they may load, into a fresh 0755 directory removed on scope exit.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "testing/temp_dir.h"

namespace shardcache::testing {

class ProgramsForOtherUsers {
 public:
  // Copies <build>/bin/<name> for each name, and <build>/lib/libshardcache.so.0.
  explicit ProgramsForOtherUsers(const std::vector<std::string>& names);
  // Path of the copy of `name`.
  std::string Path(const std::string& name) const { return dir_ / name; }
  // argv that runs the copy of `name` with `args` as uid:gid with exactly the supplementary
  // `groups` (setpriv, no login environment), finding the copied library first.
  std::vector<std::string> As(uid_t uid, gid_t gid, const std::vector<gid_t>& groups, const std::string& name,
                              const std::vector<std::string>& args) const;

 private:
  TempDir dir_;
};

// Tests that create system users and groups (systemd-sysusers, a package's postinst) leave the
// machine as they found it: the named ones missing at construction are deleted (userdel,
// groupdel) at destruction if they exist by then.
class RemovesCreatedIdentities {
 public:
  RemovesCreatedIdentities(const std::vector<std::string>& users, const std::vector<std::string>& groups);
  ~RemovesCreatedIdentities();
  RemovesCreatedIdentities(const RemovesCreatedIdentities&) = delete;
  RemovesCreatedIdentities& operator=(const RemovesCreatedIdentities&) = delete;

 private:
  std::vector<std::string> users_, groups_;  // missing at construction
};

// `argv` joined into one shell command line (each word single-quoted).
std::string ShellCommand(const std::vector<std::string>& argv);

}  // namespace shardcache::testing
