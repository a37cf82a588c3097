#include "dataset/tar_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <algorithm>
#include <cstring>

#include "dataset/tar_format.h"

namespace shardcache::dataset {

namespace {

constexpr size_t kBufferBytes = 1 << 20;
constexpr uint64_t kMaxOctalSize = 077777777777ull;  // 11 octal digits: 8 GiB - 1

// len-1 zero-padded octal digits then NUL, as GNU tar writes them.
// REQUIRES: v < 8^(len-1) (callers switch to pax above that).
void PutOctal(char* field, size_t len, uint64_t v) {
  field[len - 1] = '\0';
  for (size_t i = len - 1; i-- > 0;) {
    field[i] = static_cast<char>('0' + (v & 7));
    v >>= 3;
  }
}

// Splits a name into ustar prefix (<=155) and name (<=100) at a '/'; false when impossible.
bool SplitUstarName(const std::string& path, std::string* prefix, std::string* name) {
  if (path.size() <= 100) {
    prefix->clear();
    *name = path;
    return true;
  }
  for (size_t slash = path.find('/'); slash != std::string::npos; slash = path.find('/', slash + 1)) {
    if (slash <= 155 && path.size() - slash - 1 <= 100 && path.size() - slash - 1 > 0) {
      *prefix = path.substr(0, slash);
      *name = path.substr(slash + 1);
      return true;
    }
  }
  return false;
}

std::string PaxRecord(const std::string& key, const std::string& value) {
  // The length prefix counts itself; iterate until the digit count is stable.
  const size_t body = 1 + key.size() + 1 + value.size() + 1;  // ' ' key '=' value '\n'
  size_t len = body + 1;
  while (std::to_string(len).size() + body != len) len = std::to_string(len).size() + body;
  return std::to_string(len) + " " + key + "=" + value + "\n";
}

void FillHeader(char* h, const std::string& prefix, const std::string& name, uint64_t size,
                int64_t mtime, uint32_t mode, char type) {
  std::memset(h, 0, kTarBlockBytes);
  std::memcpy(h, name.data(), std::min<size_t>(name.size(), 100));
  PutOctal(h + 100, 8, mode & 07777);
  PutOctal(h + 108, 8, 0);
  PutOctal(h + 116, 8, 0);
  PutOctal(h + 124, 12, size);
  PutOctal(h + 136, 12, std::min<uint64_t>(mtime < 0 ? 0 : static_cast<uint64_t>(mtime), kMaxOctalSize));
  h[156] = type;
  std::memcpy(h + 257, "ustar\0" "00", 8);
  std::memcpy(h + 345, prefix.data(), std::min<size_t>(prefix.size(), 155));
  std::memset(h + 148, ' ', 8);
  unsigned sum = 0;
  for (uint64_t i = 0; i < kTarBlockBytes; ++i) sum += static_cast<unsigned char>(h[i]);
  PutOctal(h + 148, 7, sum);  // six digits and a NUL, then the space already there
}

}  // namespace

Result<std::unique_ptr<TarWriter>> TarWriter::Create(const std::string& path) {
  SC_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(path, O_WRONLY | O_CREAT | O_TRUNC, 0644));
  return std::unique_ptr<TarWriter>(new TarWriter(path, std::move(fd)));
}

TarWriter::~TarWriter() = default;

uint64_t TarWriter::MemberBytes(const std::string& name, uint64_t size_bytes) {
  uint64_t total = kTarBlockBytes + AlignUp(size_bytes, kTarBlockBytes);
  std::string prefix, short_name;
  std::string pax;
  if (!SplitUstarName(name, &prefix, &short_name)) pax += PaxRecord("path", name);
  if (size_bytes > kMaxOctalSize) pax += PaxRecord("size", std::to_string(size_bytes));
  if (!pax.empty()) total += kTarBlockBytes + AlignUp(pax.size(), kTarBlockBytes);
  return total;
}

Status TarWriter::WriteHeaders(const std::string& name, uint64_t size_bytes, int64_t mtime,
                               uint32_t mode) {
  if (name.empty()) return InvalidArgument(path_ + ": tar member without a name");
  std::string prefix, short_name;
  std::string pax;
  if (!SplitUstarName(name, &prefix, &short_name)) {
    pax += PaxRecord("path", name);
    prefix.clear();
    short_name = name.substr(0, 100);
  }
  if (size_bytes > kMaxOctalSize) pax += PaxRecord("size", std::to_string(size_bytes));
  char h[kTarBlockBytes];
  if (!pax.empty()) {
    FillHeader(h, "", "././@PaxHeader", pax.size(), mtime, 0644, 'x');
    SC_RETURN_IF_ERROR(Append(h, sizeof h));
    SC_RETURN_IF_ERROR(Append(pax.data(), pax.size()));
    SC_RETURN_IF_ERROR(Pad());
  }
  FillHeader(h, prefix, short_name, size_bytes > kMaxOctalSize ? 0 : size_bytes, mtime, mode, '0');
  return Append(h, sizeof h);
}

Status TarWriter::AddBytes(const std::string& name, std::string_view data, int64_t mtime,
                           uint32_t mode) {
  SC_RETURN_IF_ERROR(WriteHeaders(name, data.size(), mtime, mode));
  SC_RETURN_IF_ERROR(Append(data.data(), data.size()));
  return Pad();
}

Status TarWriter::AddFile(const std::string& name, const std::string& source_path,
                          uint64_t size_bytes, int64_t mtime, uint32_t mode) {
  SC_ASSIGN_OR_RETURN(UniqueFd in, OpenFile(source_path, O_RDONLY));
  SC_RETURN_IF_ERROR(WriteHeaders(name, size_bytes, mtime, mode));
  uint64_t done = 0;
  while (done < size_bytes) {
    if (buf_.size() >= kBufferBytes) SC_RETURN_IF_ERROR(Flush());
    const size_t room = kBufferBytes - buf_.size();
    const size_t want = static_cast<size_t>(std::min<uint64_t>(room, size_bytes - done));
    const size_t old = buf_.size();
    buf_.resize(old + want);
    Status s = PreadFull(in.get(), buf_.data() + old, want, done, source_path);
    if (!s.ok()) {
      buf_.resize(old);
      return FailedPrecondition(source_path + " changed while packing: " + s.message());
    }
    done += want;
    offset_ += want;
  }
  return Pad();
}

Status TarWriter::Append(const void* data, size_t n) {
  buf_.append(static_cast<const char*>(data), n);
  offset_ += n;
  if (buf_.size() >= kBufferBytes) return Flush();
  return Status::Ok();
}

Status TarWriter::Pad() {
  static const char kZeros[kTarBlockBytes] = {};
  const uint64_t rem = offset_ % kTarBlockBytes;
  if (rem == 0) return Status::Ok();
  return Append(kZeros, kTarBlockBytes - rem);
}

Status TarWriter::Flush() {
  if (buf_.empty()) return Status::Ok();
  SC_RETURN_IF_ERROR(PwriteFull(fd_.get(), buf_.data(), buf_.size(), flushed_, path_));
  flushed_ += buf_.size();
  buf_.clear();
  return Status::Ok();
}

Status TarWriter::Finish(bool fsync) {
  static const char kZeros[2 * kTarBlockBytes] = {};
  SC_RETURN_IF_ERROR(Append(kZeros, sizeof kZeros));
  SC_RETURN_IF_ERROR(Flush());
  if (fsync && ::fsync(fd_.get()) != 0) return ErrnoStatus(errno, "fsync " + path_);
  fd_.Reset();
  return Status::Ok();
}

}  // namespace shardcache::dataset
