// The `tar` shard format: a WebDataset tar archive. Parses ustar headers (with the GNU and
// old-style magic), pax extended headers ('x'; its `path` and `size` records override the
// header's), pax global headers ('g', skipped) and GNU long names ('L'), verifying each
// header's checksum.
//
// WebDataset grouping: a member's key is its path up to the first '.' of its basename and its
// extension the rest ("a/b/x.seg.png" → key "a/b/x", ext "seg.png"). Consecutive regular-file
// members sharing a key form one sample; members without an extension, directories and links
// belong to no sample. A sample's (offset, length) runs from the first header block of its first
// member (including any pax / long-name blocks before it) to the end of its last member's
// 512-byte padded data, so the range is itself a valid tar stream. Per member, the exact data
// offset, length and extension go to member_* fields.
//
// Layout of one 512-byte header block (offsets in bytes, numeric fields octal ASCII, or GNU
// base-256 when the first byte has its high bit set):
//   0 name[100] 100 mode[8] 108 uid[8] 116 gid[8] 124 size[12] 136 mtime[12] 148 chksum[8]
//   156 typeflag 157 linkname[100] 257 magic[6] 263 version[2] 265 uname[32] 297 gname[32]
//   329 devmajor[8] 337 devminor[8] 345 prefix[155] 500 pad[12]
//
// Hostile input never crashes the parser: every size and offset is bounds-checked against the
// source and metadata members ('x', 'g', 'L', 'K') larger than kMaxTarMetaBytes are refused
// rather than allocated.
//
// Thread safety: pure functions over a const ByteSource.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "dataset/byte_source.h"
#include "shardcache/manifest.pb.h"

namespace shardcache::dataset {

constexpr uint64_t kTarBlockBytes = 512;
constexpr uint64_t kMaxTarMetaBytes = 1ull << 20;

// Builds the sample index of one tar shard. DataLoss naming src.name() and the byte offset on a
// bad checksum, a truncated header or member, malformed pax records or numeric fields;
// InvalidArgument for a gzip-compressed file, sparse members and sample member names that are
// not valid UTF-8.
Result<v1::SampleIndex> IndexTarShard(const ByteSource& src);

// Splits a member path into WebDataset key and extension. Returns false when the basename has
// no '.' after at least one character (such members are not part of any sample).
bool SplitWebDatasetKey(const std::string& path, std::string* key, std::string* ext);

}  // namespace shardcache::dataset
