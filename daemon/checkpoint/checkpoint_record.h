// CheckpointRecord: what a node daemon knows of one staged checkpoint, persisted in its journal
// (one small file per checkpoint under <checkpoints.dir>/journal, replaced atomically), so that
// uploads survive a restart: a record left `local` or `uploading` is uploaded again, and the
// receiver's BeginUpload then says which parts need not cross the link again.
//
// The file is "key=value" lines (name, size, state, generation, saved_unix_ms, uploaded_unix_ms,
// error); unknown keys are ignored, a record that cannot be parsed is reported and skipped.
//
// Thread safety: plain values; the functions are safe from any thread on distinct records.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace shardcache::checkpoint {

enum class CheckpointState {
  kLocal,      // durable on the node's disk, waiting to upload
  kUploading,  // parts on their way
  kRemote,     // committed at the receiver, every part verified
  kFailed,     // the receiver refused it (why in `error`); kept locally
};
const char* StateName(CheckpointState s);

struct CheckpointRecord {
  std::string name;
  uint64_t size = 0;
  CheckpointState state = CheckpointState::kLocal;
  uint64_t generation = 0;        // bumped by each save under the same name
  int64_t saved_unix_ms = 0;
  int64_t uploaded_unix_ms = 0;   // when it became kRemote
  std::string error;              // the last upload error (kept while retrying)
};

// The journal file of `name` under `journal_dir`.
std::string RecordPath(const std::string& journal_dir, const std::string& name);
Status SaveRecord(const std::string& journal_dir, const CheckpointRecord& r);
Status RemoveRecord(const std::string& journal_dir, const std::string& name);
// Every record in `journal_dir`; unreadable ones are logged and skipped.
std::vector<CheckpointRecord> LoadRecords(const std::string& journal_dir);

}  // namespace shardcache::checkpoint
