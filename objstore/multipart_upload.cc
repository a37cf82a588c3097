// ObjectClient::PutFile: a file stored as one object, by one PUT or by an S3 multipart upload
// (CreateMultipartUpload → UploadPart × N → CompleteMultipartUpload; AbortMultipartUpload when a
// step fails). Query strings are written in SigV4's canonical form, since curl 7.88 signs them
// exactly as written ("uploads=" for the valueless subresource, parameters sorted by name).
#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <string>
#include <vector>

#include "common/fs.h"
#include "objstore/object_client.h"
#include "objstore/s3_xml.h"

namespace shardcache::objstore {
namespace {

// S3 takes at most this many parts per upload.
constexpr uint64_t kMaxParts = 10000;

// `n` bytes at `offset` of the open file `fd` (OutOfRange naming `path` when it shrank).
Result<std::string> ReadPart(const UniqueFd& fd, const std::string& path, uint64_t offset, uint64_t n) {
  std::string bytes(n, '\0');
  SC_RETURN_IF_ERROR(PreadFull(fd.get(), bytes.data(), n, offset, path));
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
  SC_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(path, O_RDONLY));
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "stat " + path);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size <= part_bytes) {
    SC_ASSIGN_OR_RETURN(std::string bytes, ReadPart(fd, path, 0, size));
    return Put(key, bytes);
  }
  // Parts large enough that the file fits S3's part count, in whole MiB.
  part_bytes = std::max(part_bytes, AlignUp((size + kMaxParts - 1) / kMaxParts, uint64_t{1} << 20));
  SC_ASSIGN_OR_RETURN(HttpResponse created, Send("multipart", "POST", key, "uploads=", ""));
  const std::string upload_id = XmlElement(created.body, "UploadId");
  if (upload_id.empty()) {
    return Internal(endpoint_ + " answered CreateMultipartUpload of " + uri_.Describe(key) + " without an UploadId");
  }
  const std::string upload = "uploadId=" + UriEncode(upload_id, false);  // canonical query
  auto etag = UploadParts(key, fd, path, size, part_bytes, upload);
  if (!etag.ok()) {
    // The parts stored so far would be kept (and billed) until aborted.
    (void)Send("multipart", "DELETE", key, upload, "");
  }
  return etag;
}

Result<std::string> ObjectClient::UploadParts(const std::string& key, const UniqueFd& fd, const std::string& path,
                                              uint64_t size, uint64_t part_bytes, const std::string& upload) {
  std::vector<std::string> etags;
  for (uint64_t offset = 0; offset < size; offset += part_bytes) {
    const std::string number = std::to_string(etags.size() + 1);
    SC_ASSIGN_OR_RETURN(std::string bytes, ReadPart(fd, path, offset, std::min(part_bytes, size - offset)));
    auto put = Send("multipart", "PUT", key, "partNumber=" + number + "&" + upload,
                    std::move(bytes));
    if (!put.ok()) return put.status().WithContext("part " + number + " of the multipart upload of " + uri_.Describe(key));
    if (put->etag.empty()) {
      return Internal(endpoint_ + " stored part " + number + " of " + uri_.Describe(key) + " without an ETag");
    }
    etags.push_back(put->etag);
  }
  SC_ASSIGN_OR_RETURN(HttpResponse done, Send("multipart", "POST", key, upload, CompleteBody(etags)));
  // S3 may answer CompleteMultipartUpload 200 OK with an <Error> body.
  if (const S3Error e = ParseS3Error(done.body); !e.code.empty()) {
    return Unavailable(endpoint_ + " refused to complete the multipart upload of " + uri_.Describe(key) + ": " +
                       e.code + " (" + e.message + ")");
  }
  const std::string etag = XmlElement(done.body, "ETag");
  return etag.empty() ? done.etag : etag;
}

}  // namespace shardcache::objstore
