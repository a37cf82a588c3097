#include "shardcache/local_wire.h"

#include <google/protobuf/message_lite.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace shardcache::local_wire {

void AppendFrame(const google::protobuf::MessageLite& message, std::string* out) {
  const size_t len = message.ByteSizeLong();
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((len >> (8 * i)) & 0xff));
  message.AppendToString(out);
}

Status WriteAll(int fd, std::string_view bytes, int pass_fd) {
  size_t off = 0;
  bool fd_sent = pass_fd < 0;
  while (off < bytes.size()) {
    iovec iov{const_cast<char*>(bytes.data() + off), bytes.size() - off};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    if (!fd_sent) {
      msg.msg_control = control;
      msg.msg_controllen = sizeof(control);
      cmsghdr* cm = CMSG_FIRSTHDR(&msg);
      cm->cmsg_level = SOL_SOCKET;
      cm->cmsg_type = SCM_RIGHTS;
      cm->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(cm), &pass_fd, sizeof(int));
    }
    const ssize_t w = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return Unavailable(std::string("writing to the local socket: ") + std::strerror(errno));
    fd_sent = true;
    off += static_cast<size_t>(w);
  }
  return Status::Ok();
}

Status FrameReader::Next(std::string* body, int* passed_fd) {
  if (passed_fd) *passed_fd = -1;
  uint8_t hdr[4];
  SC_RETURN_IF_ERROR(Take(hdr, 4, passed_fd));
  const uint32_t len =
      uint32_t{hdr[0]} | uint32_t{hdr[1]} << 8 | uint32_t{hdr[2]} << 16 | uint32_t{hdr[3]} << 24;
  if (len > kMaxFrameBytes) {
    return DataLoss("a " + std::to_string(len) + "-byte frame (limit " + std::to_string(kMaxFrameBytes) +
                    ")");
  }
  body->resize(len);
  if (len > 0) SC_RETURN_IF_ERROR(Take(reinterpret_cast<uint8_t*>(body->data()), len, passed_fd));
  return Status::Ok();
}

Status FrameReader::Take(uint8_t* p, size_t n, int* passed_fd) {
  while (n > 0) {
    if (begin_ == end_) SC_RETURN_IF_ERROR(Fill(passed_fd));
    const size_t take = std::min(n, end_ - begin_);
    std::memcpy(p, buf_.data() + begin_, take);
    begin_ += take;
    p += take;
    n -= take;
  }
  return Status::Ok();
}

Status FrameReader::Fill(int* passed_fd) {
  for (;;) {
    iovec iov{buf_.data(), buf_.size()};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)];
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t r = ::recvmsg(fd_, &msg, MSG_CMSG_CLOEXEC);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      errno_ = errno;
      return Unavailable(std::string("reading from the local socket: ") + std::strerror(errno_));
    }
    for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
      if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int got;
        std::memcpy(&got, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
        if (passed_fd && *passed_fd < 0) {
          *passed_fd = got;
        } else {
          ::close(got);  // unexpected: never leak a descriptor
        }
      }
    }
    if (r == 0) {
      closed_ = true;
      return Unavailable("the peer closed the local socket");
    }
    begin_ = 0;
    end_ = static_cast<size_t>(r);
    return Status::Ok();
  }
}

}  // namespace shardcache::local_wire
