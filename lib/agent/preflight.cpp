#include "agent/preflight.hpp"

#include "common/host.hpp"
#include "common/log.hpp"
#include "common/strings.hpp"
#include "common/text.hpp"
#include "container/container.hpp"
#include "container/runtime.hpp"
#include "hang/flight_gather.hpp"
#include "pyenv/probe.hpp"
#include "supervisor/process.hpp"

#include <fmt/format.h>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/read.hpp>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <iostream>
#include <iterator>
#include <vector>

namespace ddp::agent {

namespace asio = boost::asio;
using nlohmann::json;

json preflight_request(const std::string& mode, const std::string& job_id, const net::JobPayload& payload,
                       const contract::Env& client_env, const std::string& cwd,
                       const std::optional<container::Confinement>& confine) {
  // The helper runs as root: nothing that changes what it (or the runtime it runs) loads.
  json r{{"mode", mode},
         {"job_id", job_id},
         {"spec", net::to_json(payload)},
         {"env", contract::without_loader_variables(client_env)},
         {"cwd", cwd}};
  if (confine) r["confine"] = {{"uid", confine->uid}, {"gid", confine->gid}, {"groups", confine->groups}};
  return r;
}

// A node's flight recorder summaries in attempt_finished: well inside a frame (1 MiB) and the
// helper's answer (1 MiB) with the rest of the message.
constexpr std::size_t kMaxFlightBytes = 512u << 10;

// The helper's answer: a byte of invalid UTF-8 (a converter's stderr, a runtime's message)
// becomes U+FFFD rather than a throw, which outside the try below would terminate the helper.
static std::string answer_text(const json& answer) {
  return answer.dump(-1, ' ', false, json::error_handler_t::replace);
}

int run_preflight_helper(std::istream& in, std::ostream& out) {
  json answer{{"digest", ""}, {"repo_digest", ""}, {"error", ""}, {"warning", ""}};
  try {
    const auto req = json::parse(std::string(std::istreambuf_iterator<char>(in), {}));
    const auto payload = net::payload_from_json(req.at("spec"));
    const auto env = req.at("env").get<contract::Env>();
    const auto cwd = req.at("cwd").get<std::string>();
    const bool job = req.at("mode").get<std::string>() == "job";
    const auto& spec = payload.spec;
    if (req.at("mode").get<std::string>() == "python") {
      // A host job's interpreter, as its workers' user, with their environment and workdir.
      pyenv::ProbeRequest probe;
      probe.choice = pyenv::choose_interpreter(spec);
      probe.env = env;
      probe.workdir = cwd;
      if (auto it = req.find("run_as"); it != req.end())
        probe.run_as = supervisor::RunAs{it->at("uid").get<uid_t>(), it->at("gid").get<gid_t>(),
                                         it->at("groups").get<std::vector<gid_t>>()};
      answer["python"] = facts::to_json(pyenv::probe_python(probe, nullptr));
      out << answer_text(answer) << "\n";
      return 0;
    }
    if (req.at("mode").get<std::string>() == "flight") {
      // A failed round's NCCL flight recorder dumps (lib/hang), read by the converter with the
      // job's Python as its workers' user; the folder is listed by the converter too, never
      // here. Only this node's ranks count, and the answer fits one frame.
      hang::ConvertRequest convert;
      convert.python = pyenv::choose_interpreter(spec).argv;
      convert.env = env;
      convert.workdir = cwd;
      if (auto it = req.find("run_as"); it != req.end())
        convert.run_as = supervisor::RunAs{it->at("uid").get<uid_t>(), it->at("gid").get<gid_t>(),
                                           it->at("groups").get<std::vector<gid_t>>()};
      const int first = req.at("rank_base").get<int>(), count = req.at("local_world_size").get<int>();
      std::vector<hang::RankDump> dumps;
      for (auto& d : hang::convert_dumps(req.at("attempt_dir").get<std::string>(), {}, convert)) {
        if (d.rank < 0 && !d.error.empty())
          answer["warning"] = clean_text(d.error, 1024);
        else if (d.rank >= first && d.rank < first + count)
          dumps.push_back(std::move(d));
      }
      hang::fit_summaries(dumps, kMaxFlightBytes);
      answer["flight"] = nlohmann::json::array();
      for (const auto& d : dumps) answer["flight"].push_back(hang::to_json(d));
      out << answer_text(answer) << "\n";
      return 0;
    }
    if (!spec.container) throw std::invalid_argument("the job has no container");
    const auto& cs = *spec.container;
    std::optional<container::Confinement> confine;
    if (req.contains("confine")) {
      const auto& c = req.at("confine");
      confine = container::Confinement{c.at("uid").get<unsigned>(), c.at("gid").get<unsigned>(),
                                       c.at("groups").get<std::vector<unsigned>>(), ""};
      if (auto why = container::confinement_problem(cs)) throw container::ContainerError(*why);
    }
    auto id = container::prepare_image(cs, env, cwd, job);
    answer["digest"] = id.digest;
    answer["repo_digest"] = id.repo_digest;
    if (job) {
      container::sweep_stale(cs.runtime, env);
      const auto argv0 = contract::worker_argv(spec).at(0);
      if (auto w = container::check_command_in_image(
              container::with_absolute_mounts(cs, cwd), argv0, container::worker_path(spec), env,
              container::check_container_name(req.at("job_id").get<std::string>(), ::getpid()), confine)) {
        answer["warning"] = *w;
      }
    }
  } catch (const container::ContainerError& e) {
    answer["error"] = e.what();
  } catch (const std::exception& e) {
    answer["error"] = fmt::format("the preflight's request is malformed: {}", e.what());
  }
  out << answer_text(answer) << "\n";
  return 0;
}

struct PreflightRun::State {
  explicit State(asio::io_context& io) : out(io), err(io) {}
  pid_t pid = -1;
  asio::posix::stream_descriptor out, err;
  std::array<char, 4096> out_buf{}, err_buf{};
  std::string out_text, err_text;
  int open_streams = 2;
  bool finished = false;
  std::function<void(const json&)> done;
};

namespace {

constexpr std::size_t kMaxAnswer = 1 << 20;

void finish(const std::shared_ptr<PreflightRun::State>& s) {
  if (s->finished) return;
  s->finished = true;
  auto log = log::get("agent");
  std::size_t start = 0;
  while (start < s->err_text.size()) {  // the helper's own log lines (a pull's progress)
    auto end = s->err_text.find('\n', start);
    if (end == std::string::npos) end = s->err_text.size();
    if (end > start) log->info("preflight: {}", s->err_text.substr(start, end - start));
    start = end + 1;
  }
  json answer;
  try {
    answer = json::parse(s->out_text);
  } catch (const json::exception&) {
    answer = {{"error", fmt::format("the container preflight (pid {}) ended without an answer", s->pid)}};
  }
  auto done = std::move(s->done);
  if (done) done(answer);
}

void read_some(const std::shared_ptr<PreflightRun::State>& s, bool stdout_stream) {
  auto& sd = stdout_stream ? s->out : s->err;
  auto& buf = stdout_stream ? s->out_buf : s->err_buf;
  sd.async_read_some(asio::buffer(buf), [s, stdout_stream, &buf](boost::system::error_code ec, std::size_t n) {
    if (s->finished) return;
    if (!ec) {
      auto& text = stdout_stream ? s->out_text : s->err_text;
      if (text.size() < kMaxAnswer) text.append(buf.data(), n);
      return read_some(s, stdout_stream);
    }
    if (--s->open_streams == 0) finish(s);
  });
}

}  // namespace

std::shared_ptr<PreflightRun> PreflightRun::start(asio::io_context& io, const std::string& exe, const json& request,
                                                  std::function<void(const json&)> done) {
  auto s = std::make_shared<State>(io);
  s->done = std::move(done);
  supervisor::SpawnSpec spec;
  spec.argv = {exe, "preflight"};
  // The helper's own environment is the agent's, never the job's: the request's env (the job's
  // `env:` among it) is what it passes to the commands it runs for the job, as their user; in
  // root's own, a job's DDP_NO_CGROUP once took the helper's children out of their cgroup.
  spec.env = contract::without_loader_variables(own_environment());
  spec.workdir.assign(1, '/');
  spec.stdin_pipe = true;
  auto sp = supervisor::spawn(spec);  // own process group, dies with us
  s->pid = sp.pid;
  // The request is small and the helper reads it whole before anything else.
  const auto text = request.dump();
  std::size_t off = 0;
  while (off < text.size()) {
    const ssize_t n = ::write(sp.stdin_fd, text.data() + off, text.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    off += static_cast<std::size_t>(n);
  }
  ::close(sp.stdin_fd);
  s->out.assign(sp.stdout_fd);
  s->err.assign(sp.stderr_fd);
  read_some(s, true);
  read_some(s, false);
  return std::shared_ptr<PreflightRun>(new PreflightRun(s));
}

namespace {
std::vector<pid_t> cancelled_pids;  // the agent's loop thread only
}  // namespace

bool PreflightRun::was_cancelled(pid_t pid) {
  auto it = std::find(cancelled_pids.begin(), cancelled_pids.end(), pid);
  if (it == cancelled_pids.end()) return false;
  cancelled_pids.erase(it);
  return true;
}

void PreflightRun::cancel() {
  if (!state_ || state_->finished) return;
  state_->finished = true;
  state_->done = nullptr;
  // Remembered only while not yet reaped (alive, or a zombie): the reap then forgets it.
  if (::kill(state_->pid, 0) == 0) cancelled_pids.push_back(state_->pid);
  ::kill(-state_->pid, SIGKILL);  // the helper and the runtime commands it started
  boost::system::error_code ignored;
  state_->out.close(ignored);
  state_->err.close(ignored);
}

PreflightRun::~PreflightRun() {
  cancel();
}

}  // namespace ddp::agent
