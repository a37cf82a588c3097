#include "testing/other_user.h"

#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>

#include <filesystem>
#include <stdexcept>

#include "testing/process.h"

namespace shardcache::testing {

namespace fs = std::filesystem;

ProgramsForOtherUsers::ProgramsForOtherUsers(const std::vector<std::string>& names) {
  if (::chmod(dir_.path().c_str(), 0755) != 0) throw std::runtime_error("chmod " + dir_.path());
  for (const auto& name : names) fs::copy_file(BinPath(name), Path(name));
  // copy_file follows the symlink: the copy is the real library under its soname.
  fs::copy_file(std::string(SC_BINARY_DIR) + "/lib/libshardcache.so.0", dir_ / "libshardcache.so.0");
  for (const auto& e : fs::directory_iterator(dir_.path())) {
    fs::permissions(e.path(), fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                                  fs::perms::others_read | fs::perms::others_exec);
  }
}

std::vector<std::string> ProgramsForOtherUsers::As(uid_t uid, gid_t gid, const std::vector<gid_t>& groups,
                                                   const std::string& name,
                                                   const std::vector<std::string>& args) const {
  std::vector<std::string> argv = {"setpriv", "--reuid=" + std::to_string(uid), "--regid=" + std::to_string(gid)};
  if (groups.empty()) {
    argv.push_back("--clear-groups");
  } else {
    std::string list;
    for (gid_t g : groups) list += (list.empty() ? "" : ",") + std::to_string(g);
    argv.push_back("--groups=" + list);
  }
  // LD_LIBRARY_PATH comes before the build tree's RUNPATH.
  argv.insert(argv.end(), {"env", "LD_LIBRARY_PATH=" + dir_.path(), Path(name)});
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

RemovesCreatedIdentities::RemovesCreatedIdentities(const std::vector<std::string>& users,
                                                   const std::vector<std::string>& groups) {
  for (const auto& u : users) {
    if (getpwnam(u.c_str()) == nullptr) users_.push_back(u);
  }
  for (const auto& g : groups) {
    if (getgrnam(g.c_str()) == nullptr) groups_.push_back(g);
  }
}

RemovesCreatedIdentities::~RemovesCreatedIdentities() {
  // Users first: userdel also removes a user's own group.
  for (const auto& u : users_) {
    if (getpwnam(u.c_str()) != nullptr) RunCommand("userdel " + u + " 2>&1");
  }
  for (const auto& g : groups_) {
    if (getgrnam(g.c_str()) != nullptr) RunCommand("groupdel " + g + " 2>&1");
  }
}

std::string ShellCommand(const std::vector<std::string>& argv) {
  std::string out;
  for (const auto& a : argv) {
    std::string quoted = "'";
    for (char c : a) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
    out += (out.empty() ? "" : " ") + quoted + "'";
  }
  return out;
}

}  // namespace shardcache::testing
