// NameThisThread (thread_name.h).
#include "common/thread_name.h"

#include <pthread.h>

#include <array>

namespace shardcache {

void NameThisThread(const std::string& name) {
  pthread_setname_np(pthread_self(), name.substr(0, kMaxThreadNameBytes).c_str());
}

std::string ThisThreadName() {
  std::array<char, kMaxThreadNameBytes + 1> name{};
  if (pthread_getname_np(pthread_self(), name.data(), name.size()) != 0) return "";
  return name.data();
}

}  // namespace shardcache
