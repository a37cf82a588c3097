// Sample fields: the layout in which shardcached describes the parts of each sample of a batch
// (a WebDataset sample's members: "jpg", "cls", ... and its key), so that a trainer can take a
// field as a view into the batch without parsing tar headers.
//
// Written by the daemon into the batch's own arena slot, right after the payload (at the next
// 8-byte boundary), for loaders that ask for fields (local protocol 5) of a tar dataset. The
// batch ring entry says where it is (RingEntry::fields_offset / fields_bytes, both relative to
// the slot; 0 bytes = no table). Everything comes from the shard's sample index (member offsets
// recorded by `shardctl index`), not from the tar headers.
//
//   offset 0                          FieldsHeader (32 bytes)
//   32                                SampleFields[samples]  (16 bytes each)
//   32 + 16*samples                   MemberField[members]   (24 bytes each)
//   32 + 16*samples + 24*members      names: UTF-8 bytes, `names_bytes` of them
//
// Sample i's key is names[key_offset, +key_length); its members are MemberField
// [first_member, +member_count), in tar order; a member's bytes are payload[offset, +length)
// (offset relative to the payload start, inside sample i's own range) and its name (the
// extension: "jpg", "seg.png") is names[name_offset, +name_length).
//
// The client maps the arena read-only and must not trust the table blindly: ParseFields checks
// every count and range against the table's size and the payload.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace shardcache::sample_fields {

inline constexpr uint32_t kMagic = 0x54464353;  // "SCFT", little-endian
inline constexpr uint32_t kLayoutVersion = 1;

struct FieldsHeader {
  uint32_t magic;
  uint32_t layout_version;
  uint32_t samples;
  uint32_t members;
  uint64_t names_bytes;
  uint64_t reserved;
};
static_assert(sizeof(FieldsHeader) == 32);

struct SampleFields {
  uint32_t key_offset;  // in names
  uint32_t key_length;
  uint32_t first_member;
  uint32_t member_count;
};
static_assert(sizeof(SampleFields) == 16);

struct MemberField {
  uint64_t offset;  // from the payload start
  uint64_t length;
  uint32_t name_offset;  // in names
  uint32_t name_length;
};
static_assert(sizeof(MemberField) == 24);

inline constexpr uint64_t TableBytes(uint64_t samples, uint64_t members, uint64_t names_bytes) {
  return sizeof(FieldsHeader) + samples * sizeof(SampleFields) + members * sizeof(MemberField) + names_bytes;
}
// Where the table starts in a slot whose payload is `payload_bytes` long.
inline constexpr uint64_t TableOffset(uint64_t payload_bytes) { return (payload_bytes + 7) / 8 * 8; }

// A checked view of a table. Parse() leaves it invalid (ok() false) and sets `error` when the
// table is inconsistent with itself, with `samples` or with the payload's sample ranges.
class FieldsView {
 public:
  // table: the table's bytes; sample_offsets/lengths: the batch's sample ranges in the payload.
  bool Parse(const uint8_t* table, uint64_t table_bytes, uint64_t samples, const uint64_t* sample_offsets,
             const uint64_t* sample_lengths) {
    ok_ = false;
    if (table_bytes < sizeof(FieldsHeader)) return Fail("field table shorter than its header");
    std::memcpy(&h_, table, sizeof h_);
    if (h_.magic != kMagic || h_.layout_version != kLayoutVersion) return Fail("field table has a bad magic or version");
    if (h_.samples != samples) return Fail("field table describes another number of samples");
    if (TableBytes(h_.samples, h_.members, h_.names_bytes) != table_bytes) return Fail("field table size mismatch");
    samples_ = reinterpret_cast<const SampleFields*>(table + sizeof(FieldsHeader));
    members_ = reinterpret_cast<const MemberField*>(table + sizeof(FieldsHeader) + samples * sizeof(SampleFields));
    names_ = reinterpret_cast<const char*>(members_ + h_.members);
    for (uint64_t i = 0; i < samples; ++i) {
      const SampleFields& s = samples_[i];
      if (uint64_t{s.key_offset} + s.key_length > h_.names_bytes) return Fail("sample key outside the names");
      if (uint64_t{s.first_member} + s.member_count > h_.members) return Fail("sample members outside the table");
      for (uint32_t m = s.first_member; m < s.first_member + s.member_count; ++m) {
        const MemberField& f = members_[m];
        if (uint64_t{f.name_offset} + f.name_length > h_.names_bytes) return Fail("member name outside the names");
        if (f.offset < sample_offsets[i] || f.length > sample_lengths[i] ||
            f.offset - sample_offsets[i] > sample_lengths[i] - f.length) {
          return Fail("member bytes outside their sample");
        }
      }
    }
    ok_ = true;
    return true;
  }

  bool ok() const { return ok_; }
  const char* error() const { return error_; }
  std::string_view key(uint64_t sample) const {
    return {names_ + samples_[sample].key_offset, samples_[sample].key_length};
  }
  uint32_t member_count(uint64_t sample) const { return samples_[sample].member_count; }
  const MemberField& member(uint64_t sample, uint32_t k) const { return members_[samples_[sample].first_member + k]; }
  std::string_view name(const MemberField& m) const { return {names_ + m.name_offset, m.name_length}; }

 private:
  bool Fail(const char* why) {
    error_ = why;
    return false;
  }

  FieldsHeader h_{};
  const SampleFields* samples_ = nullptr;
  const MemberField* members_ = nullptr;
  const char* names_ = nullptr;
  bool ok_ = false;
  const char* error_ = "";
};

}  // namespace shardcache::sample_fields
