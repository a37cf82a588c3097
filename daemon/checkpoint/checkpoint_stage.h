// CheckpointStage: the node side of checkpoint write-behind. A trainer saves a checkpoint at the
// speed of the node's disk; the long link is paid in the background.
//
//   Create(name)  a new file in <dir>/tmp, opened for writing; its descriptor goes to the trainer
//                 (local.proto passes it with SCM_RIGHTS), which writes the bytes itself — no copy
//                 through the daemon — and fsyncs.
//   Commit        fsync again, rename onto <dir>/objects/<name>, journal record `local`
//                 (checkpoint_record.h), then the trainer's save returns: the checkpoint is
//                 durable on this node. A full disk fails the write or the fsync in the trainer,
//                 or the commit here: a clear error, never a checkpoint reported saved.
//   Abort         (or the trainer's connection ending before Commit) removes the temp file.
//
// One upload thread takes the journal's `local`/`uploading` records oldest first and hands each
// to CheckpointTransfer; a save under the same name meanwhile bumps the generation and the
// running upload of the old bytes stops. Refusals (permission, precondition, invalid name) end
// in `failed` with the reason; transport errors are retried with backoff (the record stays
// `uploading` and shows the last error). A restart finds the journal and resumes.
//
// Reading back: OpenForRead gives the local copy, else downloads the object from the upstream
// into objects/ first (resume on another node). Retention: once uploaded, only the newest
// keep_local saves of a run stay on the node — the run is the name's first component, a save its
// first two ("run7/step1000/rank3.pt": run "run7", save "run7/step1000", with every rank's file
// of that step; "run7/last.pt" is a save of its own).
//
// Thread safety: all methods are safe from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/fs.h"
#include "common/mutex.h"
#include "common/status.h"
#include "daemon/checkpoint/checkpoint_record.h"
#include "daemon/checkpoint/checkpoint_transfer.h"

namespace shardcache::checkpoint {

struct CheckpointStageOptions {
  std::string dir;          // staging root: tmp/, objects/, journal/
  uint32_t keep_local = 2;  // uploaded saves kept per run (see above)
  std::chrono::milliseconds retry_min{500}, retry_max{30000};  // backoff between upload attempts
};

// One checkpoint as shardctl and the client see it.
struct CheckpointInfo {
  std::string name;
  std::string state;             // local | uploading | remote | failed
  uint64_t size = 0;
  uint64_t uploaded_bytes = 0;   // held by the receiver (this upload's progress)
  double upload_bytes_per_s = 0; // while uploading
  double eta_s = 0;              // while uploading; 0 when unknown
  bool local = false;            // a copy is on this node
  std::string error;
  int64_t saved_unix_ms = 0;
};

class CheckpointStage {
 public:
  // `transfer` null: no upstream takes uploads (a file:// upstream): checkpoints stay local and
  // are reported `failed` with `why_not`.
  static Result<std::unique_ptr<CheckpointStage>> Open(CheckpointStageOptions options,
                                                       std::unique_ptr<CheckpointTransfer> transfer,
                                                       std::string why_not = "");
  ~CheckpointStage();

  struct Opened {
    uint64_t handle = 0;
    UniqueFd fd;  // writable, empty
  };
  Result<Opened> Create(const std::string& name);
  // Makes the checkpoint durable under its name and queues its upload; the size saved.
  Result<uint64_t> Commit(uint64_t handle);
  void Abort(uint64_t handle);

  std::vector<CheckpointInfo> List(const std::string& name = "") const;
  // A read-only descriptor of the checkpoint's bytes.
  Result<UniqueFd> OpenForRead(const std::string& name);

 private:
  struct Pending {
    std::string name;
    std::string tmp_path;
    std::chrono::steady_clock::time_point opened;
  };
  CheckpointStage(CheckpointStageOptions options, std::unique_ptr<CheckpointTransfer> transfer, std::string why_not);
  std::string ObjectPath(const std::string& name) const { return options_.dir + "/objects/" + name; }
  std::string JournalDir() const { return options_.dir + "/journal"; }
  void UploadLoop();
  // The next record to upload (oldest saved first), marked uploading; false when stopping.
  bool NextUpload(CheckpointRecord* r);
  void FinishUpload(const CheckpointRecord& r, const Status& s);
  void ApplyRetention(const std::string& run) REQUIRES(mu_);
  CheckpointInfo InfoOf(const CheckpointRecord& r) const REQUIRES(mu_);
  // Journals `r` and updates the pending-bytes gauge.
  void SaveLocked(const CheckpointRecord& r) REQUIRES(mu_);
  void UpdatePendingLocked() REQUIRES(mu_);

  const CheckpointStageOptions options_;
  const std::unique_ptr<CheckpointTransfer> transfer_;
  const std::string why_not_;

  mutable Mutex mu_;
  CondVar cv_;
  std::map<std::string, CheckpointRecord> records_ GUARDED_BY(mu_);
  std::map<uint64_t, Pending> pending_ GUARDED_BY(mu_);
  uint64_t next_handle_ GUARDED_BY(mu_) = 1;
  struct Retry {
    std::chrono::steady_clock::time_point at;
    int failures = 0;
  };
  std::map<std::string, Retry> retry_ GUARDED_BY(mu_);  // records waiting out a backoff
  bool stopping_ GUARDED_BY(mu_) = false;
  // The running upload: its name, start and progress (read by List).
  std::string uploading_ GUARDED_BY(mu_);
  std::chrono::steady_clock::time_point upload_started_ GUARDED_BY(mu_);
  TransferProgress progress_;
  std::atomic<bool> stop_upload_{false};
  std::thread uploader_;
};

}  // namespace shardcache::checkpoint
