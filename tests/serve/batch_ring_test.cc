// The batch ring (proto/shardcache/batch_ring.h): the daemon's writer and the client's reader
// over a real sealed memfd — entries round-trip, and a reader that fell behind, an entry being
// written, a sample outside its payload or an inconsistent ring are each refused by name.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <new>
#include <string>
#include <vector>

#include "shardcache/batch_ring.h"

using namespace shardcache;
using batch_ring::BatchDescription;
using batch_ring::RingReader;
using batch_ring::RingWriter;

namespace {

std::unique_ptr<RingWriter> Writer(uint32_t entries, uint32_t samples) {
  auto w = RingWriter::Create(entries, samples);
  REQUIRE(w.ok());
  return std::move(*w);
}

RingReader Reader(const RingWriter& w, uint32_t min_samples) {
  auto r = RingReader::Map(dup(w.fd()), w.bytes(), w.entries(), min_samples);
  REQUIRE(r.ok());
  return std::move(*r);
}

// Publishes batch `seq` of `n` samples of 100 bytes each (ids seq*1000 + k).
void PublishBatch(RingWriter& w, uint64_t seq, uint32_t n) {
  std::vector<uint64_t> ids, offsets, lengths;
  for (uint32_t k = 0; k < n; ++k) {
    ids.push_back(seq * 1000 + k);
    offsets.push_back(k * 100);
    lengths.push_back(100);
  }
  w.Publish({.slot = static_cast<uint32_t>(seq % 7), .payload_bytes = n * 100ull, .batch_seq = seq,
             .rank_consumed = (seq + 1) * n, .fields_offset = 0, .fields_bytes = 0},
            ids, offsets, lengths);
}

}  // namespace

TEST_CASE("batch ring: entries published by the writer are read back exactly, in order") {
  auto w = Writer(4, 8);
  RingReader r = Reader(*w, 8);
  CHECK(r.published() == 0);
  BatchDescription e;
  for (uint64_t i = 0; i < 10; ++i) {
    PublishBatch(*w, i, 1 + static_cast<uint32_t>(i % 8));
    REQUIRE(r.published() == i + 1);
    REQUIRE(r.Read(i, &e).ok());
    CHECK(e.slot == i % 7);
    CHECK(e.batch_seq == i);
    CHECK(e.rank_consumed == (i + 1) * (1 + i % 8));
    REQUIRE(e.ids.size() == 1 + i % 8);
    for (size_t k = 0; k < e.ids.size(); ++k) {
      CHECK(e.ids[k] == i * 1000 + k);
      CHECK(e.offsets[k] == k * 100);
      CHECK(e.lengths[k] == 100);
    }
  }
}

TEST_CASE("batch ring: the reader refuses an entry not yet published, overwritten, or being written") {
  auto w = Writer(2, 4);
  RingReader r = Reader(*w, 4);
  BatchDescription e;
  Status s = r.Read(0, &e);
  CHECK(s.code() == StatusCode::kDataLoss);
  CHECK(s.message().find("not published") != std::string::npos);
  for (uint64_t i = 0; i < 3; ++i) PublishBatch(*w, i, 4);
  s = r.Read(0, &e);  // its place now holds entry 2
  CHECK(s.code() == StatusCode::kDataLoss);
  CHECK(s.message().find("overwritten") != std::string::npos);
  REQUIRE(r.Read(2, &e).ok());

}

TEST_CASE("batch ring: an entry caught while the daemon writes it is not used") {
  // A ring laid out by hand (the writer's own mapping is the only writable one): entry 0 is
  // published but its index says kWriting, as while the daemon rewrites it.
  const uint64_t bytes = batch_ring::RingBytes(2, 4);
  const int fd = memfd_create("test-ring", MFD_CLOEXEC);
  REQUIRE(fd >= 0);
  REQUIRE(ftruncate(fd, static_cast<off_t>(bytes)) == 0);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  REQUIRE(p != MAP_FAILED);
  auto* base = static_cast<uint8_t*>(p);
  auto* h = new (base) batch_ring::RingHeader{};
  h->magic = batch_ring::kMagic;
  h->layout_version = batch_ring::kLayoutVersion;
  h->entries = 2;
  h->max_samples = 4;
  h->stride = batch_ring::Stride(4);
  auto* entry = new (base + batch_ring::EntryOffset(0, 2, h->stride)) batch_ring::RingEntry{};
  entry->index.store(batch_ring::kWriting);
  h->published.store(1);
  auto r = RingReader::Map(fd, bytes, 2, 4);
  REQUIRE(r.ok());
  BatchDescription e;
  Status s = r->Read(0, &e);
  CHECK(s.code() == StatusCode::kDataLoss);
  CHECK(s.message().find("not there") != std::string::npos);
  entry->index.store(0);  // complete now
  CHECK(r->Read(0, &e).ok());
  munmap(p, bytes);
}

TEST_CASE("batch ring: a sample outside its batch's payload is refused") {
  auto w = Writer(2, 2);
  RingReader r = Reader(*w, 2);
  const std::vector<uint64_t> ids{1, 2}, offsets{0, 150}, lengths{100, 100};
  w->Publish({.slot = 0, .payload_bytes = 200, .batch_seq = 0, .rank_consumed = 2, .fields_offset = 0,
              .fields_bytes = 0},
             ids, offsets, lengths);
  BatchDescription e;
  const Status s = r.Read(0, &e);
  CHECK(s.code() == StatusCode::kDataLoss);
  CHECK(s.message().find("outside its batch") != std::string::npos);
}

TEST_CASE("batch ring: Map refuses a missing, short or mismatched ring") {
  auto w = Writer(4, 8);
  auto missing = RingReader::Map(-1, w->bytes(), 4, 8);
  CHECK(missing.status().code() == StatusCode::kDataLoss);
  auto longer = RingReader::Map(dup(w->fd()), w->bytes() * 2, 4, 8);  // the file is shorter
  CHECK(longer.status().code() == StatusCode::kDataLoss);
  auto other_entries = RingReader::Map(dup(w->fd()), w->bytes(), 5, 8);
  CHECK(other_entries.status().code() == StatusCode::kDataLoss);
  auto larger_batches = RingReader::Map(dup(w->fd()), w->bytes(), 4, 9);
  CHECK(larger_batches.status().code() == StatusCode::kDataLoss);
  CHECK(RingWriter::Create(0, 8).status().code() == StatusCode::kInvalidArgument);
  CHECK(RingWriter::Create(1u << 20, 1u << 20).status().code() == StatusCode::kInvalidArgument);
}
