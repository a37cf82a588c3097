// LocalCheckpoints: the checkpoint requests of one local session (local.proto version 6),
// answered from the daemon's CheckpointStage (daemon/checkpoint/checkpoint_stage.h).
//
// The session keeps the handles its client opened; a client that goes (cleanly or by crashing)
// before CheckpointCommit leaves nothing behind: the destructor aborts them, removing their
// files. A descriptor to pass with an answer is handed out in *pass and must stay open until the
// answer is sent.
//
// Thread safety: one session thread.
#pragma once

#include <set>

#include "common/fs.h"
#include "common/status.h"
#include "shardcache/local.pb.h"

namespace shardcache::checkpoint {
class CheckpointStage;
}

namespace shardcache::serve {

class LocalCheckpoints {
 public:
  // `stage` null: the daemon has no checkpoint staging (every request is FailedPrecondition).
  explicit LocalCheckpoints(checkpoint::CheckpointStage* stage) : stage_(stage) {}
  ~LocalCheckpoints();
  LocalCheckpoints(const LocalCheckpoints&) = delete;
  LocalCheckpoints& operator=(const LocalCheckpoints&) = delete;

  Status Open(const v1::CheckpointOpenRequest& req, v1::CheckpointOpenResponse* r, UniqueFd* pass);
  Status Commit(const v1::CheckpointCommitRequest& req, v1::CheckpointCommitResponse* r);
  Status List(const v1::CheckpointStatusRequest& req, v1::CheckpointStatusResponse* r);
  Status Read(const v1::CheckpointReadRequest& req, v1::CheckpointReadResponse* r, UniqueFd* pass);

 private:
  Status Ready() const;

  checkpoint::CheckpointStage* const stage_;
  std::set<uint64_t> open_;  // handles opened, not yet committed or aborted
};

}  // namespace shardcache::serve
