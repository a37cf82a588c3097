#include "dataset/utf8.h"

#include <catch2/catch.hpp>

namespace shardcache::dataset {
namespace {

TEST_CASE("UTF-8 validation accepts what protobuf accepts and nothing else", "[dataset][utf8]") {
  CHECK(IsValidUtf8(""));
  CHECK(IsValidUtf8("plain/ascii.txt"));
  CHECK(IsValidUtf8("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"));
  CHECK_FALSE(IsValidUtf8("\xff"));
  CHECK_FALSE(IsValidUtf8("\x80"));              // stray continuation
  CHECK_FALSE(IsValidUtf8("\xc0\xaf"));          // overlong '/'
  CHECK_FALSE(IsValidUtf8("\xe0\x80\xaf"));      // overlong
  CHECK_FALSE(IsValidUtf8("\xed\xa0\x80"));      // surrogate
  CHECK_FALSE(IsValidUtf8("\xf4\x90\x80\x80"));  // above U+10FFFF
  CHECK_FALSE(IsValidUtf8("\xe2\x82"));          // truncated
}

}  // namespace
}  // namespace shardcache::dataset
