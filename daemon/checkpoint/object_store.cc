#include "daemon/checkpoint/object_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include <spdlog/spdlog.h>

#include "common/log.h"
#include "common/metrics.h"
#include "daemon/checkpoint/object_name.h"
#include "daemon/upstream/chunk_codec.h"

namespace shardcache::checkpoint {
namespace {

using Clock = std::chrono::steady_clock;

// Sidecar format (see the layout in object_store.h); the last byte is the version.
constexpr char kSidecarMagic[] = "SCUPHDR1";
constexpr size_t kSidecarMagicBytes = sizeof kSidecarMagic - 1;
// A header is one gRPC message (64 MiB at most): a sidecar larger than that is not one.
constexpr uint64_t kMaxSidecarBytes = (64ull << 20) + kSidecarMagicBytes;
// Uploads whose header stays in memory while nobody works on them (beyond, the next call reads
// the sidecar again). A checkpoint of 1 GiB in 4 MiB parts has a 4 KiB header.
constexpr size_t kMaxCachedUploads = 64;

struct StoreMetrics {
  metrics::Counter* received_bytes;
  metrics::Counter* parts;
  metrics::Counter* commits;
  metrics::Counter* refused;
  metrics::Counter* bad_parts;
};

const StoreMetrics& M() {
  static const StoreMetrics m = [] {
    auto& r = metrics::Registry::Global();
    return StoreMetrics{
        r.GetCounter("shardcache_checkpoint_received_bytes_total", "Checkpoint part bytes received and written (raw)"),
        r.GetCounter("shardcache_checkpoint_parts_total", "Checkpoint parts received, checked and written"),
        r.GetCounter("shardcache_checkpoint_commits_total", "Checkpoint uploads committed under their final name"),
        r.GetCounter("shardcache_checkpoint_refused_total",
                     "Checkpoint calls refused: no checkpoints.root, no bearer token, or not a writer of the name"),
        r.GetCounter("shardcache_checkpoint_bad_parts_total",
                     "Checkpoint parts refused because their bytes did not decode or match their hash"),
    };
  }();
  return m;
}

std::string TempName(const std::string& base, const std::string& id) { return "." + base + "." + id + ".part"; }
std::string SidecarName(const std::string& base, const std::string& id) { return "." + base + "." + id + ".hdr"; }

Status OpenError(int err, const std::string& path) {
  if (err == ELOOP) return FailedPrecondition(path + " is a symbolic link; checkpoint files are never reached through links");
  if (err == ENOTDIR) {
    return FailedPrecondition(path + " is not a directory (nor may a directory under root be a symbolic link)");
  }
  return ErrnoStatus(err, "open " + path);
}

// Compares over want's length whatever `got` is, so timing does not leak the token.
bool SameToken(const std::string& got, const std::string& want) {
  unsigned char diff = got.size() != want.size() ? 1 : 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff |= static_cast<unsigned char>(want[i] ^ (i < got.size() ? got[i] : 0));
  }
  return diff == 0 && !want.empty();
}

Result<v1::UploadHeader> ParseSidecar(const std::string& bytes, const std::string& path) {
  if (bytes.compare(0, kSidecarMagicBytes, kSidecarMagic) != 0) {
    return FailedPrecondition(path + " is not an upload header of format " + std::string(kSidecarMagic) +
                              " (written by another version of shardcached?)");
  }
  v1::UploadHeader h;
  if (!h.ParseFromArray(bytes.data() + kSidecarMagicBytes, static_cast<int>(bytes.size() - kSidecarMagicBytes))) {
    return DataLoss(path + ": upload header does not parse");
  }
  if (Status s = CheckUploadHeader(h); !s.ok()) return DataLoss(path + ": " + s.message());
  return h;
}

// Parts of `header` that `fd` holds at their offsets, matching their hashes, in order.
Result<std::vector<uint64_t>> GoodParts(int fd, const v1::UploadHeader& h, const std::string& path) {
  std::vector<uint64_t> good;
  const uint64_t parts = PartCount(h.size(), h.part_bytes());
  std::string buf(parts > 0 ? h.part_bytes() : 0, '\0');
  for (uint64_t p = 0; p < parts; ++p) {
    const uint64_t length = PartLength(h.size(), h.part_bytes(), p);
    Status s = PreadFull(fd, buf.data(), length, p * h.part_bytes(), path);
    if (s.code() == StatusCode::kOutOfRange) break;  // the file ends here: no later part either
    SC_RETURN_IF_ERROR(s);
    if (PartHashBytes(buf.data(), length) == h.part_hashes(static_cast<int>(p))) good.push_back(p);
  }
  return good;
}

// The part's bytes, decoded and checked against the header: InvalidArgument for a part index
// or payload no upload of `h` can have, DataLoss for bytes that are not the part.
Result<AlignedBuffer> DecodePart(const v1::UploadHeader& h, const v1::PutPartRequest& req) {
  const uint64_t parts = PartCount(h.size(), h.part_bytes());
  const std::string where = "part " + std::to_string(req.part()) + " of '" + h.name() + "'";
  if (req.part() >= parts) {
    return InvalidArgument(where + " is outside the object (" + std::to_string(parts) + " parts)");
  }
  const uint64_t length = PartLength(h.size(), h.part_bytes(), req.part());
  // zstd's worst case grows a part by under 1/128; a larger payload is no encoding of it.
  if (req.payload().size() > length + length / 64 + 1024) {
    return InvalidArgument(where + ": payload of " + std::to_string(req.payload().size()) + " bytes for " +
                           std::to_string(length) + " bytes");
  }
  AlignedBuffer bytes;
  upstream::ChunkDecoder decoder;
  if (Status s = decoder.Decode(req.codec(), req.payload(), length, where, &bytes); !s.ok()) {
    M().bad_parts->Add();
    return s;
  }
  const std::string got = PartHashBytes(bytes.data(), bytes.size());
  const std::string& want = h.part_hashes(static_cast<int>(req.part()));
  if (got != want) {
    M().bad_parts->Add();
    return DataLoss(where + ": its bytes hash to " + PartHashHex(got) + ", the upload's header says " +
                    PartHashHex(want) + " (nothing written)");
  }
  return bytes;
}

Result<UniqueFd> OpenAt(int dir, const std::string& file, int flags, const std::string& path) {
  const int fd = ::openat(dir, file.c_str(), flags | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) return OpenError(errno, path);
  return UniqueFd(fd);
}

Result<std::string> ReadAllAt(int dir, const std::string& file, const std::string& path) {
  SC_ASSIGN_OR_RETURN(UniqueFd fd, OpenAt(dir, file, O_RDONLY, path));
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "stat " + path);
  if (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) > kMaxSidecarBytes) {
    return DataLoss(path + " is not an upload header (not a file, or " + std::to_string(st.st_size) + " bytes)");
  }
  std::string out(static_cast<size_t>(st.st_size), '\0');
  SC_RETURN_IF_ERROR(PreadFull(fd.get(), out.data(), out.size(), 0, path));
  return out;
}

// Whether the final name holds exactly the object `h` describes (a commit whose reply was lost).
Result<bool> HoldsObject(int dir, const std::string& base, const std::string& path, const v1::UploadHeader& h) {
  struct stat st;
  if (::fstatat(dir, base.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return false;
    return ErrnoStatus(errno, "stat " + path);
  }
  if (!S_ISREG(st.st_mode)) {
    return FailedPrecondition(path + " exists and is not a file (a directory or link): no object can be committed there");
  }
  if (static_cast<uint64_t>(st.st_size) != h.size()) return false;
  SC_ASSIGN_OR_RETURN(UniqueFd fd, OpenAt(dir, base, O_RDONLY, path));
  SC_ASSIGN_OR_RETURN(std::vector<uint64_t> good, GoodParts(fd.get(), h, path));
  return good.size() == PartCount(h.size(), h.part_bytes());
}

// Writes the sidecar unless one for the same upload is there already.
Status WriteSidecar(int dir, const std::string& file, const std::string& path, const v1::UploadHeader& h,
                    const std::string& id) {
  auto old = ReadAllAt(dir, file, path);
  if (old.ok()) {
    auto parsed = ParseSidecar(*old, path);
    if (parsed.ok() && parsed->name() == h.name() && UploadId(*parsed) == id) return Status::Ok();
  } else if (old.status().code() != StatusCode::kNotFound) {
    return old.status();
  }
  return WriteFileAtomic(path, kSidecarMagic + h.SerializeAsString());
}

// Opens the temp file, creating it (sized, sparse) when missing; *created says which.
Result<UniqueFd> OpenTemp(int dir, const std::string& file, const std::string& path, uint64_t size, bool* created) {
  const int flags = O_RDWR | O_CLOEXEC | O_NOFOLLOW;
  int raw = ::openat(dir, file.c_str(), flags | O_CREAT | O_EXCL, 0644);
  *created = raw >= 0;
  if (raw < 0 && errno == EEXIST) raw = ::openat(dir, file.c_str(), flags);
  if (raw < 0) return OpenError(errno, path);
  UniqueFd fd(raw);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "stat " + path);
  if (!S_ISREG(st.st_mode)) return FailedPrecondition(path + " is not a file");
  if (static_cast<uint64_t>(st.st_size) != size && ::ftruncate(fd.get(), static_cast<off_t>(size)) != 0) {
    return ErrnoStatus(errno, "size " + path + " to " + std::to_string(size) + " bytes");
  }
  return fd;
}

// The options with root spelled without a trailing '/'.
ObjectStoreOptions Normalized(ObjectStoreOptions o) {
  while (o.root.size() > 1 && o.root.back() == '/') o.root.pop_back();
  return o;
}

}  // namespace

ObjectStore::ObjectStore(ObjectStoreOptions options) : options_(Normalized(std::move(options))) {
  M();  // every family exists, at zero, from the start
}

ObjectStore::~ObjectStore() = default;

Status ObjectStore::CheckEnabled() const {
  if (!options_.root.empty()) return Status::Ok();
  return FailedPrecondition("this daemon takes no checkpoint uploads: checkpoints.root is not set");
}

Status ObjectStore::Authorize(const std::string& token, const std::string& name) const {
  if (Status s = CheckEnabled(); !s.ok()) {
    M().refused->Add();
    return s;
  }
  SC_RETURN_IF_ERROR(CheckObjectName(name));
  if (token.empty()) {
    M().refused->Add();
    return Unauthenticated("checkpoint calls need a writer's bearer token (authorization: Bearer ...)");
  }
  // Every writer is compared, whether or not an earlier one matched: timing says nothing.
  bool allowed = false;
  for (const auto& w : options_.writers) {
    const bool covers = name.compare(0, w.prefix.size(), w.prefix) == 0;
    allowed = (SameToken(token, w.token) && covers) || allowed;
  }
  if (allowed) return Status::Ok();
  M().refused->Add();
  SC_LOG_RATE_LIMITED(spdlog::level::info, "checkpoint call for '{}' refused: token is no writer of it", name);
  return PermissionDenied("the bearer token is not the writer of a prefix of '" + name + "'");
}

Result<ObjectStore::Location> ObjectStore::Locate(const std::string& name, bool create) const {
  if (create) SC_RETURN_IF_ERROR(MakeDirs(options_.root));
  Location loc;
  SC_ASSIGN_OR_RETURN(loc.dir, OpenFile(options_.root, O_RDONLY | O_DIRECTORY));
  loc.dir_path = options_.root == "/" ? "" : options_.root;
  size_t start = 0;
  for (size_t slash; (slash = name.find('/', start)) != std::string::npos; start = slash + 1) {
    const std::string component = name.substr(start, slash - start);
    const std::string path = loc.dir_path + "/" + component;
    if (create && ::mkdirat(loc.dir.get(), component.c_str(), 0755) != 0 && errno != EEXIST) {
      return ErrnoStatus(errno, "create directory " + path);
    }
    SC_ASSIGN_OR_RETURN(loc.dir, OpenAt(loc.dir.get(), component, O_RDONLY | O_DIRECTORY, path));
    loc.dir_path = path;
  }
  loc.base = name.substr(start);
  return loc;
}

std::shared_ptr<ObjectStore::Upload> ObjectStore::Acquire(const std::string& name, const std::string& id) {
  auto upload = std::make_shared<Upload>(name, id);
  MutexLock lock(&mu_);
  if (auto it = uploads_.find(upload->key); it != uploads_.end()) return it->second;
  if (uploads_.size() >= kMaxCachedUploads) {
    // Copies are taken only under mu_, so an entry held by the map alone stays unheld.
    std::erase_if(uploads_, [](const auto& e) { return e.second.use_count() == 1; });
  }
  uploads_.emplace(upload->key, upload);
  return upload;
}

void ObjectStore::Forget(const std::shared_ptr<Upload>& upload) {
  MutexLock lock(&mu_);
  if (auto it = uploads_.find(upload->key); it != uploads_.end() && it->second == upload) uploads_.erase(it);
}

Result<std::shared_ptr<const v1::UploadHeader>> ObjectStore::LoadHeader(Upload& upload, const Location& loc) {
  MutexLock lock(&upload.header_mu);
  if (upload.header) return upload.header;
  const std::string file = SidecarName(loc.base, upload.id);
  auto bytes = ReadAllAt(loc.dir.get(), file, loc.Path(file));
  if (!bytes.ok() && bytes.status().code() == StatusCode::kNotFound) {
    return NotFound("no upload " + upload.id + " of '" + upload.name + "' (never begun, or committed since)");
  }
  if (!bytes.ok()) return bytes.status();
  SC_ASSIGN_OR_RETURN(v1::UploadHeader h, ParseSidecar(*bytes, loc.Path(file)));
  if (h.name() != upload.name || UploadId(h) != upload.id) {
    return DataLoss(loc.Path(file) + " does not describe upload " + upload.id + " of '" + upload.name + "'");
  }
  upload.header = std::make_shared<const v1::UploadHeader>(std::move(h));
  return upload.header;
}

Result<v1::UploadState> ObjectStore::BeginUpload(const v1::UploadHeader& header) {
  SC_RETURN_IF_ERROR(CheckEnabled());
  SC_RETURN_IF_ERROR(CheckUploadHeader(header));
  SC_ASSIGN_OR_RETURN(Location loc, Locate(header.name(), /*create=*/true));
  std::shared_ptr<Upload> upload = Acquire(header.name(), UploadId(header));
  WriterMutexLock lock(&upload->mu);
  return BeginLocked(*upload, header, loc);
}

Result<v1::UploadState> ObjectStore::BeginLocked(Upload& upload, const v1::UploadHeader& header,
                                                 const Location& loc) {
  v1::UploadState state;
  state.set_upload_id(upload.id);
  if (upload.committed) {
    state.set_committed(true);
    return state;
  }
  const int dir = loc.dir.get();
  const std::string temp = TempName(loc.base, upload.id), sidecar = SidecarName(loc.base, upload.id);
  SC_ASSIGN_OR_RETURN(bool held, HoldsObject(dir, loc.base, loc.Path(loc.base), header));
  if (held) {
    // Committed before: its reply was lost, or this daemon stopped before removing the sidecar.
    ::unlinkat(dir, temp.c_str(), 0);
    ::unlinkat(dir, sidecar.c_str(), 0);
    state.set_committed(true);
    return state;
  }
  bool created = false;
  SC_ASSIGN_OR_RETURN(UniqueFd fd, OpenTemp(dir, temp, loc.Path(temp), header.size(), &created));
  SC_RETURN_IF_ERROR(WriteSidecar(dir, sidecar, loc.Path(sidecar), header, upload.id));
  if (created && ::fsync(dir) != 0) return ErrnoStatus(errno, "fsync " + loc.dir_path);
  if (!created) {
    // A resumed upload, perhaps after a crash: what is there counts only when it matches.
    SC_ASSIGN_OR_RETURN(std::vector<uint64_t> good, GoodParts(fd.get(), header, loc.Path(temp)));
    for (uint64_t p : good) state.add_verified_parts(p);
  }
  MutexLock lock(&upload.header_mu);
  if (!upload.header) upload.header = std::make_shared<const v1::UploadHeader>(header);
  return state;
}

Result<ObjectStore::Open> ObjectStore::OpenUpload(const std::string& name, const std::string& upload_id) {
  SC_RETURN_IF_ERROR(CheckEnabled());
  SC_RETURN_IF_ERROR(CheckObjectName(name));
  SC_RETURN_IF_ERROR(CheckUploadId(upload_id));
  Open open;
  SC_ASSIGN_OR_RETURN(open.loc, Locate(name, /*create=*/false));
  open.upload = Acquire(name, upload_id);
  SC_ASSIGN_OR_RETURN(open.header, LoadHeader(*open.upload, open.loc));
  return open;
}

Result<v1::UploadState> ObjectStore::PutPart(const v1::PutPartRequest& req) {
  SC_ASSIGN_OR_RETURN(Open open, OpenUpload(req.name(), req.upload_id()));
  const Location& loc = open.loc;
  const std::shared_ptr<Upload>& upload = open.upload;
  const std::shared_ptr<const v1::UploadHeader>& header = open.header;
  SC_ASSIGN_OR_RETURN(AlignedBuffer bytes, DecodePart(*header, req));
  v1::UploadState state;
  state.set_upload_id(upload->id);
  ReaderMutexLock lock(&upload->mu);
  if (upload->committed) {
    state.set_committed(true);
    return state;
  }
  const std::string temp = TempName(loc.base, upload->id), path = loc.Path(temp);
  auto fd = OpenAt(loc.dir.get(), temp, O_WRONLY, path);
  if (!fd.ok() && fd.status().code() == StatusCode::kNotFound) {
    return NotFound("upload " + upload->id + " of '" + req.name() + "' has lost its temp file: begin it again");
  }
  if (!fd.ok()) return fd.status();
  SC_RETURN_IF_ERROR(PwriteFull(fd->get(), bytes.data(), bytes.size(), req.part() * header->part_bytes(), path));
  if (::fdatasync(fd->get()) != 0) return ErrnoStatus(errno, "fdatasync " + path);
  M().parts->Add();
  M().received_bytes->Add(bytes.size());
  state.add_verified_parts(req.part());
  return state;
}

Result<v1::UploadState> ObjectStore::CommitUpload(const v1::CommitUploadRequest& req) {
  SC_ASSIGN_OR_RETURN(Open open, OpenUpload(req.name(), req.upload_id()));
  Result<v1::UploadState> state = [&] {
    WriterMutexLock lock(&open.upload->mu);
    return CommitLocked(*open.upload, *open.header, open.loc);
  }();
  // Calls that hold the upload still see it committed; later ones find no sidecar.
  if (state.ok() && state->committed()) Forget(open.upload);
  return state;
}

Result<v1::UploadState> ObjectStore::CommitLocked(Upload& upload, const v1::UploadHeader& header,
                                                  const Location& loc) {
  const auto start = Clock::now();
  v1::UploadState state;
  state.set_upload_id(upload.id);
  if (upload.committed) {
    state.set_committed(true);
    return state;
  }
  const int dir = loc.dir.get();
  const std::string temp = TempName(loc.base, upload.id), path = loc.Path(temp);
  SC_ASSIGN_OR_RETURN(UniqueFd fd, OpenAt(dir, temp, O_RDONLY, path));
  if (::fsync(fd.get()) != 0) return ErrnoStatus(errno, "fsync " + path);
  SC_ASSIGN_OR_RETURN(std::vector<uint64_t> good, GoodParts(fd.get(), header, path));
  const uint64_t parts = PartCount(header.size(), header.part_bytes());
  if (good.size() != parts) {
    for (uint64_t p : good) state.add_verified_parts(p);
    spdlog::info("checkpoint '{}' not committed: {} of {} parts missing or bad", upload.name, parts - good.size(),
                 parts);
    return state;
  }
  if (::renameat(dir, temp.c_str(), dir, loc.base.c_str()) != 0) {
    return ErrnoStatus(errno, "rename " + path + " to " + loc.Path(loc.base));
  }
  if (::fsync(dir) != 0) return ErrnoStatus(errno, "fsync " + loc.dir_path);
  // A sidecar left behind (a crash right here) only makes the next BeginUpload look at the
  // final name, find the object and remove it.
  ::unlinkat(dir, SidecarName(loc.base, upload.id).c_str(), 0);
  upload.committed = true;
  state.set_committed(true);
  M().commits->Add();
  const auto seconds = [](Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); };
  spdlog::info("checkpoint '{}' committed: {} bytes in {} parts, {:.1f} s since begun here, verified in {:.2f} s",
               upload.name, header.size(), parts, seconds(upload.since), seconds(start));
  return state;
}

Result<v1::ObjectInfo> ObjectStore::StatObject(const v1::StatObjectRequest& req) {
  SC_RETURN_IF_ERROR(CheckEnabled());
  SC_RETURN_IF_ERROR(CheckObjectName(req.name()));
  auto loc = Locate(req.name(), /*create=*/false);
  if (!loc.ok() && loc.status().code() == StatusCode::kNotFound) return NotFound("no object '" + req.name() + "'");
  if (!loc.ok()) return loc.status();
  struct stat st;
  if (::fstatat(loc->dir.get(), loc->base.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return NotFound("no object '" + req.name() + "'");
    return ErrnoStatus(errno, "stat " + loc->Path(loc->base));
  }
  if (!S_ISREG(st.st_mode)) return NotFound("'" + req.name() + "' is not an object (a directory or link)");
  v1::ObjectInfo info;
  info.set_size(static_cast<uint64_t>(st.st_size));
  info.set_part_bytes(kReadPartBytes);
  return info;
}

Result<v1::ObjectPart> ObjectStore::ReadPart(const v1::ReadPartRequest& req) {
  SC_RETURN_IF_ERROR(CheckEnabled());
  SC_RETURN_IF_ERROR(CheckObjectName(req.name()));
  if (req.part_bytes() < kMinPartBytes || req.part_bytes() > kMaxPartBytes) {
    return InvalidArgument("part_bytes " + std::to_string(req.part_bytes()) + " outside [" +
                           std::to_string(kMinPartBytes) + ", " + std::to_string(kMaxPartBytes) + "]");
  }
  auto loc = Locate(req.name(), /*create=*/false);
  if (!loc.ok() && loc.status().code() == StatusCode::kNotFound) return NotFound("no object '" + req.name() + "'");
  if (!loc.ok()) return loc.status();
  const std::string path = loc->Path(loc->base);
  auto fd = OpenAt(loc->dir.get(), loc->base, O_RDONLY, path);
  if (!fd.ok() && fd.status().code() == StatusCode::kNotFound) return NotFound("no object '" + req.name() + "'");
  if (!fd.ok()) return fd.status();
  struct stat st;
  if (::fstat(fd->get(), &st) != 0) return ErrnoStatus(errno, "stat " + path);
  if (!S_ISREG(st.st_mode)) return NotFound("'" + req.name() + "' is not an object (a directory)");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  const uint64_t parts = PartCount(size, req.part_bytes());
  if (req.part() >= parts) {
    return InvalidArgument("part " + std::to_string(req.part()) + " of '" + req.name() + "' is outside the object (" +
                           std::to_string(parts) + " parts of " + std::to_string(req.part_bytes()) + " bytes)");
  }
  const uint64_t length = PartLength(size, req.part_bytes(), req.part());
  std::string bytes(length, '\0');
  SC_RETURN_IF_ERROR(PreadFull(fd->get(), bytes.data(), length, req.part() * req.part_bytes(), path));
  v1::ObjectPart out;
  out.set_hash(PartHashBytes(bytes.data(), bytes.size()));
  out.set_raw_bytes(length);
  v1::Codec codec = v1::RAW;
  upstream::ChunkEncoder encoder;
  encoder.Encode(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), req.accept_zstd(), &codec,
                 out.mutable_payload());
  out.set_codec(codec);
  return out;
}

}  // namespace shardcache::checkpoint
