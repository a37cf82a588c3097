#include "common/fs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace shardcache {

void UniqueFd::Reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

Result<UniqueFd> OpenFile(const std::string& path, int flags, int mode) {
  int fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  if (fd < 0) return ErrnoStatus(errno, "open " + path);
  return UniqueFd(fd);
}

Result<std::string> ReadFileToString(const std::string& path) {
  SC_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(path, O_RDONLY));
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "stat " + path);
  std::string out(static_cast<size_t>(st.st_size), '\0');
  SC_RETURN_IF_ERROR(PreadFull(fd.get(), out.data(), out.size(), 0, path));
  return out;
}

Status PreadFull(int fd, void* buf, size_t size, uint64_t offset, const std::string& path) {
  auto* p = static_cast<uint8_t*>(buf);
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::pread(fd, p + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "read " + path + " at offset " + std::to_string(offset + done));
    }
    if (n == 0) {
      return OutOfRange(path + ": file ends at offset " + std::to_string(offset + done) +
                        ", wanted " + std::to_string(size) + " bytes from offset " +
                        std::to_string(offset));
    }
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status PwriteFull(int fd, const void* buf, size_t size, uint64_t offset, const std::string& path) {
  const auto* p = static_cast<const uint8_t*>(buf);
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::pwrite(fd, p + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "write " + path + " at offset " + std::to_string(offset + done));
    }
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status WriteFileAtomic(const std::string& path, const std::string& data) {
  const std::string tmp = path + ".tmp";
  {
    SC_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644));
    SC_RETURN_IF_ERROR(PwriteFull(fd.get(), data.data(), data.size(), 0, tmp));
    if (::fsync(fd.get()) != 0) return ErrnoStatus(errno, "fsync " + tmp);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) return ErrnoStatus(errno, "rename " + tmp);
  const std::string dir = std::filesystem::path(path).parent_path().string();
  auto dfd = OpenFile(dir.empty() ? "." : dir, O_RDONLY | O_DIRECTORY);
  if (dfd.ok()) ::fsync(dfd->get());
  return Status::Ok();
}

Status RemoveTree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) return ErrnoStatus(ec.value(), "remove " + path);
  return Status::Ok();
}

Status FsyncDir(const std::string& dir) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid() || ::fsync(fd.get()) != 0) return ErrnoStatus(errno, "fsync " + dir);
  return Status::Ok();
}

Status MakeDirs(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) return ErrnoStatus(ec.value(), "create directory " + path);
  return Status::Ok();
}

namespace {

// mountinfo escapes space, tab, newline and backslash in paths as \ooo (octal).
std::string UnescapeMountPath(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() && std::isdigit(static_cast<unsigned char>(s[i + 1]))) {
      out += static_cast<char>(std::stoi(s.substr(i + 1, 3), nullptr, 8));
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}

}  // namespace

Result<std::string> MountPointOf(const std::string& path) {
  std::error_code ec;
  const std::string real = std::filesystem::canonical(path, ec).string();
  if (ec) return ErrnoStatus(ec.value(), "resolve " + path);
  // Streamed: /proc files report a size of 0, so ReadFileToString would read nothing.
  std::ifstream lines("/proc/self/mountinfo");
  if (!lines) return ErrnoStatus(errno, "open /proc/self/mountinfo");
  // Line: "ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTIONS ..."; the longest mount point that is
  // `real` or a directory above it is where its file system is mounted.
  std::string best = "/";
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    std::string id, parent, dev, root, mount_point;
    if (!(fields >> id >> parent >> dev >> root >> mount_point)) continue;
    const std::string mp = UnescapeMountPath(mount_point);
    const bool covers = mp == "/" || real == mp || real.rfind(mp + "/", 0) == 0;
    if (covers && mp.size() > best.size()) best = mp;
  }
  return best;
}

AlignedBuffer::AlignedBuffer(size_t size) {
  capacity_ = AlignUp(size == 0 ? kDirectIoAlign : size, kDirectIoAlign);
  void* p = nullptr;
  if (posix_memalign(&p, kDirectIoAlign, capacity_) != 0) std::abort();
  data_.reset(static_cast<uint8_t*>(p));
  size_ = size;
}

}  // namespace shardcache
