// ObjectStore: the receiving end of the checkpoint write path. Uploads arrive part by part
// (the Origin service's BeginUpload, PutPart, CommitUpload), each part checked against the
// hash its upload's header gives, and become visible under their final name only once every
// part is on disk, synced and read back: a reader never sees a torn or partial object, and a
// crash of this daemon at any point leaves either the old object (or none) or the new one.
//
// On-disk layout, for the object "run7/step1000/rank3.pt" under `root`:
//
//   <root>/run7/step1000/rank3.pt                      the committed object (its bytes only)
//   <root>/run7/step1000/.rank3.pt.<upload_id>.part    an open upload: the object's bytes,
//                                                      part i at offset i * part_bytes (holes
//                                                      where no part arrived yet)
//   <root>/run7/step1000/.rank3.pt.<upload_id>.hdr     its header sidecar (written atomically):
//     +----------------------+------------------------------------------+
//     | "SCUPHDR1" (8 bytes) | v1::UploadHeader (protobuf encoding)     |
//     +----------------------+------------------------------------------+
//     the trailing '1' is the format version; a sidecar of another version is refused by
//     PutPart/CommitUpload and rewritten by BeginUpload (parts are checked by hash either way).
//
// Names never start with '.' (object_name.h), so temp files never share a name with an object.
// The temp file and sidecar outlive a crash or restart of this daemon: BeginUpload of the same
// header finds them and reports the parts that still match their hashes; CommitUpload renames
// the temp file onto the final name (then fsyncs the directory and removes the sidecar).
// Uploads that are never committed stay as temp files (nothing removes them yet).
//
// Confinement: names are checked (no "..", no absolute paths) and the directories under root
// are opened one component at a time without following symbolic links, so no write, and no
// read, leaves root even when someone with access to root plants a link in it.
//
// Authorization: Authorize() alone decides who may call the other methods; they assume the
// caller authorized the name (REQUIRES below) and check everything else at the boundary —
// hostile field values get InvalidArgument / NotFound / DataLoss, never a crash.
//
// Metrics (metrics::Registry::Global()): shardcache_checkpoint_received_bytes_total (raw part
// bytes written), shardcache_checkpoint_parts_total, shardcache_checkpoint_commits_total,
// shardcache_checkpoint_refused_total (refused by Authorize: no root, no or wrong token),
// shardcache_checkpoint_bad_parts_total (parts refused as DATA_LOSS).
//
// Thread safety: all methods may be called from any thread at once. Parts of one upload are
// written in parallel; its commit waits for the parts being written and excludes new ones (a
// part that arrives after the commit is answered committed, and not written).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/fs.h"
#include "common/mutex.h"
#include "common/status.h"
#include "shardcache/origin.pb.h"

namespace shardcache::checkpoint {

struct ObjectStoreOptions {
  // Absolute directory objects are committed under; created when missing. "" = this daemon
  // takes no checkpoint calls (FAILED_PRECONDITION naming checkpoints.root). Default: "".
  std::string root;
  // Who may write (and read back) what: a bearer token writes names that start with its
  // prefix (a relative prefix ending in '/', e.g. "run7/"). Default: nobody.
  struct Writer {
    std::string prefix;
    std::string token;
  };
  std::vector<Writer> writers;
};

class ObjectStore {
 public:
  explicit ObjectStore(ObjectStoreOptions options);
  ~ObjectStore();
  ObjectStore(const ObjectStore&) = delete;
  ObjectStore& operator=(const ObjectStore&) = delete;

  // OK when `token` is the token of a writer whose prefix starts `name`. FailedPrecondition
  // when root is not set, InvalidArgument for a bad name, Unauthenticated for an empty token,
  // PermissionDenied naming the name otherwise. Tokens are compared in constant time.
  Status Authorize(const std::string& token, const std::string& name) const;

  // Starts or resumes the upload `header` describes: creates the directories, temp file and
  // sidecar, or finds them and reports in verified_parts the parts already there that match
  // their hashes. committed is true (and nothing is created) when the final name already holds
  // exactly these bytes (an object of the same size there is read back to tell: a commit whose
  // reply was lost). InvalidArgument for a bad header (CheckUploadHeader).
  // REQUIRES: Authorize(token, header.name()) was OK.
  Result<v1::UploadState> BeginUpload(const v1::UploadHeader& header);

  // Decodes the part, checks its length and hash against the header and writes it at
  // part * part_bytes, synced (fdatasync) before the reply; verified_parts = {part}.
  // NotFound for an upload that was never begun (or is committed and gone), InvalidArgument
  // for a part index outside the object or an oversized payload, DataLoss naming object, part
  // and both hashes when the bytes do not match (nothing written).
  // REQUIRES: Authorize(token, req.name()) was OK.
  Result<v1::UploadState> PutPart(const v1::PutPartRequest& req);

  // Syncs the temp file and reads every part back; when all match, renames it onto the final
  // name, syncs the directory and removes the sidecar (committed true). Otherwise the upload
  // stays open: committed false, verified_parts the parts that are there.
  // NotFound for an upload that was never begun or is committed already.
  // REQUIRES: Authorize(token, req.name()) was OK.
  Result<v1::UploadState> CommitUpload(const v1::CommitUploadRequest& req);

  // Size of the committed object and the part length to read it in (kReadPartBytes).
  // NotFound when there is none. REQUIRES: Authorize(token, req.name()) was OK.
  Result<v1::ObjectInfo> StatObject(const v1::StatObjectRequest& req);

  // Part `part` of the committed object in parts of `part_bytes`, with its hash, as zstd when
  // the caller accepts it and it pays. InvalidArgument for part_bytes outside [kMinPartBytes,
  // kMaxPartBytes] or a part past the end. REQUIRES: Authorize(token, req.name()) was OK.
  Result<v1::ObjectPart> ReadPart(const v1::ReadPartRequest& req);

 private:
  // One upload, shared by every call working on it (Acquire).
  struct Upload {
    Upload(std::string name_in, std::string id_in)
        : name(std::move(name_in)), id(std::move(id_in)), key(name + '\n' + id) {}
    const std::string name, id, key;
    const std::chrono::steady_clock::time_point since = std::chrono::steady_clock::now();  // first seen here
    Mutex header_mu;
    std::shared_ptr<const v1::UploadHeader> header GUARDED_BY(header_mu);
    // Parts are written holding it shared; BeginUpload and CommitUpload hold it exclusively,
    // so a commit never renames a file a part is being written into.
    SharedMutex mu;
    bool committed GUARDED_BY(mu) = false;
  };
  // An object's directory, opened from root one component at a time, and its last component.
  struct Location {
    UniqueFd dir;
    std::string dir_path;  // root/<directories>, for messages and whole-file writes
    std::string base;
    std::string Path(const std::string& file) const { return dir_path + "/" + file; }
  };

  // FailedPrecondition naming checkpoints.root when there is none.
  Status CheckEnabled() const;
  // The directory of `name` (a checked name), creating missing directories with `create`.
  // NotFound when a directory is missing, FailedPrecondition when one is a symbolic link or
  // not a directory.
  Result<Location> Locate(const std::string& name, bool create) const;
  // The one Upload for (name, id), shared by every call that works on it.
  std::shared_ptr<Upload> Acquire(const std::string& name, const std::string& id);
  // Drops the (committed) upload from the map.
  void Forget(const std::shared_ptr<Upload>& upload);
  // The upload's header, read from its sidecar on first use. NotFound when there is none.
  Result<std::shared_ptr<const v1::UploadHeader>> LoadHeader(Upload& upload, const Location& loc);
  // What PutPart and CommitUpload work on: an upload begun before, by name and id.
  struct Open {
    Location loc;
    std::shared_ptr<Upload> upload;
    std::shared_ptr<const v1::UploadHeader> header;
  };
  // Checks the name and id, finds the directory, the Upload and its header.
  Result<Open> OpenUpload(const std::string& name, const std::string& upload_id);
  // BeginUpload's work once the upload is held: the final name, temp file and sidecar.
  Result<v1::UploadState> BeginLocked(Upload& upload, const v1::UploadHeader& header, const Location& loc)
      REQUIRES(upload.mu);
  // CommitUpload's work once the upload is held: sync, verify, rename.
  Result<v1::UploadState> CommitLocked(Upload& upload, const v1::UploadHeader& header, const Location& loc)
      REQUIRES(upload.mu);

  const ObjectStoreOptions options_;  // root without a trailing '/'
  Mutex mu_;
  // Open uploads by name + '\n' + id. Entries nobody holds are dropped past kMaxCachedUploads;
  // a held one never is, so all calls on one upload share one Upload (and its lock).
  std::map<std::string, std::shared_ptr<Upload>> uploads_ GUARDED_BY(mu_);
};

}  // namespace shardcache::checkpoint
