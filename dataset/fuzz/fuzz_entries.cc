#include "dataset/fuzz/fuzz_entries.h"

#include <cstring>
#include <string_view>

#include "dataset/byte_source.h"
#include "dataset/manifest.h"
#include "dataset/megatron_format.h"
#include "dataset/tar_format.h"

namespace shardcache::dataset::fuzz {

Status FuzzTar(const uint8_t* data, size_t size) {
  MemoryByteSource src(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.tar");
  auto r = IndexTarShard(src);
  if (!r.ok()) return r.status();
  // Every range the parser reports must lie inside the input.
  for (int i = 0; i < r->offsets_size(); ++i) {
    if (r->offsets(i) > size || r->lengths(i) > size - r->offsets(i)) {
      return Internal("sample outside the input");
    }
  }
  for (int i = 0; i < r->member_offset_size(); ++i) {
    if (r->member_offset(i) > size || r->member_length(i) > size - r->member_offset(i) ||
        r->member_sample(i) >= static_cast<uint32_t>(r->offsets_size())) {
      return Internal("member outside the input");
    }
  }
  return Status::Ok();
}

Status FuzzMegatronIdx(const uint8_t* data, size_t size) {
  auto r = ParseMegatronIndex(std::string_view(reinterpret_cast<const char*>(data), size),
                              "fuzz.idx", kFuzzBinBytes, "fuzz.bin");
  if (!r.ok()) return r.status();
  for (int i = 0; i < r->samples.offsets_size(); ++i) {
    if (r->samples.offsets(i) + r->samples.lengths(i) > kFuzzBinBytes) {
      return Internal("sequence outside the .bin");
    }
  }
  return Status::Ok();
}

Status FuzzManifest(const uint8_t* data, size_t size) {
  if (size < 4) return InvalidArgument("short input");
  uint32_t n = 0;
  std::memcpy(&n, data, 4);
  if (n > size - 4) n = static_cast<uint32_t>(size - 4);
  const std::string_view manifest(reinterpret_cast<const char*>(data) + 4, n);
  const std::string_view samples(reinterpret_cast<const char*>(data) + 4 + n, size - 4 - n);
  auto m = ParseManifest(manifest, "fuzz manifest");
  if (!m.ok()) return m.status();
  // Chunk math on every shard: lengths must add up to the shard size.
  for (int s = 0; s < m->shards_size(); ++s) {
    const uint64_t chunks = ChunkCount(*m, static_cast<uint32_t>(s));
    uint64_t total = 0;
    for (uint64_t c = 0; c < chunks; ++c) {
      total += ChunkLength(*m, static_cast<uint32_t>(s), c);
      (void)ChunkHash(*m, static_cast<uint32_t>(s), c);
    }
    if (total != m->shards(s).size_bytes()) return Internal("chunk lengths do not add up");
  }
  return ParseSampleIndex(samples, *m, 0, "fuzz sample index").status();
}

}  // namespace shardcache::dataset::fuzz
