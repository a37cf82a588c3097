// FileSource: the origin's view of a directory — verified chunk reads, ranges, and no way out
// of the root.
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>

#include "common/metrics.h"
#include "testing/process.h"
#include "upstream/origin_fixture.h"

using namespace shardcache;
using namespace shardcache::testing;
namespace fs = std::filesystem;

namespace {

struct Collected {
  std::vector<uint64_t> indexes;
  std::string bytes;
};

Status Collect(ChunkSource& src, const DatasetPtr& d, uint32_t shard, uint64_t first, uint64_t count,
               Collected* out) {
  return src.ReadChunks(d, shard, first, count, Within(std::chrono::seconds(10)),
                        [&](uint64_t c, const ChunkPtr& chunk) {
                          out->indexes.push_back(c);
                          out->bytes += ChunkBytes(chunk);
                          return Status::Ok();
                        });
}

std::unique_ptr<upstream::FileSource> OpenRoot(const std::string& root) {
  auto f = upstream::FileSource::Open(root);
  REQUIRE(f.ok());
  return std::move(*f);
}

}  // namespace

TEST_CASE("file source reads chunk ranges exactly as the files hold them", "[file_source]") {
  TempDir root;
  auto d = MakeRecordsDataset(root.path(), "recs", 2, 40, 4096, 64 << 10);
  REQUIRE(d.ok());
  auto src = OpenRoot(root.path());
  auto opened = src->OpenDataset("recs");
  REQUIRE(opened.ok());
  CHECK((*opened)->version == (*d)->version);
  const std::string shard1 = root / "recs/shard-00001.bin";

  SECTION("first chunk") {
    Collected c;
    REQUIRE(Collect(*src, *opened, 1, 0, 1, &c).ok());
    CHECK(c.indexes == std::vector<uint64_t>{0});
    CHECK(c.bytes == FileBytes(shard1, 0, 65536));
  }
  SECTION("middle chunk") {
    Collected c;
    REQUIRE(Collect(*src, *opened, 1, 1, 1, &c).ok());
    CHECK(c.bytes == FileBytes(shard1, 65536, 65536));
  }
  SECTION("last, partial chunk") {
    Collected c;
    REQUIRE(Collect(*src, *opened, 1, 2, 1, &c).ok());
    CHECK(c.bytes.size() == 40 * 4096 - 2 * 65536);
    CHECK(c.bytes == FileBytes(shard1, 2 * 65536, 40 * 4096 - 2 * 65536));
  }
  SECTION("whole shard in order") {
    Collected c;
    REQUIRE(Collect(*src, *opened, 1, 0, 3, &c).ok());
    CHECK(c.indexes == std::vector<uint64_t>{0, 1, 2});
    CHECK(c.bytes == FileBytes(shard1, 0, 40 * 4096));
  }
  SECTION("ranges outside the shard are InvalidArgument") {
    Collected c;
    CHECK(Collect(*src, *opened, 1, 3, 1, &c).code() == StatusCode::kInvalidArgument);
    CHECK(Collect(*src, *opened, 1, 2, 2, &c).code() == StatusCode::kInvalidArgument);
    CHECK(Collect(*src, *opened, 1, 0, 0, &c).code() == StatusCode::kInvalidArgument);
    CHECK(Collect(*src, *opened, 7, 0, 1, &c).code() == StatusCode::kInvalidArgument);
    CHECK(c.indexes.empty());
  }
  SECTION("sample indexes come back verified") {
    auto idx = src->GetSampleIndex(*opened, 0);
    REQUIRE(idx.ok());
    CHECK(*idx == *ReadFileToString(dataset::SampleIndexPath(root / "recs", 0)));
    CHECK(src->GetSampleIndex(*opened, 2).status().code() == StatusCode::kInvalidArgument);
  }
  SECTION("list shows the dataset") {
    auto l = src->ListDatasets();
    REQUIRE(l.ok());
    REQUIRE(l->size() == 1);
    CHECK((*l)[0].name() == "recs");
    CHECK((*l)[0].shard_count() == 2);
  }
}

TEST_CASE("file source refuses names and links that leave the root", "[file_source][security]") {
  TempDir root, outside;
  REQUIRE(MakeRecordsDataset(root.path(), "recs", 1, 4, 4096, 4096).ok());
  REQUIRE(MakeRecordsDataset(outside.path(), "secret", 1, 4, 4096, 4096).ok());
  REQUIRE(MakeRecordsDataset(outside.path(), "sneaky", 1, 4, 4096, 4096).ok());
  auto src = OpenRoot(root.path());

  SECTION("unknown dataset is NotFound") {
    CHECK(src->OpenDataset("nope").status().code() == StatusCode::kNotFound);
  }
  SECTION("names that are not directories below the root are InvalidArgument") {
    for (const char* n : {"..", "../secret", "/etc", "/", ".shardcache", "", "recs/../recs",
                          "a/../../etc", "recs/", "a//recs", "recs/.shardcache", "a\\b"}) {
      INFO(n);
      CHECK(src->OpenDataset(n).status().code() == StatusCode::kInvalidArgument);
    }
  }
  SECTION("an unknown nested name is NotFound") {
    CHECK(src->OpenDataset("a/b").status().code() == StatusCode::kNotFound);
  }
  SECTION("a nested name through a symlink out of the root") {
    fs::create_directory_symlink(outside.path(), root / "elsewhere");
    auto r = src->OpenDataset("elsewhere/secret");
    CHECK(r.status().code() == StatusCode::kPermissionDenied);
    CHECK_THAT(r.status().message(), Catch::Contains("outside"));
  }
  SECTION("a dataset directory that is a symlink out of the root") {
    fs::create_directory_symlink(outside / "secret", root / "secret");
    auto r = src->OpenDataset("secret");
    CHECK(r.status().code() == StatusCode::kPermissionDenied);
    CHECK_THAT(r.status().message(), Catch::Contains("outside"));
  }
  SECTION("a shard file that is a symlink out of the root") {
    fs::copy(outside / "sneaky", root / "sneaky", fs::copy_options::recursive);
    fs::remove(root / "sneaky/shard-00000.bin");
    fs::create_symlink(outside / "sneaky/shard-00000.bin", root / "sneaky/shard-00000.bin");
    CHECK(src->OpenDataset("sneaky").status().code() == StatusCode::kPermissionDenied);
  }
  SECTION("a manifest directory that is a symlink out of the root") {
    fs::create_directory(root / "sneaky");
    fs::copy(outside / "sneaky/shard-00000.bin", root / "sneaky/shard-00000.bin");
    fs::create_directory_symlink(outside / "sneaky/.shardcache", root / "sneaky/.shardcache");
    CHECK(src->OpenDataset("sneaky").status().code() == StatusCode::kPermissionDenied);
  }
  SECTION("a symlink that stays inside the root is fine") {
    fs::create_directory(root / "real");
    REQUIRE(MakeRecordsDataset(root / "real", "inner", 1, 4, 4096, 4096).ok());
    fs::create_directory_symlink(root / "real/inner", root / "inner");
    CHECK(src->OpenDataset("inner").ok());
  }
  SECTION("listing skips what it may not open") {
    fs::create_directory_symlink(outside / "secret", root / "secret");
    auto l = src->ListDatasets();
    REQUIRE(l.ok());
    REQUIRE(l->size() == 1);
    CHECK((*l)[0].name() == "recs");
  }
}

TEST_CASE("a nested name is the dataset in that directory below the root", "[file_source][names]") {
  TempDir root;
  auto train = MakeRecordsDataset(root.path(), "laion/train", 2, 40, 4096, 64 << 10);
  REQUIRE(train.ok());
  REQUIRE(MakeRecordsDataset(root.path(), "laion/val", 1, 4, 4096, 4096, 2).ok());
  REQUIRE(MakeRecordsDataset(root / "a/b", "c", 1, 4, 4096, 4096, 3).ok());  // indexed as 'c'
  REQUIRE(MakeRecordsDataset(root.path(), "top", 1, 4, 4096, 4096, 4).ok());
  REQUIRE(MakeDirs(root / "raw/images").ok());  // no dataset anywhere below
  auto src = OpenRoot(root.path());

  auto d = src->OpenDataset("laion/train");
  REQUIRE(d.ok());
  CHECK((*d)->name == "laion/train");
  CHECK((*d)->version == (*train)->version);
  Collected c;
  REQUIRE(Collect(*src, *d, 1, 0, 3, &c).ok());
  CHECK(c.bytes == FileBytes(root / "laion/train/shard-00001.bin", 0, 40 * 4096));
  auto idx = src->GetSampleIndex(*d, 1);
  REQUIRE(idx.ok());
  CHECK(*idx == *ReadFileToString(dataset::SampleIndexPath(root / "laion/train", 1)));

  auto abc = src->OpenDataset("a/b/c");
  REQUIRE(abc.ok());
  CHECK((*abc)->name == "a/b/c");
  CHECK((*abc)->manifest.name() == "c");
  CHECK(src->OpenDataset("laion").status().code() == StatusCode::kNotFound);

  auto l = src->ListDatasets();
  REQUIRE(l.ok());
  std::vector<std::string> names;
  for (const auto& s : *l) names.push_back(s.name());
  CHECK(names == std::vector<std::string>{"a/b/c", "laion/train", "laion/val", "top"});
}

TEST_CASE("a dataset whose manifest was indexed under another name is served under its path",
          "[file_source][names]") {
  TempDir root;
  auto made = MakeRecordsDataset(root.path(), "before", 1, 8, 4096, 4096);
  REQUIRE(made.ok());
  fs::rename(root / "before", root / "after");  // renamed after indexing
  auto src = OpenRoot(root.path());
  auto d = src->OpenDataset("after");
  REQUIRE(d.ok());  // the old code refused it (FailedPrecondition) under either name
  CHECK((*d)->name == "after");
  CHECK((*d)->manifest.name() == "before");
  CHECK((*d)->version == (*made)->version);
  Collected c;
  CHECK(Collect(*src, *d, 0, 0, 8, &c).ok());
  CHECK(src->OpenDataset("before").status().code() == StatusCode::kNotFound);
}

TEST_CASE("a corrupt byte in a shard is DataLoss naming file, chunk and offset, never served",
          "[file_source][integrity]") {
  TempDir root;
  REQUIRE(MakeRecordsDataset(root.path(), "recs", 1, 40, 4096, 64 << 10).ok());
  auto src = OpenRoot(root.path());
  auto d = src->OpenDataset("recs");
  REQUIRE(d.ok());
  {
    UniqueFd fd(::open((root / "recs/shard-00000.bin").c_str(), O_RDWR));
    char x = 0;
    REQUIRE(::pread(fd.get(), &x, 1, 65536 + 100) == 1);
    x = static_cast<char>(x ^ 0xff);
    REQUIRE(::pwrite(fd.get(), &x, 1, 65536 + 100) == 1);
  }
  auto* failures = metrics::Registry::Global().GetCounter("shardcache_origin_checksum_failures_total", "");
  const uint64_t before = failures->Value();
  Collected c;
  Status s = Collect(*src, *d, 0, 0, 3, &c);
  CHECK(s.code() == StatusCode::kDataLoss);
  CHECK_THAT(s.message(), Catch::Contains("shard-00000.bin") && Catch::Contains("chunk 1") &&
                              Catch::Contains("offset 65536"));
  CHECK(c.indexes == std::vector<uint64_t>{0});  // chunk 0 was fine; chunk 1 never delivered
  CHECK(failures->Value() == before + 1);
}

TEST_CASE("a shard whose size changed is refused with its path", "[file_source][integrity]") {
  TempDir root;
  REQUIRE(MakeRecordsDataset(root.path(), "recs", 1, 40, 4096, 64 << 10).ok());
  auto src = OpenRoot(root.path());
  auto d = src->OpenDataset("recs");
  REQUIRE(d.ok());
  REQUIRE(::truncate((root / "recs/shard-00000.bin").c_str(), 1000) == 0);
  Collected c;
  Status s = Collect(*src, *d, 0, 0, 1, &c);
  CHECK(s.code() == StatusCode::kDataLoss);
  CHECK_THAT(s.message(), Catch::Contains("shard-00000.bin"));
}

TEST_CASE("a re-indexed dataset is picked up as a new version", "[file_source]") {
  TempDir root;
  auto first = MakeRecordsDataset(root.path(), "recs", 1, 40, 4096, 64 << 10);
  REQUIRE(first.ok());
  auto src = OpenRoot(root.path());
  auto a = src->OpenDataset("recs");
  REQUIRE(a.ok());
  CHECK(src->OpenDataset("recs")->get() == a->get());  // cached
  auto second = MakeRecordsDataset(root.path(), "recs", 1, 40, 4096, 32 << 10);
  REQUIRE(second.ok());
  auto b = src->OpenDataset("recs");
  REQUIRE(b.ok());
  CHECK((*b)->version == (*second)->version);
  CHECK((*b)->version != (*a)->version);
}

TEST_CASE("block ranges without stored tables: the first reads its chunk whole, later ones only their blocks, each verified",
          "[file_source][blocks][integrity]") {
  TempDir root;
  REQUIRE(MakeRecordsDataset(root.path(), "recs", 1, 40, 4096, 64 << 10).ok());
  fs::remove_all(root / "recs/.shardcache/blocks");  // as indexed before block tables were stored
  auto src = OpenRoot(root.path());
  auto d = src->OpenDataset("recs");
  REQUIRE(d.ok());
  const std::string path = root / "recs/shard-00000.bin";
  const std::string chunk1 = FileBytes(path, 65536, 65536);
  auto* read_bytes = metrics::Registry::Global().GetCounter("shardcache_file_read_bytes_total", "");
  auto* failures = metrics::Registry::Global().GetCounter("shardcache_origin_checksum_failures_total", "");
  auto range_bytes = [](const BlockRange& r) {
    return std::string(reinterpret_cast<const char*>(r.bytes->bytes.data()) + r.offset, r.size);
  };

  uint64_t before = read_bytes->Value();
  auto first = src->ReadBlocks(*d, 0, 1, 1, 1, /*want_table=*/true, Within(std::chrono::seconds(10)));
  REQUIRE(first.ok());
  CHECK(range_bytes(*first) == chunk1.substr(16384, 16384));
  CHECK(first->table == BlockTable(chunk1.data(), chunk1.size()));
  CHECK(read_bytes->Value() - before == 65536);  // whole, to learn the table

  before = read_bytes->Value();
  auto later = src->ReadBlocks(*d, 0, 1, 2, 2, /*want_table=*/false, Within(std::chrono::seconds(10)));
  REQUIRE(later.ok());
  CHECK(range_bytes(*later) == chunk1.substr(32768, 32768));
  CHECK(later->table.empty());
  CHECK(read_bytes->Value() - before == 32768);  // only the two blocks

  SECTION("a byte changed on disk after the table was learned is DataLoss naming the block") {
    {
      UniqueFd fd(::open(path.c_str(), O_RDWR));
      char x = 0;
      REQUIRE(::pread(fd.get(), &x, 1, 65536 + 3 * 16384 + 7) == 1);
      x = static_cast<char>(x ^ 0xff);
      REQUIRE(::pwrite(fd.get(), &x, 1, 65536 + 3 * 16384 + 7) == 1);
    }
    const uint64_t failed = failures->Value();
    auto bad = src->ReadBlocks(*d, 0, 1, 2, 2, false, Within(std::chrono::seconds(10)));
    CHECK(bad.status().code() == StatusCode::kDataLoss);
    CHECK_THAT(bad.status().message(), Catch::Contains("shard-00000.bin") && Catch::Contains("chunk 1") &&
                                           Catch::Contains("block 3"));
    CHECK(failures->Value() == failed + 1);
    // Block 2 alone is still good.
    auto good = src->ReadBlocks(*d, 0, 1, 2, 1, false, Within(std::chrono::seconds(10)));
    REQUIRE(good.ok());
    CHECK(range_bytes(*good) == chunk1.substr(32768, 16384));
  }
}

TEST_CASE("block ranges use the block tables the indexer stored: the first range reads only its blocks",
          "[file_source][blocks][integrity]") {
  TempDir root;
  REQUIRE(MakeRecordsDataset(root.path(), "recs", 1, 40, 4096, 64 << 10).ok());
  const std::string path = root / "recs/shard-00000.bin";
  const std::string tables = root / "recs/.shardcache/blocks/0.bin";
  const std::string chunk1 = FileBytes(path, 65536, 65536);
  auto* read_bytes = metrics::Registry::Global().GetCounter("shardcache_file_read_bytes_total", "");
  auto range_bytes = [](const BlockRange& r) {
    return std::string(reinterpret_cast<const char*>(r.bytes->bytes.data()) + r.offset, r.size);
  };

  // Block 1 of chunk 1 through a fresh source (no table remembered): the bytes read from disk.
  auto read_block = [&](bool want_table) {
    auto src = OpenRoot(root.path());
    auto d = src->OpenDataset("recs");
    REQUIRE(d.ok());
    const uint64_t before = read_bytes->Value();
    auto r = src->ReadBlocks(*d, 0, 1, 1, 1, want_table, Within(std::chrono::seconds(10)));
    REQUIRE(r.ok());
    CHECK(range_bytes(*r) == chunk1.substr(16384, 16384));
    if (want_table) CHECK(r->table == BlockTable(chunk1.data(), chunk1.size()));
    return read_bytes->Value() - before;
  };

  SECTION("a stored table that matches the manifest is used") {
    CHECK(read_block(/*want_table=*/true) == 16384);  // the block alone
    // The last, partial chunk's table sits at its stride like the others.
    auto src = OpenRoot(root.path());
    auto d = src->OpenDataset("recs");
    REQUIRE(d.ok());
    auto last = src->ReadBlocks(*d, 0, 2, 0, 2, /*want_table=*/true, Within(std::chrono::seconds(10)));
    REQUIRE(last.ok());
    const std::string chunk2 = FileBytes(path, 2 * 65536, 40 * 4096 - 2 * 65536);
    CHECK(range_bytes(*last) == chunk2);
    CHECK(last->table == BlockTable(chunk2.data(), chunk2.size()));
  }
  SECTION("a stored table that disagrees with the manifest is ignored: the chunk is read and hashed") {
    {
      UniqueFd fd(::open(tables.c_str(), O_RDWR));
      const char x = 0x5a;
      REQUIRE(::pwrite(fd.get(), &x, 1, dataset::BlockTableStride(65536) + 3) == 1);  // chunk 1's table
    }
    CHECK(read_block(/*want_table=*/true) == 65536);  // whole, as without a stored table
  }
  SECTION("a truncated tables file is ignored as well") {
    REQUIRE(::truncate(tables.c_str(), 100) == 0);
    CHECK(read_block(/*want_table=*/false) == 65536);
  }
}
