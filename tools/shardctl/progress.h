// ProgressBar: a one-line progress bar on stderr for long CLI operations (index, pack, verify,
// warm). Drawn only when stderr is a terminal; Finish() always leaves the cursor on a fresh
// line. Redraws at most 10 times a second.
//
// Thread safety: not synchronized; call from one thread (the indexer's progress callbacks
// already arrive on the calling thread).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace shardcache::shardctl {

class ProgressBar {
 public:
  // enabled: draw at all; default is "stderr is a terminal".
  explicit ProgressBar(std::string label, bool enabled = StderrIsTerminal());
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // Sets the label shown before the bar (e.g. switching from "pack" to "index").
  void SetLabel(std::string label);
  void Update(uint64_t done_bytes, uint64_t total_bytes);
  // Clears the bar line (when drawn).
  void Finish();

  static bool StderrIsTerminal();

 private:
  void Draw(uint64_t done, uint64_t total);

  std::string label_;
  const bool enabled_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_{};
};

}  // namespace shardcache::shardctl
