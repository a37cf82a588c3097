#include "daemon/checkpoint/checkpoint_stage.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <random>

#include <spdlog/spdlog.h>

#include "common/log.h"
#include "common/metrics.h"
#include "common/thread_name.h"
#include "daemon/checkpoint/object_name.h"

namespace shardcache::checkpoint {
namespace {

using Clock = std::chrono::steady_clock;

int64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

struct StageMetrics {
  metrics::Gauge* pending_bytes;
  metrics::Counter* saved_bytes;
  metrics::Counter* uploaded_bytes;
  metrics::Counter* sent_bytes;
  metrics::Counter* uploads;
  metrics::Counter* upload_failures;
  metrics::Counter* save_ms;
  metrics::Counter* upload_ms;
  metrics::Gauge* upload_goodput;
};

StageMetrics& M() {
  static StageMetrics m = [] {
    auto& r = metrics::Registry::Global();
    StageMetrics s;
    s.pending_bytes = r.GetGauge("shardcache_checkpoint_pending_bytes", "Checkpoint bytes saved here, not yet uploaded");
    s.saved_bytes = r.GetCounter("shardcache_checkpoint_saved_bytes_total", "Checkpoint bytes trainers saved to this node");
    s.uploaded_bytes = r.GetCounter("shardcache_checkpoint_uploaded_bytes_total",
                                    "Checkpoint bytes committed at the upstream (verified)");
    s.sent_bytes = r.GetCounter("shardcache_checkpoint_sent_bytes_total",
                                "Checkpoint part bytes put on the link (after zstd; resumed parts are not sent again)");
    s.uploads = r.GetCounter("shardcache_checkpoint_uploads_total", "Checkpoints uploaded and committed upstream");
    s.upload_failures = r.GetCounter("shardcache_checkpoint_upload_failures_total",
                                     "Upload attempts that failed (retried, or the checkpoint marked failed)");
    s.save_ms = r.GetScaledCounter("shardcache_checkpoint_save_seconds_total",
                                   "Time trainers spent saving checkpoints (open to durable on this node)", 1e-3);
    s.upload_ms = r.GetScaledCounter("shardcache_checkpoint_upload_seconds_total",
                                     "Time the uploads of those checkpoints took: what trainers writing straight to "
                                     "the upstream would have waited at least",
                                     1e-3);
    s.upload_goodput = r.GetGauge("shardcache_checkpoint_upload_goodput_bytes_per_second",
                                  "Checkpoint bytes per second of the last upload (the parts it sent, over its time)");
    return s;
  }();
  return m;
}

// Refusals that another attempt will not change.
bool Final(StatusCode c) {
  return c == StatusCode::kPermissionDenied || c == StatusCode::kUnauthenticated ||
         c == StatusCode::kFailedPrecondition || c == StatusCode::kInvalidArgument || c == StatusCode::kNotFound ||
         c == StatusCode::kUnimplemented;
}

// Retention groups a name by its first component (a run: "run7") and counts saves in it by its
// first two ("run7/step1000" holds every rank's file of that step; "run7/last.pt" is one file).
std::string RunOf(const std::string& name) {
  const size_t slash = name.find('/');
  return slash == std::string::npos ? std::string() : name.substr(0, slash);
}
std::string SaveOf(const std::string& name) {
  const size_t first = name.find('/');
  if (first == std::string::npos) return name;
  return name.substr(0, name.find('/', first + 1));
}

}  // namespace

Result<std::unique_ptr<CheckpointStage>> CheckpointStage::Open(CheckpointStageOptions options,
                                                               std::unique_ptr<CheckpointTransfer> transfer,
                                                               std::string why_not) {
  if (options.dir.empty()) return InvalidArgument("checkpoints: no staging directory");
  // Temp files of saves that never committed (the daemon stopped meanwhile) are dropped.
  SC_RETURN_IF_ERROR(RemoveTree(options.dir + "/tmp").WithContext("checkpoints.dir"));
  for (const char* sub : {"/tmp", "/objects", "/journal"}) {
    SC_RETURN_IF_ERROR(MakeDirs(options.dir + sub).WithContext("checkpoints.dir"));
  }
  std::unique_ptr<CheckpointStage> s(new CheckpointStage(std::move(options), std::move(transfer), std::move(why_not)));
  uint64_t resumed = 0;
  {
    MutexLock lock(&s->mu_);
    for (CheckpointRecord& r : LoadRecords(s->JournalDir())) {
      if (r.state == CheckpointState::kUploading) r.state = CheckpointState::kLocal;
      if (r.state == CheckpointState::kLocal) ++resumed;
      s->records_[r.name] = std::move(r);
    }
    s->UpdatePendingLocked();
  }
  if (resumed > 0) spdlog::info("checkpoints: {} to upload from before the restart", resumed);
  s->uploader_ = std::thread([p = s.get()] {
    NameThisThread("sc-ckpt-upload");
    p->UploadLoop();
  });
  return s;
}

CheckpointStage::CheckpointStage(CheckpointStageOptions options, std::unique_ptr<CheckpointTransfer> transfer,
                                 std::string why_not)
    : options_(std::move(options)), transfer_(std::move(transfer)), why_not_(std::move(why_not)) {}

CheckpointStage::~CheckpointStage() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    for (auto& [handle, p] : pending_) ::unlink(p.tmp_path.c_str());
  }
  stop_upload_.store(true);
  cv_.NotifyAll();
  if (uploader_.joinable()) uploader_.join();
}

Result<CheckpointStage::Opened> CheckpointStage::Create(const std::string& name) {
  SC_RETURN_IF_ERROR(CheckObjectName(name));
  MutexLock lock(&mu_);
  const uint64_t handle = next_handle_++;
  const std::string tmp = options_.dir + "/tmp/" + std::to_string(handle) + "-" + std::to_string(std::random_device{}());
  SC_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(tmp, O_RDWR | O_CREAT | O_EXCL, 0600));
  pending_[handle] = Pending{name, tmp, Clock::now()};
  return Opened{handle, std::move(fd)};
}

void CheckpointStage::Abort(uint64_t handle) {
  MutexLock lock(&mu_);
  auto it = pending_.find(handle);
  if (it == pending_.end()) return;
  ::unlink(it->second.tmp_path.c_str());
  pending_.erase(it);
}

Result<uint64_t> CheckpointStage::Commit(uint64_t handle) {
  Pending p;
  {
    MutexLock lock(&mu_);
    auto it = pending_.find(handle);
    if (it == pending_.end()) return NotFound("no checkpoint being written with handle " + std::to_string(handle));
    p = it->second;
    pending_.erase(it);
  }
  auto fail = [&](Status s) {
    ::unlink(p.tmp_path.c_str());
    spdlog::warn("checkpoint '{}' not saved: {}", p.name, s.ToString());
    return s;
  };
  auto fd = OpenFile(p.tmp_path, O_RDONLY);
  if (!fd.ok()) return fail(fd.status());
  struct stat st {};
  if (::fstat(fd->get(), &st) != 0 || ::fsync(fd->get()) != 0) return fail(ErrnoStatus(errno, "fsync " + p.tmp_path));
  const std::string dest = ObjectPath(p.name);
  const size_t slash = dest.rfind('/');
  if (Status s = MakeDirs(dest.substr(0, slash)); !s.ok()) return fail(s);
  if (::rename(p.tmp_path.c_str(), dest.c_str()) != 0) return fail(ErrnoStatus(errno, "rename onto " + dest));
  if (Status s = FsyncDir(dest.substr(0, slash)); !s.ok()) return fail(s);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  MutexLock lock(&mu_);
  CheckpointRecord& r = records_[p.name];
  r.name = p.name;
  r.size = size;
  r.state = CheckpointState::kLocal;
  r.generation += 1;
  r.saved_unix_ms = NowUnixMs();
  r.uploaded_unix_ms = 0;
  r.error.clear();
  SaveLocked(r);
  retry_.erase(p.name);
  if (uploading_ == p.name) stop_upload_.store(true);  // its bytes just changed
  M().saved_bytes->Add(size);
  M().save_ms->Add(static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - p.opened).count()));
  spdlog::info("checkpoint '{}' saved: {} bytes in {:.3f} s", p.name, size,
               std::chrono::duration<double>(Clock::now() - p.opened).count());
  cv_.NotifyAll();
  return size;
}

void CheckpointStage::SaveLocked(const CheckpointRecord& r) {
  if (Status s = SaveRecord(JournalDir(), r); !s.ok()) {
    spdlog::error("checkpoint '{}': journal record not saved: {} (its upload is lost on a restart)", r.name,
                  s.ToString());
  }
  UpdatePendingLocked();
}

void CheckpointStage::UpdatePendingLocked() {
  uint64_t pending = 0;
  for (const auto& [n, r] : records_) {
    if (r.state == CheckpointState::kLocal || r.state == CheckpointState::kUploading) pending += r.size;
  }
  M().pending_bytes->Set(static_cast<double>(pending));
}

bool CheckpointStage::NextUpload(CheckpointRecord* out) {
  MutexLock lock(&mu_);
  for (;;) {
    if (stopping_) return false;
    const auto now = Clock::now();
    CheckpointRecord* best = nullptr;
    auto soonest = Clock::time_point::max();
    for (auto& [name, r] : records_) {
      if (r.state != CheckpointState::kLocal && r.state != CheckpointState::kUploading) continue;
      auto it = retry_.find(name);
      if (it != retry_.end() && it->second.at > now) {
        soonest = std::min(soonest, it->second.at);
        continue;
      }
      if (best == nullptr || r.saved_unix_ms < best->saved_unix_ms) best = &r;
    }
    if (best != nullptr) {
      best->state = CheckpointState::kUploading;
      SaveLocked(*best);
      uploading_ = best->name;
      upload_started_ = now;
      stop_upload_.store(false);
      *out = *best;
      return true;
    }
    if (soonest == Clock::time_point::max()) {
      cv_.Wait(&mu_);
    } else {
      cv_.WaitUntil(&mu_, soonest);
    }
  }
}

void CheckpointStage::UploadLoop() {
  CheckpointRecord r;
  while (NextUpload(&r)) {
    Status s = transfer_ == nullptr ? FailedPrecondition(why_not_)
                                    : transfer_->Upload(r.name, ObjectPath(r.name), &progress_, &stop_upload_);
    M().sent_bytes->Add(progress_.sent_bytes.load());
    FinishUpload(r, s);
  }
}

void CheckpointStage::FinishUpload(const CheckpointRecord& done, const Status& s) {
  MutexLock lock(&mu_);
  uploading_.clear();
  auto it = records_.find(done.name);
  if (it == records_.end() || it->second.generation != done.generation) return;  // saved again meanwhile
  CheckpointRecord& r = it->second;
  const double seconds = std::chrono::duration<double>(Clock::now() - upload_started_).count();
  if (s.ok()) {
    r.state = CheckpointState::kRemote;
    r.uploaded_unix_ms = NowUnixMs();
    r.error.clear();
    retry_.erase(r.name);
    M().uploads->Add(1);
    M().upload_ms->Add(static_cast<uint64_t>(seconds * 1000));
    M().uploaded_bytes->Add(r.size);
    M().upload_goodput->Set(static_cast<double>(r.size - progress_.held_bytes.load()) / std::max(seconds, 1e-3));
    spdlog::info("checkpoint '{}' uploaded: {} bytes in {:.1f} s ({} sent, {} held from before)", r.name, r.size,
                 seconds, progress_.sent_bytes.load(), progress_.held_bytes.load());
    SaveLocked(r);
    ApplyRetention(RunOf(r.name));
    return;
  }
  M().upload_failures->Add(1);
  r.error = s.ToString();
  if (Final(s.code())) {
    r.state = CheckpointState::kFailed;
    spdlog::error("checkpoint '{}' not uploaded: {} (kept on this node)", r.name, r.error);
  } else if (s.code() != StatusCode::kCancelled || !stopping_) {
    r.state = CheckpointState::kLocal;
    Retry& retry = retry_[r.name];
    retry.at = Clock::now() + std::min<std::chrono::milliseconds>(options_.retry_max,
                                                                   options_.retry_min * (1 << std::min(retry.failures, 10)));
    ++retry.failures;
    SC_LOG_RATE_LIMITED(spdlog::level::warn, "checkpoint '{}' upload failed: {}; retrying", r.name, r.error);
  }
  SaveLocked(r);
}

void CheckpointStage::ApplyRetention(const std::string& run) {
  // The uploaded saves of the run that still have local files, newest first by their last file.
  std::map<std::string, int64_t> saves;
  for (const auto& [name, r] : records_) {
    if (r.state != CheckpointState::kRemote || RunOf(name) != run || ::access(ObjectPath(name).c_str(), F_OK) != 0) {
      continue;
    }
    int64_t& newest = saves[SaveOf(name)];
    newest = std::max(newest, r.saved_unix_ms);
  }
  if (saves.size() <= options_.keep_local) return;
  std::vector<std::pair<int64_t, std::string>> order;
  for (const auto& [save, t] : saves) order.emplace_back(t, save);
  std::sort(order.rbegin(), order.rend());
  for (size_t i = options_.keep_local; i < order.size(); ++i) {
    for (const auto& [name, r] : records_) {
      if (r.state != CheckpointState::kRemote || RunOf(name) != run || SaveOf(name) != order[i].second) continue;
      if (::unlink(ObjectPath(name).c_str()) == 0) {
        spdlog::info("checkpoint '{}': local copy removed (uploaded; checkpoints.keep_local {} saves per run)", name,
                     options_.keep_local);
      }
    }
  }
}

CheckpointInfo CheckpointStage::InfoOf(const CheckpointRecord& r) const {
  CheckpointInfo i;
  i.name = r.name;
  i.state = StateName(r.state);
  i.size = r.size;
  i.error = r.error;
  i.saved_unix_ms = r.saved_unix_ms;
  i.local = ::access(ObjectPath(r.name).c_str(), F_OK) == 0;
  if (r.state == CheckpointState::kRemote) i.uploaded_bytes = r.size;
  if (r.name == uploading_ && r.state == CheckpointState::kUploading) {
    i.uploaded_bytes = progress_.done_bytes.load();
    const double seconds = std::chrono::duration<double>(Clock::now() - upload_started_).count();
    const uint64_t sent = i.uploaded_bytes - std::min(i.uploaded_bytes, progress_.held_bytes.load());
    i.upload_bytes_per_s = seconds > 0 ? static_cast<double>(sent) / seconds : 0;
    if (i.upload_bytes_per_s > 0) i.eta_s = static_cast<double>(r.size - std::min(r.size, i.uploaded_bytes)) / i.upload_bytes_per_s;
  }
  return i;
}

std::vector<CheckpointInfo> CheckpointStage::List(const std::string& name) const {
  MutexLock lock(&mu_);
  std::vector<CheckpointInfo> out;
  for (const auto& [n, r] : records_) {
    if (name.empty() || n == name) out.push_back(InfoOf(r));
  }
  return out;
}

Result<UniqueFd> CheckpointStage::OpenForRead(const std::string& name) {
  SC_RETURN_IF_ERROR(CheckObjectName(name));
  const std::string path = ObjectPath(name);
  auto local = OpenFile(path, O_RDONLY);
  if (local.ok() || local.status().code() != StatusCode::kNotFound) return local;
  if (transfer_ == nullptr) return NotFound("checkpoint '" + name + "' is not on this node (" + why_not_ + ")");
  // Not here: from the upstream, into a temp file first, then under its name.
  uint64_t handle = 0;
  {
    MutexLock lock(&mu_);
    handle = next_handle_++;
  }
  const std::string tmp = options_.dir + "/tmp/read-" + std::to_string(handle);
  auto size = transfer_->Download(name, tmp);
  if (!size.ok()) {
    ::unlink(tmp.c_str());
    return size.status().WithContext("checkpoint '" + name + "' is not on this node; reading it from upstream");
  }
  SC_RETURN_IF_ERROR(MakeDirs(path.substr(0, path.rfind('/'))));
  if (::rename(tmp.c_str(), path.c_str()) != 0) return ErrnoStatus(errno, "rename onto " + path);
  spdlog::info("checkpoint '{}' read from {}: {} bytes", name, transfer_->where(), *size);
  MutexLock lock(&mu_);
  if (records_.count(name) == 0) {
    CheckpointRecord r;
    r.name = name;
    r.size = *size;
    r.state = CheckpointState::kRemote;
    r.saved_unix_ms = NowUnixMs();
    r.uploaded_unix_ms = r.saved_unix_ms;
    records_[name] = r;
    SaveLocked(r);
  }
  return OpenFile(path, O_RDONLY);
}

}  // namespace shardcache::checkpoint
