#include "common/log.hpp"

#include "common/journal.hpp"
#include "common/strings.hpp"
#include "common/systemd.hpp"
#include "common/text.hpp"

#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <sys/stat.h>
#include <sys/uio.h>

#include <cctype>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>

namespace ddp::log {
namespace {

// journald's native protocol (sd_journal_sendv): one entry per line with its fields; a line the
// journal refuses goes to stderr as before.
class JournalSink : public spdlog::sinks::base_sink<std::mutex> {
 public:
  JournalSink(const systemd::Api& sd, std::shared_ptr<spdlog::sinks::sink> fallback)
      : sd_(sd), fallback_(std::move(fallback)) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    const std::string_view text(msg.payload.data(), msg.payload.size());
    std::vector<std::string> fields{
        fmt::format("MESSAGE={}", text), fmt::format("PRIORITY={}", priority(msg.level)),
        fmt::format("DDP_SUBSYSTEM={}", std::string_view(msg.logger_name.data(), msg.logger_name.size()))};
    for (auto& [k, v] : journal_fields(text)) fields.push_back(fmt::format("{}={}", k, v));
    std::vector<iovec> iov;
    for (auto& f : fields) iov.push_back({f.data(), f.size()});
    if (sd_.journal_sendv(iov.data(), static_cast<int>(iov.size())) < 0) fallback_->log(msg);
  }
  void flush_() override {}

 private:
  static int priority(spdlog::level::level_enum l) {
    switch (l) {
      case spdlog::level::trace:
      case spdlog::level::debug:
        return 7;
      case spdlog::level::info:
        return 6;
      case spdlog::level::warn:
        return 4;
      case spdlog::level::err:
        return 3;
      default:
        return 2;
    }
  }
  const systemd::Api& sd_;
  std::shared_ptr<spdlog::sinks::sink> fallback_;
};

std::shared_ptr<spdlog::sinks::sink> make_sink() {
  auto stderr_sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  struct stat st {};
  if (::fstat(2, &st) == 0 &&
      is_journal_stream(std::getenv("JOURNAL_STREAM"), static_cast<unsigned long long>(st.st_dev),
                        static_cast<unsigned long long>(st.st_ino))) {
    // Without libsystemd the lines stay on stderr, which the journal records too.
    if (const auto* sd = systemd::api()) return std::make_shared<JournalSink>(*sd, stderr_sink);
  }
  return stderr_sink;
}

struct Registry {
  std::mutex mu;
  std::map<std::string, std::shared_ptr<spdlog::logger>, std::less<>> loggers;
  std::shared_ptr<spdlog::sinks::sink> sink = make_sink();
  spdlog::level::level_enum level = spdlog::level::info;
  std::set<std::string, std::less<>> subsystems;  // empty: all

  spdlog::level::level_enum level_for(std::string_view name) const {
    if (!subsystems.empty() && !subsystems.contains(name) && level < spdlog::level::warn) {
      return spdlog::level::warn;
    }
    return level;
  }
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

void configure_from_env() {
  auto& r = registry();
  std::lock_guard lock(r.mu);
  if (const char* lv = std::getenv("DDP_LOG_LEVEL")) {
    r.level = spdlog::level::from_str(lv);
  }
  r.subsystems.clear();
  if (const char* ss = std::getenv("DDP_LOG_SUBSYS")) {
    for (auto& s : split(ss, ',')) {
      if (!s.empty()) r.subsystems.insert(std::string(s));
    }
  }
  for (auto& [name, logger] : r.loggers) logger->set_level(r.level_for(name));
}

void set_level(spdlog::level::level_enum level) {
  auto& r = registry();
  std::lock_guard lock(r.mu);
  r.level = level;
  for (auto& [name, logger] : r.loggers) logger->set_level(r.level_for(name));
}

std::shared_ptr<spdlog::logger> get(std::string_view subsystem) {
  auto& r = registry();
  static std::once_flag once;
  std::call_once(once, [] { configure_from_env(); });
  std::lock_guard lock(r.mu);
  if (auto it = r.loggers.find(subsystem); it != r.loggers.end()) return it->second;
  auto logger = std::make_shared<spdlog::logger>(std::string(subsystem), r.sink);
  logger->set_pattern("ddpctl %^%l%$ [%n] %v");
  logger->set_level(r.level_for(subsystem));
  r.loggers.emplace(std::string(subsystem), logger);
  return logger;
}

RelayedLine relay_line(std::string_view line) {
  using L = RelayedLine::Level;
  static constexpr std::pair<std::string_view, L> kLevels[] = {
      {"ddpctl trace ", L::debug},  {"ddpctl debug ", L::debug}, {"ddpctl info ", L::info},
      {"ddpctl warning ", L::warn}, {"ddpctl error ", L::error}, {"ddpctl critical ", L::error}};
  for (const auto& [prefix, level] : kLevels) {
    if (line.starts_with(prefix)) return {level, clean_text(line.substr(prefix.size()), kMaxRelayedLineBytes, "\t")};
  }
  return {L::warn, clean_text(line, kMaxRelayedLineBytes, "\t")};
}

std::vector<std::pair<std::string, std::string>> journal_fields(std::string_view m) {
  std::vector<std::pair<std::string, std::string>> out;
  if (!m.starts_with("job ")) return out;
  m.remove_prefix(4);
  const auto id_end = m.find_first_of(" :");
  if (m.empty() || id_end == 0) return out;
  out.emplace_back("DDP_JOB_ID", std::string(m.substr(0, id_end)));
  if (id_end == std::string_view::npos) return out;
  m.remove_prefix(id_end);
  // The run of digits at the front of m, taken off it ("" when none).
  auto number = [&m] {
    std::size_t n = 0;
    while (n < m.size() && std::isdigit(static_cast<unsigned char>(m[n]))) ++n;
    std::string d(m.substr(0, n));
    m.remove_prefix(n);
    return d;
  };
  if (m.starts_with(" round ")) {
    m.remove_prefix(7);
    if (auto r = number(); !r.empty()) out.emplace_back("DDP_ROUND", r);
  }
  if (m.starts_with(": rank ")) {
    m.remove_prefix(7);
    if (auto r = number(); !r.empty() && (m.empty() || m.front() == ' ')) out.emplace_back("DDP_RANK", r);
  }
  return out;
}

bool is_journal_stream(const char* journal_stream, unsigned long long dev, unsigned long long ino) {
  if (!journal_stream || !*journal_stream) return false;
  return std::string_view(journal_stream) == fmt::format("{}:{}", dev, ino);
}

}  // namespace ddp::log
