#include "daemon/serve/local_checkpoints.h"

#include <sys/stat.h>

#include "daemon/checkpoint/checkpoint_stage.h"

namespace shardcache::serve {

// A client may hold this many checkpoints open at once (each is a file on the node's disk).
constexpr size_t kMaxOpenPerSession = 64;

LocalCheckpoints::~LocalCheckpoints() {
  for (uint64_t h : open_) stage_->Abort(h);
}

Status LocalCheckpoints::Ready() const {
  if (stage_ == nullptr) {
    return FailedPrecondition("this shardcached stages no checkpoints (it has no cache.dir or checkpoints.dir)");
  }
  return Status::Ok();
}

Status LocalCheckpoints::Open(const v1::CheckpointOpenRequest& req, v1::CheckpointOpenResponse* r, UniqueFd* pass) {
  SC_RETURN_IF_ERROR(Ready());
  if (open_.size() >= kMaxOpenPerSession) {
    return ResourceExhausted("this connection has " + std::to_string(open_.size()) +
                             " checkpoints open; commit or abort one first");
  }
  SC_ASSIGN_OR_RETURN(checkpoint::CheckpointStage::Opened opened, stage_->Create(req.name()));
  open_.insert(opened.handle);
  r->set_handle(opened.handle);
  *pass = std::move(opened.fd);
  return Status::Ok();
}

Status LocalCheckpoints::Commit(const v1::CheckpointCommitRequest& req, v1::CheckpointCommitResponse* r) {
  SC_RETURN_IF_ERROR(Ready());
  if (open_.erase(req.handle()) == 0) {
    return NotFound("no checkpoint open on this connection with handle " + std::to_string(req.handle()));
  }
  if (req.abort()) {
    stage_->Abort(req.handle());
    return Status::Ok();
  }
  SC_ASSIGN_OR_RETURN(uint64_t size, stage_->Commit(req.handle()));
  r->set_size(size);
  return Status::Ok();
}

Status LocalCheckpoints::List(const v1::CheckpointStatusRequest& req, v1::CheckpointStatusResponse* r) {
  SC_RETURN_IF_ERROR(Ready());
  for (const checkpoint::CheckpointInfo& i : stage_->List(req.name())) {
    v1::CheckpointInfo* o = r->add_checkpoints();
    o->set_name(i.name);
    o->set_state(i.state);
    o->set_size(i.size);
    o->set_uploaded_bytes(i.uploaded_bytes);
    o->set_upload_bytes_per_s(i.upload_bytes_per_s);
    o->set_eta_s(i.eta_s);
    o->set_local(i.local);
    o->set_error(i.error);
    o->set_saved_unix_ms(i.saved_unix_ms);
  }
  if (!req.name().empty() && r->checkpoints_size() == 0) {
    return NotFound("no checkpoint '" + req.name() + "' was saved through this node");
  }
  return Status::Ok();
}

Status LocalCheckpoints::Read(const v1::CheckpointReadRequest& req, v1::CheckpointReadResponse* r, UniqueFd* pass) {
  SC_RETURN_IF_ERROR(Ready());
  SC_ASSIGN_OR_RETURN(UniqueFd fd, stage_->OpenForRead(req.name()));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "stat of checkpoint '" + req.name() + "'");
  r->set_size(static_cast<uint64_t>(st.st_size));
  *pass = std::move(fd);
  return Status::Ok();
}

}  // namespace shardcache::serve
