#include "daemon/checkpoint/checkpoint_record.h"

#include <dirent.h>
#include <unistd.h>

#include <cstdio>
#include <sstream>

#include <spdlog/spdlog.h>

#include "common/fs.h"
#include "common/hash.h"

namespace shardcache::checkpoint {
namespace {

constexpr CheckpointState kStates[] = {CheckpointState::kLocal, CheckpointState::kUploading,
                                       CheckpointState::kRemote, CheckpointState::kFailed};

// One line per value: newlines in an error message would end it early.
std::string OneLine(std::string s) {
  for (char& c : s) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return s;
}

Result<CheckpointRecord> ParseRecord(const std::string& text, const std::string& path) {
  CheckpointRecord r;
  std::istringstream in(text);
  std::string line;
  bool have_state = false;
  while (std::getline(in, line)) {
    const size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    const std::string key = line.substr(0, eq), value = line.substr(eq + 1);
    if (key == "name") r.name = value;
    else if (key == "size") r.size = std::stoull(value);
    else if (key == "generation") r.generation = std::stoull(value);
    else if (key == "saved_unix_ms") r.saved_unix_ms = std::stoll(value);
    else if (key == "uploaded_unix_ms") r.uploaded_unix_ms = std::stoll(value);
    else if (key == "error") r.error = value;
    else if (key == "state") {
      for (CheckpointState s : kStates) {
        if (value == StateName(s)) {
          r.state = s;
          have_state = true;
        }
      }
    }
  }
  if (r.name.empty() || !have_state) return DataLoss("checkpoint journal record " + path + " names no checkpoint or state");
  return r;
}

}  // namespace

const char* StateName(CheckpointState s) {
  switch (s) {
    case CheckpointState::kLocal: return "local";
    case CheckpointState::kUploading: return "uploading";
    case CheckpointState::kRemote: return "remote";
    case CheckpointState::kFailed: return "failed";
  }
  return "?";
}

std::string RecordPath(const std::string& journal_dir, const std::string& name) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(HashBytes64(name.data(), name.size())));
  return journal_dir + "/" + hex + ".record";
}

Status SaveRecord(const std::string& journal_dir, const CheckpointRecord& r) {
  std::string text = "name=" + r.name + "\nsize=" + std::to_string(r.size) + "\nstate=" + StateName(r.state) +
                     "\ngeneration=" + std::to_string(r.generation) + "\nsaved_unix_ms=" +
                     std::to_string(r.saved_unix_ms) + "\nuploaded_unix_ms=" + std::to_string(r.uploaded_unix_ms) +
                     "\nerror=" + OneLine(r.error) + "\n";
  return WriteFileAtomic(RecordPath(journal_dir, r.name), text);
}

Status RemoveRecord(const std::string& journal_dir, const std::string& name) {
  const std::string path = RecordPath(journal_dir, name);
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return ErrnoStatus(errno, "removing " + path);
  return Status::Ok();
}

std::vector<CheckpointRecord> LoadRecords(const std::string& journal_dir) {
  std::vector<CheckpointRecord> out;
  DIR* d = ::opendir(journal_dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    const std::string file = e->d_name;
    if (file.size() < 8 || file.compare(file.size() - 7, 7, ".record") != 0) continue;
    const std::string path = journal_dir + "/" + file;
    auto text = ReadFileToString(path);
    Result<CheckpointRecord> r = text.status();
    if (text.ok()) {
      try {
        r = ParseRecord(*text, path);
      } catch (const std::exception&) {  // a number that is none (std::stoull)
        r = DataLoss("checkpoint journal record " + path + " holds a malformed number");
      }
    }
    if (!r.ok()) {
      spdlog::warn("checkpoints: skipping journal record: {}", r.status().ToString());
      continue;
    }
    out.push_back(std::move(*r));
  }
  ::closedir(d);
  return out;
}

}  // namespace shardcache::checkpoint
