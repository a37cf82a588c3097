// Tests of ChunkIndex (chunk_index.h): the in-memory fingerprint → location map and its
// per-segment lists, without disk.
#include <catch2/catch.hpp>

#include <algorithm>

#include "daemon/cache/chunk_index.h"

using namespace shardcache::cache;

namespace {

bool Listed(const ChunkIndex& index, uint32_t segment, uint64_t fp) {
  const auto* v = index.Fingerprints(segment);
  return std::count(v->begin(), v->end(), fp) == 1;
}

}  // namespace

TEST_CASE("chunk index: put, find and contains; a segment without chunks lists none", "[cache][chunk_index]") {
  ChunkIndex index;
  CHECK(index.size() == 0);
  CHECK(!index.Contains(7));
  CHECK(!index.Find(7));
  CHECK(index.Fingerprints(3)->empty());
  CHECK_FALSE(index.Put(7, Loc{3, 100, 4096}));
  CHECK(index.Contains(7));
  REQUIRE(index.Find(7));
  CHECK(*index.Find(7) == Loc{3, 100, 4096});
  CHECK(index.size() == 1);
  CHECK(Listed(index, 3, 7));
}

TEST_CASE("chunk index: a later copy replaces the entry and leaves the old segment's list", "[cache][chunk_index]") {
  ChunkIndex index;
  index.Put(1, Loc{1, 10, 0});
  index.Put(2, Loc{1, 10, 4096});
  CHECK(index.Put(1, Loc{2, 10, 0}));  // replaced
  CHECK(index.size() == 2);
  CHECK(*index.Find(1) == Loc{2, 10, 0});
  CHECK_FALSE(Listed(index, 1, 1));
  CHECK(Listed(index, 1, 2));
  CHECK(Listed(index, 2, 1));
  // The same segment again (a duplicate within one segment at start-up): listed once.
  CHECK(index.Put(1, Loc{2, 10, 8192}));
  CHECK(index.Fingerprints(2)->size() == 1);
}

TEST_CASE("chunk index: drop removes only an entry that still points at the location", "[cache][chunk_index]") {
  ChunkIndex index;
  index.Put(5, Loc{1, 10, 0});
  CHECK_FALSE(index.Drop(5, Loc{1, 10, 4096}));  // another location: replaced meanwhile
  CHECK_FALSE(index.Drop(6, Loc{1, 10, 0}));     // never stored
  CHECK(index.Contains(5));
  CHECK(index.Drop(5, Loc{1, 10, 0}));
  CHECK_FALSE(index.Contains(5));
  CHECK(index.Fingerprints(1)->empty());
  CHECK_FALSE(index.Drop(5, Loc{1, 10, 0}));  // the second drop of a corrupt chunk: no-op
}

TEST_CASE("chunk index: removing a segment drops its entries and no other's", "[cache][chunk_index]") {
  ChunkIndex index;
  for (uint64_t fp = 1; fp <= 10; ++fp) index.Put(fp, Loc{fp % 2 == 0 ? 2u : 1u, 10, fp * 4096});
  index.Put(3, Loc{2, 10, 0});  // moved from segment 1 to 2: survives the removal of 1
  index.RemoveSegment(1);
  CHECK(index.size() == 6);
  for (uint64_t fp : {1, 5, 7, 9}) CHECK_FALSE(index.Contains(fp));
  for (uint64_t fp : {2, 3, 4, 6, 8, 10}) CHECK(index.Contains(fp));
  CHECK(index.Fingerprints(1)->empty());
  CHECK(index.Fingerprints(2)->size() == 6);
  index.RemoveSegment(1);  // gone already
  index.RemoveSegment(2);
  CHECK(index.size() == 0);
}
