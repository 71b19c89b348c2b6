// SSH mode's pure decisions (see policy.hpp).
#include "ssh/policy.hpp"

#include "common/strings.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace ddp::ssh {

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

bool contains(const std::string& haystack, std::string_view needle) {
  return haystack.find(needle) != std::string::npos;
}

// ssh-keyscan / ssh-keygen -R name a non-default port as "[host]:port", as known_hosts does.
std::string known_hosts_name(const HostKeyFacts& f) {
  return f.port == 22 ? f.host : fmt::format("[{}]:{}", f.host, f.port);
}

std::string keyscan(const HostKeyFacts& f) {
  return f.port == 22 ? fmt::format("ssh-keyscan {}", shell_quote(f.host))
                      : fmt::format("ssh-keyscan -p {} {}", f.port, shell_quote(f.host));
}

}  // namespace

HostKeyDecision decide_host_key(KnownHost state, bool accept_new, const HostKeyFacts& f) {
  const auto who = f.node == f.host ? f.node : fmt::format("{} ({})", f.node, f.host);
  switch (state) {
    case KnownHost::ok:
      return {true, false, ""};
    case KnownHost::unknown:
    case KnownHost::no_file:
      if (accept_new) {
        return {true, true,
                fmt::format("{}: new host key {} {} added to {} (--ssh-accept-new)", who, f.key_type, f.fingerprint,
                            f.known_hosts)};
      }
      return {false, false,
              fmt::format("{}: unknown host key {} {} (not in {}). If that is the host's key (check on the host: "
                          "ssh-keygen -lf /etc/ssh/ssh_host_{}_key.pub), trust it with `{} >> {}`, by one `ssh {}`, "
                          "or launch once with --ssh-accept-new",
                          who, f.key_type, f.fingerprint, f.known_hosts,
                          f.key_type.starts_with("ssh-") ? f.key_type.substr(4) : f.key_type, keyscan(f), f.known_hosts,
                          f.port == 22 ? f.host : fmt::format("-p {} {}", f.port, f.host))};
    case KnownHost::changed:
    case KnownHost::other_type:
      // Never accepted automatically, as with OpenSSH: this is what an attack looks like.
      return {
          false, false,
          fmt::format("{}: HOST KEY CHANGED: it now offers {} {}, which does not match {}{}. Someone may be "
                      "intercepting the connection, or the host was reinstalled; if you know the change is expected, "
                      "remove the old key with `ssh-keygen -f {} -R {}` and launch again",
                      who, f.key_type, f.fingerprint, f.known_hosts,
                      state == KnownHost::other_type ? " (it holds a key of another type for this host)" : "",
                      f.known_hosts, shell_quote(known_hosts_name(f)))};
    case KnownHost::error:
      break;
  }
  return {false, false, fmt::format("{}: cannot check the host key against {}", who, f.known_hosts)};
}

ConnectFailure classify_connect_error(const std::string& libssh_error) {
  const auto e = lower(libssh_error);
  if (contains(e, "timeout") || contains(e, "timed out")) return ConnectFailure::timeout;
  if (contains(e, "connection refused")) return ConnectFailure::refused;
  if (contains(e, "no route") || contains(e, "unreachable") || contains(e, "failed to resolve") ||
      contains(e, "name or service not known") || contains(e, "could not resolve")) {
    return ConnectFailure::unreachable;
  }
  // What MaxStartups looks like from the client: sshd closes (or resets) the connection before
  // or during the key exchange.
  if (contains(e, "connection reset") || contains(e, "socket error: disconnected") ||
      contains(e, "remote host closed") || contains(e, "connection closed") || contains(e, "socket error: success") ||
      contains(e, "broken pipe") || contains(e, "disconnected")) {
    return ConnectFailure::dropped;
  }
  return ConnectFailure::other;
}

std::string connect_hint(ConnectFailure failure, const std::string& host, std::uint16_t port, const std::string& user) {
  // Port 0: none given, so ~/.ssh/config's (or 22): said as ssh itself would be run.
  const auto target = user.empty() ? host : fmt::format("{}@{}", user, host);
  const auto ssh = port == 0 ? fmt::format("ssh {}", target) : fmt::format("ssh -p {} {}", port, target);
  const auto where = port == 0 ? host : fmt::format("{}:{}", host, port);
  switch (failure) {
    case ConnectFailure::refused:
      return fmt::format("; no sshd listening on {}? check that `{}` works", where, ssh);
    case ConnectFailure::unreachable:
      return fmt::format("; check the host name and that `{}` works", ssh);
    case ConnectFailure::timeout:
      return fmt::format("; is {} up, and its SSH port open? check that `{}` works (--ssh-timeout to wait longer)",
                         host, ssh);
    default:
      return {};
  }
}

std::optional<Millis> retry_after(ConnectFailure failure, int attempt, double jitter, const RetryPolicy& p) {
  if (failure != ConnectFailure::dropped || attempt >= p.max_attempts) return std::nullopt;
  // 2^(attempt - 1) as a shift: attempt counts from 1, and ddpctl links no libm for one pow().
  const double base =
      static_cast<double>(p.initial.count()) * static_cast<double>(1ull << std::clamp(attempt - 1, 0, 62));
  const double capped = std::min(base, static_cast<double>(p.max.count()));
  // Between half and all of the capped delay, so a batch dropped together comes back spread out.
  const double j = std::clamp(jitter, 0.0, 1.0);
  return Millis(static_cast<Millis::rep>(capped * (0.5 + 0.5 * j)));
}

std::string shell_quote(const std::string& s) {
  if (!s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char c) {
        return std::isalnum(c) || c == '/' || c == '.' || c == '_' || c == '-' || c == '=' || c == ':' || c == ',';
      })) {
    return s;
  }
  std::string out = "'";
  for (char c : s) {
    if (c == '\'')
      out += "'\\''";
    else
      out += c;
  }
  return out + "'";
}

std::string cache_dir(const std::string& sha256) {
  return fmt::format(".cache/ddpctl/{}", sha256);
}
std::string exec_upload_command(const std::string& remote_dir, const std::string& name, std::uint64_t bytes,
                                const std::string& sha256) {
  const auto dir = shell_quote(remote_dir);
  const auto tmp = shell_quote(fmt::format("{}/.{}.part", remote_dir, name));
  const auto dest = shell_quote(fmt::format("{}/{}", remote_dir, name));
  return fmt::format(
      "cd && umask 077 && mkdir -p -- {0} && chmod 700 -- {0} && rm -f -- {1} && cat > {1} && "
      "[ \"$(wc -c < {1})\" -eq {3} ] && printf '%s  %s\\n' {4} {1} | sha256sum -c --status && chmod 700 -- {1} && "
      "mv -f -- {1} {2}",
      dir, tmp, dest, bytes, shell_quote(sha256));
}
std::string cached_agent(const std::string& sha256) {
  return cache_dir(sha256) + "/ddp-agentd";
}

std::string probe_command(const std::string& our_sha256) {
  // Each answer on its own tagged line; a missing tool leaves its line empty rather than
  // failing the probe. Works under any POSIX login shell.
  const auto cached = shell_quote(cached_agent(our_sha256));
  return fmt::format(
      "cd; echo \"arch=$(uname -m)\"; "
      "echo \"version=$(ddp-agentd --version 2>/dev/null | head -n1)\"; "
      "set -- $SSH_CONNECTION; echo \"server=$3\"; "
      "if [ -x {0} ]; then echo \"cached=$(sha256sum {0} 2>/dev/null | cut -d' ' -f1)\"; "
      "echo \"cachedrun=$({0} --version 2>&1 | head -n1)\"; else echo cached=; echo cachedrun=; fi",
      cached);
}

Probe parse_probe(const std::string& output) {
  Probe p;
  int seen = 0;
  for (auto line : split(output, '\n')) {
    line = trim(line);
    auto eq = line.find('=');
    if (eq == std::string::npos) continue;
    const auto key = std::string(line.substr(0, eq));
    const auto value = std::string(trim(line.substr(eq + 1)));
    if (key == "arch")
      p.arch = value, seen |= 1;
    else if (key == "version")
      p.path_version = value, seen |= 2;
    else if (key == "server")
      p.server_address = value, seen |= 4;
    else if (key == "cached")
      p.cached_sha256 = value, seen |= 8;
    else if (key == "cachedrun")
      p.cached_runs = value, seen |= 16;
  }
  if (seen != 31) {
    throw std::runtime_error(
        fmt::format("unexpected answer to the probe (is the login shell POSIX?): '{}'", output.substr(0, 300)));
  }
  return p;
}

AgentChoice choose_agent(const Probe& probe, const std::string& our_version, const std::string& our_arch,
                         const std::string& our_sha256) {
  using K = AgentChoice::Kind;
  if (probe.path_version == our_version) return {K::on_path, "ddp-agentd", fmt::format("{} on its PATH", our_version)};
  const auto why_not_path = probe.path_version.empty()
                                ? std::string("no ddp-agentd on its PATH")
                                : fmt::format("its PATH has {}, we are {}", probe.path_version, our_version);
  if (probe.arch != our_arch) {
    return {K::impossible, "",
            fmt::format("{}, and its architecture ({}) differs from ours ({}), so ours cannot be uploaded: install "
                        "{} there",
                        why_not_path, probe.arch.empty() ? "unknown" : probe.arch, our_arch, our_version)};
  }
  if (probe.cached_sha256 == our_sha256 && probe.cached_runs == our_version) {
    return {K::cached, "~/" + cached_agent(our_sha256), fmt::format("{}; using our cached copy", why_not_path)};
  }
  return {K::upload, "~/" + cached_agent(our_sha256), fmt::format("{}; uploading ours", why_not_path)};
}

std::string agent_command(const std::string& program, const std::string& node_name, bool verbose,
                          const std::string& connect_back) {
  // "~/..." must stay outside quotes for the shell to expand it.
  const auto prog = program.starts_with("~/") ? "~/" + shell_quote(program.substr(2)) : shell_quote(program);
  return fmt::format("exec {} --oneshot --stdio --name {}{}{}", prog, shell_quote(node_name),
                     connect_back.empty() ? "" : " --connect " + shell_quote(connect_back), verbose ? " -v" : "");
}

std::vector<std::string> LineSplitter::feed(std::string_view bytes) {
  std::vector<std::string> lines;
  for (char c : bytes) {
    if (c == '\n') {
      lines.push_back(std::move(partial_));
      partial_.clear();
    } else {
      partial_.push_back(c);
      if (partial_.size() >= max_) {
        lines.push_back(std::move(partial_));
        partial_.clear();
      }
    }
  }
  return lines;
}

std::optional<std::string> LineSplitter::flush() {
  if (partial_.empty()) return std::nullopt;
  auto out = std::move(partial_);
  partial_.clear();
  return out;
}

}  // namespace ddp::ssh
