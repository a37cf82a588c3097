#include "dataset/byte_source.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>

namespace shardcache::dataset {

Status ByteSource::CheckRange(uint64_t offset, size_t n) const {
  if (offset > size() || n > size() - offset) {
    return OutOfRange(name() + ": read of " + std::to_string(n) + " bytes at offset " +
                      std::to_string(offset) + " runs past the end of the file (" +
                      std::to_string(size()) + " bytes)");
  }
  return Status::Ok();
}

Result<std::unique_ptr<FileByteSource>> FileByteSource::Open(const std::string& path) {
  SC_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(path, O_RDONLY));
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "stat " + path);
  if (!S_ISREG(st.st_mode)) return InvalidArgument(path + " is not a regular file");
  return std::unique_ptr<FileByteSource>(
      new FileByteSource(path, std::move(fd), static_cast<uint64_t>(st.st_size)));
}

Status FileByteSource::ReadAt(uint64_t offset, void* buf, size_t n) const {
  SC_RETURN_IF_ERROR(CheckRange(offset, n));
  return PreadFull(fd_.get(), buf, n, offset, path_);
}

Status MemoryByteSource::ReadAt(uint64_t offset, void* buf, size_t n) const {
  SC_RETURN_IF_ERROR(CheckRange(offset, n));
  if (n > 0) std::memcpy(buf, bytes_.data() + offset, n);
  return Status::Ok();
}

}  // namespace shardcache::dataset
