// Checkpoint objects on the wire: what both ends of the write path (the node's uploader and
// the receiving ObjectStore) must agree on — which names are valid, how an upload is split into
// parts and named, and how a part is hashed. One owner for the contract of the checkpoint RPCs
// in proto/shardcache/origin.proto (version 3).
//
// An object name is a relative '/'-separated path, e.g. "run7/step1000/rank3.pt". Every
// component is [A-Za-z0-9._-], none is empty or starts with '.' (so "." and ".." are out, and
// the receiver's temp files, which start with '.', never share a name with an object). A name
// is at most kMaxObjectNameBytes, a component at most kMaxComponentBytes (the receiver's temp
// file adds a '.', the upload id and a suffix, and must stay under the file system's 255).
//
// An upload is described by its UploadHeader (name, size, part length, each part's hash) and
// named by UploadId(header): the same bytes uploaded again under the same name are the same
// upload (a resume finds the parts sent before); other bytes are another upload.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"
#include "shardcache/origin.pb.h"

namespace shardcache::checkpoint {

constexpr size_t kMaxObjectNameBytes = 1024;
constexpr size_t kMaxComponentBytes = 200;
// Part lengths a header may choose. 4 MiB keeps one part well inside a gRPC message (64 MiB)
// and a part's read-back buffer small; 64 KiB keeps the header of a large object (16 bytes a
// part) from growing past a message.
constexpr uint32_t kMinPartBytes = 64 << 10;
constexpr uint32_t kMaxPartBytes = 4 << 20;
constexpr uint64_t kMaxObjectBytes = 1ull << 40;  // 1 TiB
constexpr size_t kPartHashBytes = 16;
constexpr size_t kUploadIdChars = 16;
// The part length StatObject reports for a committed object (ReadPart takes any valid one).
constexpr uint32_t kReadPartBytes = kMaxPartBytes;

// OK for a valid object name; InvalidArgument naming the name and what is wrong with it.
Status CheckObjectName(const std::string& name);

// OK when `header` describes a valid upload: a valid name, part_bytes in [kMinPartBytes,
// kMaxPartBytes], size at most kMaxObjectBytes, PartCount(size, part_bytes) hashes of
// kPartHashBytes each (an empty object has none). InvalidArgument naming the field otherwise.
Status CheckUploadHeader(const v1::UploadHeader& header);

// OK for kUploadIdChars lowercase hex digits (what UploadId returns); InvalidArgument otherwise.
// Upload ids name files on the receiver: every id from a request passes here first.
Status CheckUploadId(const std::string& upload_id);

// kUploadIdChars lowercase hex digits of the xxh3-64 of the header's deterministic
// serialization (unknown fields left out, so both ends agree whatever their proto versions).
std::string UploadId(const v1::UploadHeader& header);

// Parts of an object of `size` bytes in parts of `part_bytes`: ceil(size / part_bytes).
// REQUIRES: part_bytes > 0.
inline uint64_t PartCount(uint64_t size, uint32_t part_bytes) { return (size + part_bytes - 1) / part_bytes; }
// Length of part `part`: part_bytes, or what is left for the last one.
// REQUIRES: part < PartCount(size, part_bytes).
inline uint64_t PartLength(uint64_t size, uint32_t part_bytes, uint64_t part) {
  const uint64_t offset = part * part_bytes;
  return size - offset < part_bytes ? size - offset : part_bytes;
}

// A part's hash as it travels in UploadHeader.part_hashes and ObjectPart.hash: the 16-byte
// xxh3-128 of its bytes (common/hash.h, high 64 bits first).
std::string PartHashBytes(const void* data, size_t size);
// The same 16 bytes as 32 hex digits, for messages. REQUIRES: hash.size() == kPartHashBytes.
std::string PartHashHex(const std::string& hash);

}  // namespace shardcache::checkpoint
