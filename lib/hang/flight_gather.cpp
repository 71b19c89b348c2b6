#include "hang/flight_gather.hpp"

#include "common/json_parse.hpp"
#include "common/log.hpp"
#include "common/strings.hpp"
#include "common/text.hpp"
#include "contract/flight_recorder.hpp"
#include "hang/flight_convert_py.hpp"
#include "supervisor/run_bounded.hpp"

#include <fmt/format.h>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace ddp::hang {

const char* convert_script() {
  return reinterpret_cast<const char*>(generated::kFlightConvertPy);
}

namespace {

// A write to a FIFO whose reader just went away raises SIGPIPE; whoever calls us may not ignore
// it. Blocked around the write, and a SIGPIPE it raised is taken back before unblocking.
class SigpipeBlocked {
 public:
  SigpipeBlocked() {
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &s, &old_);
  }
  ~SigpipeBlocked() {
    sigset_t s, pending;
    sigemptyset(&s);
    sigaddset(&s, SIGPIPE);
    if (sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) && !sigismember(&old_, SIGPIPE)) {
      const timespec zero{0, 0};
      while (sigtimedwait(&s, nullptr, &zero) < 0 && errno == EINTR) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeBlocked(const SigpipeBlocked&) = delete;
  SigpipeBlocked& operator=(const SigpipeBlocked&) = delete;

 private:
  sigset_t old_;
};

}  // namespace

DumpRequest request_dump(const safefs::Dir& dir, int rank, uid_t owner_uid) {
  using R = DumpRequest::Result;
  const auto name = contract::flight_pipe_name(rank);
  safefs::Fd path(::openat(dir.fd(), name.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
  if (!path) {
    if (errno == ENOENT) return {R::no_pipe, fmt::format("{} has no {} (no flight recorder pipe)", dir.path(), name)};
    return {R::failed, fmt::format("cannot open {}: {}", dir.path_of(name), std::strerror(errno))};
  }
  struct stat st {};
  if (::fstat(path.get(), &st) != 0)
    return {R::failed, fmt::format("cannot stat {}: {}", dir.path_of(name), std::strerror(errno))};
  if (S_ISLNK(st.st_mode))
    return {R::refused, fmt::format("{} is a symbolic link, not rank {}'s FIFO", dir.path_of(name), rank)};
  if (!S_ISFIFO(st.st_mode)) return {R::refused, fmt::format("{} is not a FIFO", dir.path_of(name))};
  if (st.st_uid != owner_uid) {
    return {R::refused, fmt::format("{} belongs to uid {}, not the job's {}", dir.path_of(name), st.st_uid, owner_uid)};
  }
  // That inode, and no other, opened to write; without a reader this fails at once (ENXIO).
  safefs::Fd fifo(::open(fmt::format("/proc/self/fd/{}", path.get()).c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC));
  if (!fifo) {
    if (errno == ENXIO)
      return {R::not_listening, fmt::format("rank {} does not read {} (gone, or not yet in NCCL)", rank, name)};
    return {R::failed, fmt::format("cannot open {} to write: {}", dir.path_of(name), std::strerror(errno))};
  }
  SigpipeBlocked guard;
  ssize_t n;
  do {
    n = ::write(fifo.get(), "d", 1);
  } while (n < 0 && errno == EINTR);
  if (n == 1) return {R::sent, {}};
  if (errno == EAGAIN) return {R::sent, "an earlier request is still unread"};  // one is pending: as good
  if (errno == EPIPE) return {R::not_listening, fmt::format("rank {} closed {}", rank, name)};
  return {R::failed, fmt::format("cannot write to {}: {}", dir.path_of(name), std::strerror(errno))};
}

std::vector<std::string> list_dumps(const safefs::Dir& dir) {
  std::vector<std::pair<int, std::string>> found;
  const int fd = ::dup(dir.fd());
  if (fd < 0) return {};
  DIR* d = ::fdopendir(fd);
  if (!d) {
    ::close(fd);
    return {};
  }
  ::rewinddir(d);
  while (auto* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (auto r = contract::flight_dump_rank(name); r && found.size() < kMaxDumps)
      found.emplace_back(*r, std::move(name));
  }
  ::closedir(d);
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& [r, n] : found) out.push_back(std::move(n));
  return out;
}

std::vector<RankDump> convert_dumps(const std::string& dir_path, const std::vector<std::string>& names,
                                    const ConvertRequest& req) {
  const bool all = names.empty();
  // Without names, nothing is known to be there: a failure is one error of no rank's.
  auto failed_all = [&names, all](const std::string& why) {
    std::vector<RankDump> out;
    if (all) out.emplace_back().error = why;
    for (const auto& n : names) {
      RankDump d;
      d.rank = contract::flight_dump_rank(n).value_or(-1);
      d.error = why;
      out.push_back(std::move(d));
    }
    return out;
  };
  if (req.python.empty()) return failed_all("no Python to read the dumps with");
  const auto path_var = req.env.count("PATH") ? req.env.at("PATH") : std::string("/usr/bin:/bin");
  const auto resolved = supervisor::resolve_executable(req.python.front(), path_var, req.workdir);
  if (!resolved) return failed_all(fmt::format("{} not found (PATH={})", req.python.front(), path_var));

  supervisor::SpawnSpec spec;
  spec.argv = req.python;
  spec.argv.front() = *resolved;
  // -I: no PYTHONPATH, no user site, no current folder on the path; -S: no site module at all,
  // so no .pth file of the environment's runs its line of code: the converter needs only the
  // standard library, and nothing of the job's is imported.
  for (const char* a : {"-I", "-S", "-c"}) spec.argv.emplace_back(a);
  spec.argv.emplace_back(convert_script());
  spec.argv.push_back(dir_path);
  if (all) spec.argv.emplace_back("--all");
  spec.argv.insert(spec.argv.end(), names.begin(), names.end());
  spec.env = req.env;
  spec.workdir = req.workdir;
  spec.run_as = req.run_as;
  supervisor::Bounded ran;
  try {
    ran = supervisor::run_bounded(spec, req.timeout, req.max_output, 4096);  // its own process group
  } catch (const supervisor::SpawnError& e) {
    return failed_all(fmt::format("cannot run {}: {}", *resolved, e.what()));
  }
  const auto& out = ran.out;
  const auto& err = ran.err;
  const bool timed_out = ran.timed_out, truncated = ran.out_truncated;

  // One line per dump; which rank a line is comes from its file's name (the converter's own
  // "rank" is not believed), and only a name asked for (or, listing, a dump's name) counts, once.
  std::map<std::string, RankDump> by_name;
  for (auto line : split(out, '\n')) {
    if (line.empty()) continue;
    // Its name, read with the reader's widest bound: a summary nested too deep still names its
    // rank, and parse_summary says what is wrong with it.
    std::string file;
    const auto named = parse_json(line.substr(0, std::min<std::size_t>(line.size(), kMaxSummaryBytes)), kJsonMaxDepth);
    if (const auto& j = named.value; j.is_object() && j.contains("file") && j["file"].is_string()) {
      file = j["file"].get<std::string>();
    }
    const auto rank = contract::flight_dump_rank(file);
    const bool wanted = all ? rank.has_value() && by_name.size() < kMaxDumps
                            : std::find(names.begin(), names.end(), file) != names.end();
    if (!wanted || by_name.count(file)) continue;
    auto d = parse_summary(line);
    d.rank = rank.value_or(-1);
    by_name.emplace(file, std::move(d));
  }
  // The job's interpreter wrote it: any bytes at all.
  const auto first_err = clean_text(trim(err.substr(0, err.find('\n'))), 256);
  const bool clean = !timed_out && !truncated && ran.status == 0;
  const std::string why = timed_out   ? fmt::format("the converter did not finish within {} ms", req.timeout.count())
                          : truncated ? fmt::format("the converter wrote more than {} bytes", req.max_output)
                                      : fmt::format("the converter gave no answer (exit status {}{})", ran.status,
                                                    first_err.empty() ? "" : ": " + first_err);
  std::vector<RankDump> result;
  if (all) {
    std::vector<std::pair<int, std::string>> order;
    for (const auto& [n, d] : by_name) order.emplace_back(d.rank, n);
    std::sort(order.begin(), order.end());
    for (const auto& [r, n] : order) result.push_back(std::move(by_name.at(n)));
    if (!clean) result.emplace_back().error = why;  // some dumps may be missing: say why
    return result;
  }
  for (const auto& n : names) {
    if (auto it = by_name.find(n); it != by_name.end()) {
      result.push_back(std::move(it->second));
      continue;
    }
    RankDump d;
    d.rank = contract::flight_dump_rank(n).value_or(-1);
    d.error = why;
    result.push_back(std::move(d));
  }
  return result;
}

std::optional<Finding> gather_flight(const safefs::Dir& dir, int world_size, const ConvertRequest& req) {
  const auto names = list_dumps(dir);
  if (names.empty()) return std::nullopt;
  auto finding = analyze(convert_dumps(dir.path(), names, req), world_size);
  log::get("hang")->debug("{} flight recorder dump{} in {}: {}", names.size(), names.size() == 1 ? "" : "s", dir.path(),
                          format_finding(finding));
  return finding;
}

}  // namespace ddp::hang
