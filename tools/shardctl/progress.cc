#include "tools/shardctl/progress.h"

#include <unistd.h>

#include <cstdio>

#include "common/units.h"

namespace shardcache::shardctl {

bool ProgressBar::StderrIsTerminal() { return ::isatty(STDERR_FILENO) == 1; }

ProgressBar::ProgressBar(std::string label, bool enabled)
    : label_(std::move(label)), enabled_(enabled), start_(std::chrono::steady_clock::now()) {}

ProgressBar::~ProgressBar() { Finish(); }

void ProgressBar::SetLabel(std::string label) {
  if (label == label_) return;
  label_ = std::move(label);
  start_ = std::chrono::steady_clock::now();
  last_draw_ = {};
}

void ProgressBar::Update(uint64_t done, uint64_t total) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  if (done < total && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  Draw(done, total);
}

void ProgressBar::Draw(uint64_t done, uint64_t total) {
  constexpr int kWidth = 30;
  const double frac = total == 0 ? 1.0 : static_cast<double>(done) / static_cast<double>(total);
  const int fill = static_cast<int>(frac * kWidth);
  std::string bar(static_cast<size_t>(fill), '#');
  bar.append(static_cast<size_t>(kWidth - fill), '-');
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double rate = secs > 0 ? static_cast<double>(done) / secs : 0;
  std::string eta = "--";
  if (rate > 0 && done < total) {
    eta = std::to_string(static_cast<uint64_t>(static_cast<double>(total - done) / rate)) + "s";
  }
  std::fprintf(stderr, "\r\033[K%s [%s] %3.0f%% %s / %s  %s/s  eta %s", label_.c_str(), bar.c_str(),
               frac * 100, FormatBytes(done).c_str(), FormatBytes(total).c_str(),
               FormatBytes(static_cast<uint64_t>(rate)).c_str(), eta.c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressBar::Finish() {
  if (!drawn_) return;
  std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
  drawn_ = false;
}

}  // namespace shardcache::shardctl
