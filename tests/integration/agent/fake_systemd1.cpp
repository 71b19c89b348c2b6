// A stand-in for systemd's D-Bus API, for tests/integration/agent/test_job_units.py (systemd is
// not PID 1 on the machines the tests run on). It owns org.freedesktop.systemd1 on the bus in
// $DBUS_SYSTEM_BUS_ADDRESS (a private dbus-daemon the test started) and answers one method,
// Manager.StartTransientUnit: every property is written as one JSON line to the record file,
// then ExecStart runs as a child of this process with the StandardInput/Output/Error
// descriptors and Environment it was given, as systemd would run a transient service's main
// process. Nothing else of systemd (cgroups, KillMode, hardening) is imitated.
//
// Usage: fake_systemd1 RECORD_FILE; prints "ready" once the name is owned.
#include <systemd/sd-bus.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace {

std::string g_record;
unsigned g_jobs = 0;
int g_reply_delay_ms = 0;  // how long each StartTransientUnit waits, its unit started, before it answers

int fail(sd_bus_error* e, const char* what, int rc) {
  return sd_bus_error_setf(e, SD_BUS_ERROR_INVALID_ARGS, "fake systemd: %s: %s", what, std::strerror(-rc));
}

int start_transient_unit(sd_bus_message* m, void*, sd_bus_error* e) {
  const char *name = nullptr, *mode = nullptr;
  int rc = sd_bus_message_read(m, "ss", &name, &mode);
  if (rc < 0) return fail(e, "name and mode", rc);
  nlohmann::json props = nlohmann::json::object();
  std::vector<std::string> argv, env;
  std::string path;
  int fds[3] = {-1, -1, -1};
  if ((rc = sd_bus_message_enter_container(m, 'a', "(sv)")) < 0) return fail(e, "properties", rc);
  while ((rc = sd_bus_message_enter_container(m, 'r', "sv")) > 0) {
    const char* key = nullptr;
    if ((rc = sd_bus_message_read(m, "s", &key)) < 0) return fail(e, "property name", rc);
    const char* sig = nullptr;
    if ((rc = sd_bus_message_peek_type(m, nullptr, &sig)) < 0) return fail(e, key, rc);
    const std::string s = sig;
    const std::string k = key;
    if (s == "b") {
      int v = 0;
      rc = sd_bus_message_read(m, "v", "b", &v);
      props[k] = static_cast<bool>(v);
    } else if (s == "s") {
      const char* v = nullptr;
      rc = sd_bus_message_read(m, "v", "s", &v);
      props[k] = v;
    } else if (s == "t") {
      uint64_t v = 0;
      rc = sd_bus_message_read(m, "v", "t", &v);
      props[k] = v;
    } else if (s == "h") {
      int fd = -1;
      rc = sd_bus_message_read(m, "v", "h", &fd);
      props[k] = "fd";
      const int slot = k == "StandardInputFileDescriptor"    ? 0
                       : k == "StandardOutputFileDescriptor" ? 1
                       : k == "StandardErrorFileDescriptor"  ? 2
                                                             : -1;
      if (rc >= 0 && slot >= 0) fds[slot] = fd;  // owned by the message, which outlives the fork
    } else if (s == "as") {
      char** v = nullptr;
      if ((rc = sd_bus_message_enter_container(m, 'v', "as")) >= 0 && (rc = sd_bus_message_read_strv(m, &v)) >= 0) {
        std::vector<std::string> list;
        for (char** p = v; p && *p; ++p) list.emplace_back(*p);
        props[k] = list;
        if (k == "Environment") env = list;
        for (char** p = v; p && *p; ++p) std::free(*p);
        std::free(v);
        rc = sd_bus_message_exit_container(m);
      }
    } else if (s == "a(sasb)") {
      nlohmann::json cmds = nlohmann::json::array();
      if ((rc = sd_bus_message_enter_container(m, 'v', "a(sasb)")) >= 0 &&
          (rc = sd_bus_message_enter_container(m, 'a', "(sasb)")) >= 0) {
        while ((rc = sd_bus_message_enter_container(m, 'r', "sasb")) > 0) {
          const char* p = nullptr;
          char** a = nullptr;
          int ignore = 0;
          if ((rc = sd_bus_message_read(m, "s", &p)) < 0 || (rc = sd_bus_message_read_strv(m, &a)) < 0 ||
              (rc = sd_bus_message_read(m, "b", &ignore)) < 0) {
            return fail(e, key, rc);
          }
          std::vector<std::string> args;
          for (char** q = a; q && *q; ++q) args.emplace_back(*q);
          for (char** q = a; q && *q; ++q) std::free(*q);
          std::free(a);
          cmds.push_back({{"path", p}, {"argv", args}, {"ignore_failure", static_cast<bool>(ignore)}});
          if (path.empty()) {
            path = p;
            argv = args;
          }
          if ((rc = sd_bus_message_exit_container(m)) < 0) return fail(e, key, rc);
        }
        if (rc >= 0 && (rc = sd_bus_message_exit_container(m)) >= 0) rc = sd_bus_message_exit_container(m);
      }
      props[k] = cmds;
    } else {
      return sd_bus_error_setf(e, SD_BUS_ERROR_INVALID_ARGS, "fake systemd: property %s of type %s not understood", key,
                               sig);
    }
    if (rc < 0) return fail(e, key, rc);
    if ((rc = sd_bus_message_exit_container(m)) < 0) return fail(e, key, rc);
  }
  if (rc < 0) return fail(e, "properties", rc);
  if ((rc = sd_bus_message_exit_container(m)) < 0) return fail(e, "properties", rc);
  if ((rc = sd_bus_message_skip(m, "a(sa(sv))")) < 0) return fail(e, "auxiliary units", rc);
  if (path.empty()) return sd_bus_error_setf(e, SD_BUS_ERROR_INVALID_ARGS, "fake systemd: no ExecStart");

  const pid_t pid = ::fork();
  if (pid == 0) {
    for (int i = 0; i < 3; ++i) {
      if (fds[i] >= 0) ::dup2(fds[i], i);
    }
    ::setsid();
    std::vector<char*> a, en;
    for (auto& x : argv) a.push_back(x.data());
    a.push_back(nullptr);
    for (auto& x : env) en.push_back(x.data());
    en.push_back(nullptr);
    ::execve(path.c_str(), a.data(), en.data());
    ::_exit(127);
  }
  {
    std::ofstream out(g_record, std::ios::app);
    out << nlohmann::json{{"name", name}, {"mode", mode}, {"pid", pid}, {"properties", props}}.dump() << "\n";
  }
  if (g_reply_delay_ms > 0) ::usleep(static_cast<useconds_t>(g_reply_delay_ms) * 1000);
  const std::string job = "/org/freedesktop/systemd1/job/" + std::to_string(++g_jobs);
  return sd_bus_reply_method_return(m, "o", job.c_str());
}

const sd_bus_vtable kManager[] = {
    SD_BUS_VTABLE_START(0),
    SD_BUS_METHOD("StartTransientUnit", "ssa(sv)a(sa(sv))", "o", start_transient_unit, SD_BUS_VTABLE_UNPRIVILEGED),
    SD_BUS_VTABLE_END};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 && argc != 3) {
    std::fprintf(stderr, "usage: fake_systemd1 RECORD_FILE [REPLY_DELAY_MS]\n");
    return 2;
  }
  g_record = argv[1];
  if (argc == 3) g_reply_delay_ms = std::atoi(argv[2]);
  ::signal(SIGCHLD, SIG_IGN);  // our "units" are reaped by the kernel
  sd_bus* bus = nullptr;
  int rc = sd_bus_open_system(&bus);
  if (rc >= 0)
    rc = sd_bus_add_object_vtable(bus, nullptr, "/org/freedesktop/systemd1", "org.freedesktop.systemd1.Manager",
                                  kManager, nullptr);
  if (rc >= 0) rc = sd_bus_request_name(bus, "org.freedesktop.systemd1", 0);
  if (rc < 0) {
    std::fprintf(stderr, "fake_systemd1: %s\n", std::strerror(-rc));
    return 1;
  }
  std::printf("ready\n");
  std::fflush(stdout);
  while (true) {
    rc = sd_bus_process(bus, nullptr);
    if (rc < 0) return 1;
    if (rc > 0) continue;
    if (sd_bus_wait(bus, UINT64_MAX) < 0) return 1;
  }
}
