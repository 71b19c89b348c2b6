// StartTransientUnit through sd-bus (see systemd.hpp).
#include "jobunit/systemd.hpp"

#include <fmt/format.h>
#include <systemd/sd-bus.h>
#include <systemd/sd-daemon.h>

#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace ddp::jobunit {

namespace {

// Frees what sd-bus hands out, on every path.
struct MessagePtr {
  sd_bus_message* m = nullptr;
  ~MessagePtr() { sd_bus_message_unref(m); }
};
struct ErrorGuard {
  sd_bus_error e = SD_BUS_ERROR_NULL;
  ~ErrorGuard() { sd_bus_error_free(&e); }
};

void check(int rc, const char* what) {
  if (rc < 0) throw UnitError(fmt::format("building the StartTransientUnit call ({}): {}", what, std::strerror(-rc)));
}

// One (sv) entry of the property array.
void append(sd_bus_message* m, const Property& p) {
  check(sd_bus_message_open_container(m, 'r', "sv"), "open");
  check(sd_bus_message_append(m, "s", p.name.c_str()), p.name.c_str());
  std::visit(
      [&](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, bool>) {
          check(sd_bus_message_append(m, "v", "b", static_cast<int>(v)), p.name.c_str());
        } else if constexpr (std::is_same_v<T, std::string>) {
          check(sd_bus_message_append(m, "v", "s", v.c_str()), p.name.c_str());
        } else if constexpr (std::is_same_v<T, std::uint64_t>) {
          check(sd_bus_message_append(m, "v", "t", v), p.name.c_str());
        } else if constexpr (std::is_same_v<T, Fd>) {
          check(sd_bus_message_append(m, "v", "h", v.fd), p.name.c_str());
        } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          check(sd_bus_message_open_container(m, 'v', "as"), p.name.c_str());
          check(sd_bus_message_open_container(m, 'a', "s"), p.name.c_str());
          for (const auto& s : v) check(sd_bus_message_append(m, "s", s.c_str()), p.name.c_str());
          check(sd_bus_message_close_container(m), p.name.c_str());
          check(sd_bus_message_close_container(m), p.name.c_str());
        } else {  // std::vector<Exec>: a(sasb)
          check(sd_bus_message_open_container(m, 'v', "a(sasb)"), p.name.c_str());
          check(sd_bus_message_open_container(m, 'a', "(sasb)"), p.name.c_str());
          for (const auto& e : v) {
            check(sd_bus_message_open_container(m, 'r', "sasb"), p.name.c_str());
            check(sd_bus_message_append(m, "s", e.path.c_str()), p.name.c_str());
            check(sd_bus_message_open_container(m, 'a', "s"), p.name.c_str());
            for (const auto& a : e.argv) check(sd_bus_message_append(m, "s", a.c_str()), p.name.c_str());
            check(sd_bus_message_close_container(m), p.name.c_str());
            check(sd_bus_message_append(m, "b", static_cast<int>(e.ignore_failure)), p.name.c_str());
            check(sd_bus_message_close_container(m), p.name.c_str());
          }
          check(sd_bus_message_close_container(m), p.name.c_str());
          check(sd_bus_message_close_container(m), p.name.c_str());
        }
      },
      p.value);
  check(sd_bus_message_close_container(m), "close");
}

}  // namespace

namespace {

// systemd's own socket, which PID 1 serves to root without a bus daemon (systemctl uses it as
// root too). A minimal Debian has systemd but no dbus-daemon: without this, the packaged agent
// could not start its jobs' units there.
constexpr const char* kPrivatePath = "/run/systemd/private";

int open_private(sd_bus** out) {
  sd_bus* bus = nullptr;
  int rc = sd_bus_new(&bus);
  if (rc < 0) return rc;
  if ((rc = sd_bus_set_address(bus, fmt::format("unix:path={}", kPrivatePath).c_str())) < 0 ||
      (rc = sd_bus_start(bus)) < 0) {
    sd_bus_unref(bus);
    return rc;
  }
  *out = bus;
  return 0;
}

}  // namespace

Manager::Manager() {
  connect();
}

void Manager::connect() {
  sd_bus_flush_close_unref(bus_);
  bus_ = nullptr;
  // An explicit DBUS_SYSTEM_BUS_ADDRESS is the admin's (or a test's) choice: that bus only.
  const char* explicit_address = std::getenv("DBUS_SYSTEM_BUS_ADDRESS");
  int private_rc = 0;
  if ((!explicit_address || !*explicit_address) && ::geteuid() == 0) {
    private_rc = open_private(&bus_);
    if (private_rc >= 0) return;
    bus_ = nullptr;
  }
  const int rc = sd_bus_open_system(&bus_);
  if (rc < 0) {
    bus_ = nullptr;
    throw UnitError(private_rc < 0 ? fmt::format("cannot reach systemd: neither its socket {} ({}) nor the system bus "
                                                 "({}) answers",
                                                 kPrivatePath, std::strerror(-private_rc), std::strerror(-rc))
                                   : fmt::format("cannot reach the system bus: {}", std::strerror(-rc)));
  }
}

Manager::~Manager() {
  sd_bus_flush_close_unref(bus_);
}

std::string Manager::start(const UnitRequest& r) {
  // systemd's socket closes when PID 1 re-executes (an upgrade of systemd): connect again once.
  if (bus_ && sd_bus_is_open(bus_) <= 0) connect();
  try {
    return call(r);
  } catch (const Disconnected&) {
    connect();
    return call(r);
  }
}

std::string Manager::call(const UnitRequest& r) {
  MessagePtr call, reply;
  ErrorGuard err;
  check(sd_bus_message_new_method_call(bus_, &call.m, "org.freedesktop.systemd1", "/org/freedesktop/systemd1",
                                       "org.freedesktop.systemd1.Manager", "StartTransientUnit"),
        "method call");
  check(sd_bus_message_append(call.m, "ss", r.name.c_str(), "fail"), "name");
  check(sd_bus_message_open_container(call.m, 'a', "(sv)"), "properties");
  for (const auto& p : r.properties) append(call.m, p);
  check(sd_bus_message_close_container(call.m), "properties");
  check(sd_bus_message_append(call.m, "a(sa(sv))", 0), "auxiliary units");
  constexpr std::uint64_t kTimeoutUsec = 30'000'000;  // systemd answers at once unless it is stuck
  // sd_bus_call sends, then waits in poll(), which any signal to this process interrupts (a
  // worker's SIGCHLD, say): the call then fails with EINTR although PID 1 goes on to create the
  // unit. Signals are held for the wait and delivered right after it.
  const int rc = [&] {
    sigset_t all, old;
    sigfillset(&all);
    ::pthread_sigmask(SIG_BLOCK, &all, &old);
    const int r = sd_bus_call(bus_, call.m, kTimeoutUsec, &err.e, &reply.m);
    ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
    return r;
  }();
  if (rc == -ENOTCONN || rc == -ECONNRESET) throw Disconnected(std::strerror(-rc));
  if (rc < 0) {
    throw UnitError(fmt::format("systemd refused the job's unit {}: {}{}", r.name,
                                err.e.name ? fmt::format("{}: ", err.e.name) : "",
                                err.e.message ? err.e.message : std::strerror(-rc)));
  }
  const char* job = nullptr;
  if (sd_bus_message_read(reply.m, "o", &job) < 0 || !job) {
    throw UnitError(fmt::format("systemd's answer to starting {} holds no job", r.name));
  }
  return job;
}

std::unique_ptr<Manager> choose(Mode mode, std::string& why) {
  if (mode == Mode::fork) {
    why = "job_units: fork";
    return nullptr;
  }
  if (mode == Mode::automatic) {
    const char* inv = std::getenv("INVOCATION_ID");
    if (!inv || !*inv) {
      why = "not started by systemd ($INVOCATION_ID is unset)";
      return nullptr;
    }
    if (sd_booted() <= 0) {
      why = "systemd is not the init system here";
      return nullptr;
    }
  }
  try {
    auto m = std::make_unique<Manager>();
    why = mode == Mode::systemd ? "job_units: systemd" : "ddp-agentd is a systemd service";
    return m;
  } catch (const UnitError& e) {
    // Under systemd a forked job would inherit the agent unit's sandbox: refuse to start.
    throw UnitError(
        fmt::format("{}, but {}; set job_units: fork in agent.yaml to run jobs as children of the "
                    "agent (inside its unit's sandbox)",
                    mode == Mode::systemd ? "job_units: systemd" : "ddp-agentd runs as a systemd service", e.what()));
  }
}

std::vector<ResourceLimit> own_limits() {
  std::vector<ResourceLimit> out;
  auto get = [&](int resource, const char* name) {
    struct rlimit l {};
    if (::getrlimit(resource, &l) != 0) return;
    auto conv = [](rlim_t v) { return v == RLIM_INFINITY ? UINT64_MAX : static_cast<std::uint64_t>(v); };
    out.push_back({name, conv(l.rlim_cur), conv(l.rlim_max)});
  };
  get(RLIMIT_MEMLOCK, "MEMLOCK");
  get(RLIMIT_NOFILE, "NOFILE");
  return out;
}

}  // namespace ddp::jobunit
