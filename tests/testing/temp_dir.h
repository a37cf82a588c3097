// Test doubles and fixtures shared by every test: a temporary directory removed on scope exit.
#pragma once

#include <string>

namespace shardcache::testing {

class TempDir {
 public:
  // Creates a fresh directory under $TMPDIR (or /tmp) named shardcache-test-XXXXXX.
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace shardcache::testing
