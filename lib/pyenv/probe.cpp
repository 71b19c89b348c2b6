#include "pyenv/probe.hpp"

#include "common/log.hpp"
#include "common/safe_fs.hpp"
#include "common/strings.hpp"
#include "common/text.hpp"
#include "supervisor/run_bounded.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>

namespace ddp::pyenv {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr std::size_t kMaxStdout = 64 << 10;
constexpr std::size_t kMaxStderr = 4 << 10;
constexpr std::size_t kMaxEntries = 64;  // of the file cache: one per interpreter and env
constexpr std::uintmax_t kMaxCacheFile = 1 << 20;
// A line at most: a full file of them, the header and the newlines stay under kMaxCacheFile, which
// the next launch would refuse (a key holds the job's PYTHONPATH, LD_LIBRARY_PATH, ...).
constexpr std::size_t kMaxLine = (kMaxCacheFile - 64) / kMaxEntries - 1;
constexpr const char* kCacheHeader = R"({"version":3})";  // 3: the key holds env as pairs, bytes in hex

std::optional<std::int64_t> mtime_ns(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}

}  // namespace

facts::PythonFacts python_from_json(const json& o) {
  facts::PythonFacts f;
  f.interpreter = o.at("interpreter").get<std::string>();
  f.source = o.value("source", std::string());
  auto get = [&o](const char* k) -> std::optional<std::string> {
    if (auto it = o.find(k); it != o.end() && it->is_string()) return it->get<std::string>();
    return std::nullopt;
  };
  f.executable = get("executable");
  f.version = get("version");
  f.torch = get("torch");
  f.error = get("error");
  if (auto it = o.find("guessed"); it != o.end() && it->is_boolean()) f.guessed = it->get<bool>();
  return f;
}

namespace {
using facts::to_json;

// The variables that change which Python runs or what it finds.
bool python_variable(const std::string& k) {
  for (std::string_view p : {"PYTHON", "CONDA", "UV_", "PIP_"})
    if (starts_with(k, p)) return true;
  return k == "PATH" || k == "VIRTUAL_ENV" || k == "HOME" || k == "LD_LIBRARY_PATH";
}

// A path or variable in the cache key: as it is when it is UTF-8, else its bytes in hex, in an
// object no string can be mistaken for.
json key_part(const std::string& s) {
  if (valid_utf8(s)) return s;  // (a path or variable need not be: a folder named in Latin-1)
  std::string hex;
  for (unsigned char c : s) hex += fmt::format("{:02x}", c);
  return json{{"hex", hex}};
}

// What is shown of an interpreter (and carried in messages and the cache): UTF-8.
std::string shown(const std::string& s) {
  return valid_utf8(s) ? s : clean_text(s, s.size());
}

}  // namespace

facts::PythonFacts answer_of(facts::PythonFacts f) {
  f.source.clear();
  f.guessed = false;
  f.error.reset();
  return f;
}

facts::PythonFacts answered_from_cache(facts::PythonFacts asked, const facts::PythonFacts& cached) {
  asked.executable = cached.executable;
  asked.version = cached.version;
  asked.torch = cached.torch;
  asked.error.reset();
  return asked;
}

std::string cache_key(const ProbeRequest& req, const std::string& resolved) {
  json env = json::array();
  for (const auto& [k, v] : req.env)
    if (python_variable(k)) env.push_back({key_part(k), key_part(v)});
  json argv = json::array();
  for (const auto& a : req.choice.argv) argv.push_back(key_part(a));
  json k{{"argv", argv},
         {"resolved", key_part(resolved)},
         {"uid", req.run_as ? req.run_as->uid : ::geteuid()},
         {"workdir", key_part(req.workdir)},
         {"env", env}};
  return k.dump();
}

// The file: JSON Lines, `{"version":3}` then one `[KEY, ENTRY]` per line, oldest first. A launch
// looks up one key: it finds that line by its prefix and parses only it (a whole file of 64
// entries, each with its environment, took more instructions to parse than the rest of a launch).
ProbeCache::ProbeCache(std::optional<fs::path> file) : file_(std::move(file)) {
  if (!file_) return;
  std::error_code ec;
  const auto size = fs::file_size(*file_, ec);
  if (ec || size > kMaxCacheFile) return;  // none yet, or not ours to trust: start afresh
  std::ifstream in(*file_);
  std::string line;
  if (!std::getline(in, line) || line != kCacheHeader) return;  // another version's: start afresh
  while (std::getline(in, line)) {
    if (line.size() < 2 || line.front() != '[') continue;
    lines_.push_back(std::move(line));
  }
  if (lines_.size() > kMaxEntries) lines_.erase(lines_.begin(), lines_.end() - kMaxEntries);  // the newest
}

std::string ProbeCache::line_prefix(const std::string& key) {
  std::string prefix = "[";  // appended, not `"[" + ...`: GCC 12 warns (-Wrestrict) about that
  prefix += json(key).dump();
  prefix += ',';
  return prefix;
}

std::optional<ProbeCache::Entry> ProbeCache::entry(const std::string& key) const {
  const auto prefix = line_prefix(key);
  for (auto it = lines_.rbegin(); it != lines_.rend(); ++it) {
    if (it->compare(0, prefix.size(), prefix) != 0) continue;
    try {
      const auto j = json::parse(*it);
      Entry e{python_from_json(j.at(1).at("facts")), {}};
      for (const auto& s : j.at(1).at("stamps")) {
        // An integer only: a float's cast to an integer is undefined beyond its range.
        if (!s.at(1).is_number_integer()) return std::nullopt;
        e.stamps.emplace_back(s.at(0).get<std::string>(), s.at(1).get<std::int64_t>());
      }
      return e;
    } catch (const json::exception&) {
      return std::nullopt;  // a damaged line costs one probe, nothing more
    }
  }
  return std::nullopt;
}

std::optional<facts::PythonFacts> ProbeCache::find(const std::string& key) const {
  const auto e = entry(key);
  if (!e) return std::nullopt;
  for (const auto& [path, ns] : e->stamps)
    if (mtime_ns(path) != ns) return std::nullopt;
  return e->facts;
}

void ProbeCache::put(const std::string& key, const facts::PythonFacts& f, const std::vector<std::string>& stamp_paths) {
  json stamps = json::array();
  for (const auto& p : stamp_paths) {
    if (!valid_utf8(p)) return;  // a path the file cannot hold: not cached (probed each time)
    auto ns = mtime_ns(p);
    if (!ns) return;  // a folder that vanished meanwhile: do not cache what cannot be validated
    stamps.push_back({p, *ns});
  }
  std::string line;
  try {
    line = json::array({key, {{"facts", to_json(answer_of(f))}, {"stamps", stamps}}}).dump();
  } catch (const json::type_error&) {
    return;  // a field a strict dump refuses (not UTF-8): not cached, never thrown at the launch
  }
  if (line.size() > kMaxLine) return;  // not cached (probed each time), and no other entry goes
  const auto prefix = line_prefix(key);
  std::erase_if(lines_, [&](const std::string& l) { return l.compare(0, prefix.size(), prefix) == 0; });
  if (lines_.size() >= kMaxEntries) lines_.erase(lines_.begin());  // the oldest
  lines_.push_back(std::move(line));
  save();
}

void ProbeCache::save() const {
  if (!file_) return;
  std::error_code ec;
  fs::create_directories(file_->parent_path(), ec);
  const auto tmp = file_->string() + fmt::format(".{}.tmp", ::getpid());
  std::string text = kCacheHeader;
  text += '\n';
  for (const auto& l : lines_) {
    text += l;
    text += '\n';
  }
  // A new file of our own (never through a link or into one left there: the folder may be
  // another user's when ddpctl runs with their HOME), readable by us alone.
  ::unlink(tmp.c_str());  // one a crashed run of this pid left
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return;  // a cache we cannot write is only slower
  const bool written = safefs::write_all(fd, text);
  ::close(fd);
  if (!written) {
    fs::remove(tmp, ec);
    return;
  }
  fs::rename(tmp, *file_, ec);
  if (ec) fs::remove(tmp, ec);
  if (file_->filename() == "python.jsonl") fs::remove(file_->parent_path() / "python.json", ec);  // version 1's
}

// Root's only in a folder no other user can swap (safefs::usable_env_dir); else none.
std::optional<fs::path> default_cache_file() {
  std::optional<fs::path> dir;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x == '/') {
    dir = fs::path(x) / "ddpctl";
  } else if (const char* h = std::getenv("HOME"); h && *h == '/') {
    dir = fs::path(h) / ".cache" / "ddpctl";
  }
  if (!dir) return std::nullopt;
  const auto usable = safefs::usable_env_dir(dir->string());
  if (!usable) return std::nullopt;
  return fs::path(*usable) / "python.jsonl";
}

ProbeCache& process_cache(std::optional<fs::path> file) {
  static ProbeCache cache(std::move(file));
  return cache;
}

facts::PythonFacts probe_python(const ProbeRequest& req, ProbeCache* cache) {
  facts::PythonFacts f;
  f.interpreter = shown(join(req.choice.argv, " "));
  f.source = shown(req.choice.source);  // names the job file, whose path need not be UTF-8
  f.guessed = req.choice.guessed;
  const auto path = req.env.count("PATH") ? req.env.at("PATH") : std::string("/usr/bin:/bin");
  const auto resolved = supervisor::resolve_executable(req.choice.argv.at(0), path, req.workdir);
  if (!resolved) {
    f.error = shown(fmt::format("{} not found (PATH={}, workdir={})", req.choice.argv.at(0), path, req.workdir));
    return f;
  }
  if (req.choice.argv.size() == 1) f.interpreter = shown(*resolved);
  const auto key = cache_key(req, *resolved);
  if (cache)
    if (auto hit = cache->find(key)) return answered_from_cache(std::move(f), *hit);

  supervisor::SpawnSpec spec;
  spec.argv = req.choice.argv;
  spec.argv.at(0) = *resolved;
  spec.argv.push_back("-c");
  spec.argv.push_back(probe_script());
  spec.env = req.env;
  spec.workdir = req.workdir;
  spec.run_as = req.run_as;
  supervisor::Bounded ran;
  try {
    ran = supervisor::run_bounded(spec, req.timeout, kMaxStdout, kMaxStderr);
  } catch (const supervisor::SpawnError& e) {
    f.error = shown(fmt::format("cannot run {}: {}", *resolved, e.what()));
    return f;
  }
  auto answer = parse_probe_output(ran.out);
  answer.facts.interpreter = f.interpreter;
  answer.facts.source = f.source;
  answer.facts.guessed = f.guessed;
  if (ran.timed_out) {
    answer.facts.error = fmt::format("{} did not answer within {} ms", f.interpreter, req.timeout.count());
  } else if (answer.facts.error) {
    auto first = std::string(trim(ran.err.substr(0, ran.err.find('\n'))));
    *answer.facts.error += fmt::format(" (exit status {}{})", ran.status, first.empty() ? "" : ": " + first);
  }
  if (answer.facts.error) {
    // The interpreter's stderr and the parser's message quote bytes of any kind: shown cleaned.
    answer.facts.error = clean_text(*answer.facts.error, 1024);
    log::get("pyenv")->debug("python probe of {}: {}", f.interpreter, *answer.facts.error);
    return answer.facts;  // not cached: the next launch tries again
  }
  // The real interpreter behind a wrapper (`conda run ...`) is stamped through `executable`;
  // without it (a path that is not UTF-8) the answer could not be validated: not cached.
  if (!answer.facts.executable) return answer.facts;
  std::vector<std::string> stamps{*resolved, *answer.facts.executable};
  stamps.insert(stamps.end(), answer.site.begin(), answer.site.end());
  if (cache) cache->put(key, answer.facts, stamps);
  return answer.facts;
}

}  // namespace ddp::pyenv
