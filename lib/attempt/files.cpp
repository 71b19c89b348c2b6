#include "attempt/files.hpp"

#include "stacks/reader.hpp"

#include <fmt/format.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cerrno>
#include <cstring>
#include <filesystem>

namespace ddp::launch {

using nlohmann::json;

std::optional<ErrorFile> read_error_file(const safefs::Dir& dir, const std::string& name, uid_t owner_uid) {
  // The folder belongs to the job's user and the reader may be root: the rank may have put a
  // link to a secret there. Only a regular file of the job's own user is read, bounded.
  const auto path = dir.path_of(name);
  auto r = safefs::read_owned(dir, name, owner_uid, kMaxErrorFileBytes);
  switch (r.kind) {
    case safefs::ReadResult::Kind::missing:
      return std::nullopt;
    case safefs::ReadResult::Kind::refused:
      return ErrorFile{path, "", "", fmt::format("(error file not read: {})", r.reason)};
    case safefs::ReadResult::Kind::too_big:
      return ErrorFile{path, "", "", fmt::format("(error file of {} bytes not read)", r.size)};
    case safefs::ReadResult::Kind::ok:
      break;
  }
  return parse_error_file(path, r.text);
}

std::optional<ErrorFile> read_error_file(const std::string& path) {
  const auto slash = path.rfind('/');
  try {
    const auto dir = safefs::Dir::open(slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash));
    return read_error_file(dir, slash == std::string::npos ? path : path.substr(slash + 1), ::geteuid());
  } catch (const safefs::FsError&) {
    return std::nullopt;
  }
}

std::optional<std::string> result_file_problem(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (path.empty()) return "no file named";
  if (fs::is_directory(path, ec)) return fmt::format("{} is a folder", path);
  if (fs::exists(path, ec)) {
    if (::access(path.c_str(), W_OK) != 0) return fmt::format("{}: {}", path, std::strerror(errno));
    return std::nullopt;
  }
  auto dir = fs::path(path).parent_path();
  if (dir.empty()) dir = ".";
  if (!fs::is_directory(dir, ec)) return fmt::format("{}: the folder {} does not exist", path, dir.string());
  if (::access(dir.c_str(), W_OK) != 0)
    return fmt::format("{}: cannot write in {}: {}", path, dir.string(), std::strerror(errno));
  return std::nullopt;
}

std::optional<std::string> write_result_file(const std::string& path, const nlohmann::json& report) {
  // 0600: the first failure's output is the submitter's (a standing coordinator writes every user's).
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return fmt::format("cannot write the result file {}: {}", path, std::strerror(errno));
  safefs::Fd f(fd);
  // replace: a byte of invalid UTF-8 that slipped into a note becomes U+FFFD, never a throw.
  if (!safefs::write_all(fd, report.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n")) {
    return fmt::format("cannot write the result file {}: {}", path, std::strerror(errno));
  }
  return std::nullopt;
}

std::optional<std::string> write_result_file(const safefs::Dir& dir, const std::string& name,
                                             const nlohmann::json& report) {
  try {
    safefs::replace_file(dir, name, report.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n",
                         std::nullopt);
  } catch (const safefs::FsError& e) {
    return fmt::format("cannot write the result file {}: {}", dir.path_of(name), e.what());
  }
  return std::nullopt;
}

std::optional<unsigned long long> process_start_time(pid_t pid) {
  return stacks::process_start_time(pid);
}

stacks::ProcessStacks read_rank_stacks(pid_t pid, std::stop_token stop) {
  auto p = stacks::read_process(pid, {.python = true,
                                      .native = false,
                                      .deadline = std::chrono::steady_clock::now() + kStackReadTime,
                                      .stop = std::move(stop)});
  bound_stacks(p);
  return p;
}

Written write_stacks_files(const safefs::Dir& dir, const std::optional<safefs::Owner>& owner, const FailureStacks& s,
                           int world_size) {
  // Each file is made new under a temporary name and renamed into place: a link or FIFO the job
  // put under either name is replaced, never followed or written through.
  auto put = [&](const std::string& name, const std::string& text) -> std::string {
    try {
      safefs::replace_file(dir, name, text, owner);
      return "";
    } catch (const safefs::FsError& e) {
      return e.what();
    }
  };
  auto j = report_json(s);
  j["file"] = dir.path_of("stacks.txt");
  if (auto err = put("stacks.txt", full_text(s, world_size)); !err.empty()) return {"", err};
  if (auto err = put("stacks.json", j.dump(2, ' ', false, json::error_handler_t::replace) + "\n"); !err.empty())
    return {"", err};
  return {dir.path_of("stacks.txt"), ""};
}

}  // namespace ddp::launch
