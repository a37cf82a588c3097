// ObjectClient::PutFile: a file stored as one object, by one PUT or by an S3 multipart upload
// (CreateMultipartUpload → UploadPart × N → CompleteMultipartUpload; AbortMultipartUpload when a
// step fails). Query strings are written in SigV4's canonical form, since curl 7.88 signs them
// exactly as written ("uploads=" for the valueless subresource, parameters sorted by name).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <string>
#include <vector>

#include "common/fs.h"
#include "objstore/object_client.h"
#include "objstore/s3_xml.h"

namespace shardcache::objstore {
namespace {

// S3 takes at most this many parts per upload.
constexpr uint64_t kMaxParts = 10000;

// `n` bytes at `offset` of the open file `fd`, or an error naming `path`.
Result<std::string> ReadPart(int fd, const std::string& path, uint64_t offset, uint64_t n) {
  std::string bytes(n, '\0');
  uint64_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd, bytes.data() + got, n - got, static_cast<off_t>(offset + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return ErrnoStatus(errno, "reading " + path);
    if (r == 0) return DataLoss(path + " ended at byte " + std::to_string(offset + got) + " while uploading it (did it shrink?)");
    got += static_cast<uint64_t>(r);
  }
  return bytes;
}

std::string CompleteBody(const std::vector<std::string>& etags) {
  std::string xml = "<CompleteMultipartUpload>";
  for (size_t i = 0; i < etags.size(); ++i) {
    xml += "<Part><PartNumber>" + std::to_string(i + 1) + "</PartNumber><ETag>" + XmlEscape(etags[i]) + "</ETag></Part>";
  }
  return xml + "</CompleteMultipartUpload>";
}

}  // namespace

Result<std::string> ObjectClient::PutFile(const std::string& key, const std::string& path, uint64_t part_bytes) {
  if (!uri_.is_s3()) {
    return Unimplemented("cannot write " + uri_.Describe(key) + ": plain http(s) stores are read-only here");
  }
  if (part_bytes < kMinPartBytes) {
    return InvalidArgument("multipart part size " + std::to_string(part_bytes) + " is under S3's minimum of " +
                           std::to_string(kMinPartBytes) + " bytes");
  }
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (ec) return NotFound("cannot upload " + path + ": " + ec.message());
  if (size <= part_bytes) {
    SC_ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(path));
    return Put(key, bytes);
  }
  // Parts large enough that the file fits S3's part count, in whole MiB.
  const uint64_t mib = uint64_t{1} << 20;
  part_bytes = std::max(part_bytes, ((size + kMaxParts - 1) / kMaxParts + mib - 1) / mib * mib);
  SC_ASSIGN_OR_RETURN(HttpResponse created, Send("multipart", "POST", key, "uploads=", ""));
  const std::string upload_id = XmlElement(created.body, "UploadId");
  if (upload_id.empty()) {
    return Internal(endpoint_ + " answered CreateMultipartUpload of " + uri_.Describe(key) + " without an UploadId");
  }
  auto etag = UploadParts(key, path, size, part_bytes, upload_id);
  if (!etag.ok()) {
    // The parts stored so far would be kept (and billed) until aborted.
    (void)Send("multipart", "DELETE", key, "uploadId=" + UriEncode(upload_id, false), "");
  }
  return etag;
}

Result<std::string> ObjectClient::UploadParts(const std::string& key, const std::string& path, uint64_t size,
                                              uint64_t part_bytes, const std::string& upload_id) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, "opening " + path);
  std::vector<std::string> etags;
  Status failed;
  for (uint64_t offset = 0; offset < size && failed.ok(); offset += part_bytes) {
    const uint64_t number = etags.size() + 1;
    auto bytes = ReadPart(fd, path, offset, std::min(part_bytes, size - offset));
    if (!bytes.ok()) {
      failed = bytes.status();
      break;
    }
    auto put = Send("multipart", "PUT", key,
                    "partNumber=" + std::to_string(number) + "&uploadId=" + UriEncode(upload_id, false),
                    std::move(*bytes));
    if (!put.ok()) {
      failed = put.status().WithContext("part " + std::to_string(number) + " of the multipart upload of " +
                                        uri_.Describe(key));
    } else if (put->etag.empty()) {
      failed = Internal(endpoint_ + " stored part " + std::to_string(number) + " of " + uri_.Describe(key) +
                        " without an ETag");
    } else {
      etags.push_back(put->etag);
    }
  }
  ::close(fd);
  if (!failed.ok()) return failed;
  SC_ASSIGN_OR_RETURN(HttpResponse done, Send("multipart", "POST", key, "uploadId=" + UriEncode(upload_id, false),
                                              CompleteBody(etags)));
  // S3 may answer CompleteMultipartUpload 200 OK with an <Error> body.
  if (const S3Error e = ParseS3Error(done.body); !e.code.empty()) {
    return Unavailable(endpoint_ + " refused to complete the multipart upload of " + uri_.Describe(key) + ": " +
                       e.code + " (" + e.message + ")");
  }
  const std::string etag = XmlElement(done.body, "ETag");
  return etag.empty() ? done.etag : etag;
}

}  // namespace shardcache::objstore
