// DiskHealth: whether the NVMe tier's disk can be used right now, and if not, why — so that a
// lost or failing cache disk is loud (health in /status, /ready, shardcache_cache_nvme_healthy,
// ONE log line per change) while the daemon keeps serving from the other tiers and upstream.
//
// The disk is failing while any of these holds:
//   * gone: cache.dir no longer exists, or is no longer the directory the store opened (its
//     device and inode changed: the disk was unmounted, or another file system was mounted
//     over it). Checked by Probe(); ends when the original directory is back.
//   * I/O error: a read, write, sync, segment allocation or index commit failed (EIO, EROFS,
//     ...). Ends when Probe() writes, syncs and removes a small file in cache.dir again.
//   * no space: the file system stayed at its free-space floor, with no segment of the cache's
//     own to give back, for at least `no_space_grace` (a moment of ENOSPC is ordinary: the
//     store evicts and retries). Ends when a segment could be allocated, or Probe() sees room.
// While failing, the store stores nothing (chunks pass through; see nvme_writer.h); reads still
// go to the disk, and each one that fails is a miss fetched from upstream.
//
// Logging: an error line when the disk starts failing (the first reason), a warning when it is
// usable again (with how long it was not); nothing in between, however many I/O errors.
// Metrics: shardcache_cache_nvme_healthy (1/0), shardcache_cache_nvme_errors_total.
//
// Thread safety: every method may be called from any thread (one mutex, no I/O under it).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "common/mutex.h"
#include "common/status.h"

namespace shardcache::cache {

class DiskHealth {
 public:
  // Remembers the identity (device, inode) of `dir`, which must exist; the stat error naming
  // it otherwise.
  static Result<std::unique_ptr<DiskHealth>> Open(const std::string& dir,
                                                  std::chrono::seconds no_space_grace = std::chrono::seconds(10));
  ~DiskHealth();  // the gauge goes back to 1: no tier, nothing failing

  // Reports from the store's I/O paths. `what` names the operation and file.
  void ReportIoError(const Status& error);
  void ReportNoSpace(const std::string& what);
  // A segment was allocated: the file system has room again.
  void ReportSpace();

  // Checks that cache.dir is still the directory opened and, while an I/O error or a lack of
  // space is pending, whether the disk works (`room_for_segment`: the store's view of free
  // space above its floor) — see the header comment. Does a little I/O; call it about once a
  // second, not under the store's lock.
  void Probe(bool room_for_segment);

  bool healthy() const { return healthy_.load(std::memory_order_acquire); }
  // Why the disk is failing; "" while healthy.
  std::string problem() const;
  const std::string& dir() const { return dir_; }

 private:
  DiskHealth(std::string dir, dev_t dev, ino_t ino, std::chrono::seconds no_space_grace);
  // Recomputes healthy_ from the conditions, logs a change and sets the
  // gauge.
  void UpdateLocked() REQUIRES(mu_);

  const std::string dir_;
  const dev_t dev_;
  const ino_t ino_;
  const std::chrono::seconds no_space_grace_;

  mutable Mutex mu_;
  std::string gone_ GUARDED_BY(mu_);      // why the directory is gone; "" = there
  std::string io_error_ GUARDED_BY(mu_);  // the last I/O error while it is pending
  std::string no_space_ GUARDED_BY(mu_);  // what ran out of space while it is pending
  std::chrono::steady_clock::time_point no_space_since_ GUARDED_BY(mu_);
  std::string problem_ GUARDED_BY(mu_);  // reason of the current failure; "" = healthy
  std::chrono::steady_clock::time_point failing_since_ GUARDED_BY(mu_);
  std::atomic<bool> healthy_{true};
};

}  // namespace shardcache::cache
