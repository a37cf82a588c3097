// Dataset names: nested names are directories below the upstream root, and nothing a name can
// spell leads out of it or into a dataset's metadata.
#include "dataset/dataset_name.h"

#include <catch2/catch.hpp>

#include <string>
#include <vector>

namespace shardcache::dataset {
namespace {

TEST_CASE("plain and nested dataset names are accepted", "[dataset][names]") {
  for (const std::string& n : std::vector<std::string>{"tokens-v3", "laion/train", "a/b/c", "v1.2/train", "caf\xc3\xa9/x",
                              "a b/c", std::string(255, 'x') + "/y"}) {
    INFO(n);
    CHECK(CheckDatasetName(n).ok());
  }
}

TEST_CASE("names that could leave the root or are not directories are refused, naming the name and the problem",
          "[dataset][names][security]") {
  struct Case {
    std::string name, problem;
  };
  const Case cases[] = {
      {"", "empty"},
      {"/etc", "starts with '/'"},
      {"laion/", "ends with '/'"},
      {"laion//train", "'//'"},
      {"..", "'..'"},
      {"a/../../etc", "component starting with '.' ('..'"},
      {"laion/./train", "('.'"},
      {".shardcache", "'.shardcache'"},
      {"laion/.shardcache", "'.shardcache'"},
      {"a\\b", "backslash"},
      {std::string("a\0b", 3), "control character"},
      {"a\nb", "control character"},
      {"bad\xff", "UTF-8"},
      {std::string(256, 'x'), "longer than 255"},
      {std::string(1025, 'x'), "longer than 1024"},
      {"a/b/c/d/e/f/g/h/i/j/k/l/m/n/o/p/q", "more than 16 components"},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    Status s = CheckDatasetName(c.name);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(s.message(), Catch::Contains(c.problem));
    if (c.name.size() < 64 && c.name.find('\0') == std::string::npos) {
      CHECK_THAT(s.message(), Catch::Contains("'" + c.name + "'"));
    }
  }
}

TEST_CASE("a name is a tail of a path when it equals its last components", "[dataset][names]") {
  CHECK(NameIsTailOf("train", "/srv/data/laion/train"));
  CHECK(NameIsTailOf("laion/train", "/srv/data/laion/train"));
  CHECK(NameIsTailOf("laion/train", "/srv/data/laion/train/"));
  CHECK(NameIsTailOf("srv/data/laion/train", "/srv/data/laion/train"));
  CHECK_FALSE(NameIsTailOf("rain", "/srv/data/laion/train"));
  CHECK_FALSE(NameIsTailOf("bar", "/srv/data/laion/train"));
  CHECK_FALSE(NameIsTailOf("data/train", "/srv/data/laion/train"));
  CHECK_FALSE(NameIsTailOf("", "/srv/data/laion/train"));
}

}  // namespace
}  // namespace shardcache::dataset
