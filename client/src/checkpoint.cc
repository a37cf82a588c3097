// Checkpoints through the node's daemon (local.proto version 6): CheckpointWriter and the
// Client calls that save, list, wait for and read back checkpoints.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <thread>

#include "client/src/connection.h"
#include "shardcache/client.h"
#include "shardcache/local.pb.h"

namespace shardcache {

using client_internal::Connection;

CheckpointWriter::~CheckpointWriter() { Abort(); }

Status CheckpointWriter::Write(const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (size > 0) {
    if (fd_ < 0) return FailedPrecondition("checkpoint '" + name_ + "' is closed");
    const ssize_t n = ::write(fd_, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus(errno, "writing checkpoint '" + name_ + "' on the node's disk");
    p += n;
    size -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

Result<uint64_t> CheckpointWriter::Close() {
  if (fd_ < 0) return FailedPrecondition("checkpoint '" + name_ + "' is closed");
  if (::fsync(fd_) != 0) {
    const Status s = ErrnoStatus(errno, "fsync of checkpoint '" + name_ + "' on the node's disk");
    Abort();
    return s;
  }
  ::close(fd_);
  fd_ = -1;
  v1::LocalRequest req;
  req.mutable_checkpoint_commit()->set_handle(handle_);
  v1::LocalResponse resp;
  SC_RETURN_IF_ERROR(conn_->Call(req, &resp));
  conn_.reset();
  return resp.checkpoint_commit().size();
}

void CheckpointWriter::Abort() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (conn_ == nullptr) return;
  v1::LocalRequest req;
  req.mutable_checkpoint_commit()->set_handle(handle_);
  req.mutable_checkpoint_commit()->set_abort(true);
  v1::LocalResponse resp;
  (void)conn_->Call(req, &resp);  // a lost connection dropped the file already
  conn_.reset();
}

Result<std::unique_ptr<CheckpointWriter>> Client::Checkpoint(const std::string& name) {
  v1::LocalRequest req;
  req.mutable_checkpoint_open()->set_name(name);
  v1::LocalResponse resp;
  int fd = -1;
  std::shared_ptr<Connection> conn;
  SC_RETURN_IF_ERROR(session_->Call(req, &resp, &fd, &conn));
  if (fd < 0) return Internal("the daemon opened checkpoint '" + name + "' but passed no descriptor");
  return std::unique_ptr<CheckpointWriter>(new CheckpointWriter(conn, name, resp.checkpoint_open().handle(), fd));
}

Result<std::vector<CheckpointState>> Client::Checkpoints(const std::string& name) {
  v1::LocalRequest req;
  req.mutable_checkpoint_status()->set_name(name);
  v1::LocalResponse resp;
  SC_RETURN_IF_ERROR(session_->Call(req, &resp));
  std::vector<CheckpointState> out;
  for (const v1::CheckpointInfo& i : resp.checkpoint_status().checkpoints()) {
    out.push_back(CheckpointState{i.name(), i.state(), i.size(), i.uploaded_bytes(), i.upload_bytes_per_s(),
                                  i.eta_s(), i.local(), i.error()});
  }
  return out;
}

Status Client::WaitUploaded(const std::string& name, uint32_t timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    SC_ASSIGN_OR_RETURN(std::vector<CheckpointState> states, Checkpoints(name));
    const CheckpointState& c = states.at(0);
    if (c.state == "remote") return Status::Ok();
    if (c.state == "failed") return FailedPrecondition("checkpoint '" + name + "' was not uploaded: " + c.error);
    if (std::chrono::steady_clock::now() >= deadline) {
      return DeadlineExceeded("checkpoint '" + name + "' is " + c.state + " after " + std::to_string(timeout_ms) +
                              " ms: " + std::to_string(c.uploaded_bytes) + " of " + std::to_string(c.size) +
                              " bytes upstream" + (c.error.empty() ? "" : "; last error: " + c.error));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

Result<int> Client::OpenCheckpoint(const std::string& name) {
  v1::LocalRequest req;
  req.mutable_checkpoint_read()->set_name(name);
  v1::LocalResponse resp;
  int fd = -1;
  SC_RETURN_IF_ERROR(session_->Call(req, &resp, &fd));
  if (fd < 0) return Internal("the daemon opened checkpoint '" + name + "' but passed no descriptor");
  return fd;
}

}  // namespace shardcache
