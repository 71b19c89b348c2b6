#include "container/container.hpp"

#include "common/strings.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <stdexcept>

namespace ddp::container {

namespace fs = std::filesystem;

std::string Owner::label() const {
  return fmt::format("{}-{}", pid, start_time);
}

std::optional<Owner> parse_owner(std::string_view label) {
  auto parts = split(label, '-');
  if (parts.size() != 2) return std::nullopt;
  auto pid = parse_int(parts[0]);
  auto started = parse_int(parts[1]);
  if (!pid || !started || *pid <= 0 || *started < 0) return std::nullopt;
  return Owner{*pid, static_cast<unsigned long long>(*started)};
}

std::optional<std::string> image_problem(std::string_view image) {
  if (image.empty()) return "an image reference cannot be empty";
  if (image.front() == '-') {
    return fmt::format("'{}' starts with '-', which the runtime would read as an option, not an image", image);
  }
  for (unsigned char c : image) {
    if (c <= ' ' || c == 0x7f) return fmt::format("'{}' holds whitespace or a control character", image);
  }
  // podman and skopeo read "transport:reference": oci-archive:/path, dir:/path, docker-daemon:,
  // containers-storage:[driver@root+run]... name files and stores on this host, which root's
  // runtime would open. Registry references ("host:port/name", "name:tag") and docker:// pass.
  if (const auto colon = image.find(':'); colon != std::string_view::npos) {
    const auto prefix = image.substr(0, colon);
    for (std::string_view t : {"oci", "oci-archive", "docker-archive", "docker-daemon", "dir", "containers-storage",
                               "ostree", "sif", "tarball"}) {
      if (prefix == t) {
        return fmt::format(
            "'{}' names a file or store on the node through podman's '{}:' transport; give a registry "
            "reference (name:tag, host/name@sha256:...)",
            image, t);
      }
    }
  }
  return std::nullopt;
}

std::optional<std::string> confinement_problem(const jobspec::ContainerSpec& spec) {
  if (spec.runtime != ContainerRuntime::docker && spec.runtime != ContainerRuntime::podman) {
    return fmt::format(
        "container.runtime {} cannot run a mapped user's container here (the runtime would run as "
        "root); use podman or docker",
        jobspec::runtime_name(spec.runtime));
  }
  if (!spec.extra_args.empty()) {
    return fmt::format(
        "container.extra_args ({}) are not allowed for a mapped user's container: they would be "
        "root's flags to the runtime",
        join(spec.extra_args, " "));
  }
  // The GPUs are the node's to give (the binding's CUDA_VISIBLE_DEVICES becomes --gpus or
  // --device); NVIDIA_* would have the runtime's hook hand over others.
  for (const auto& [k, v] : spec.env) {
    if (k.rfind("NVIDIA_", 0) == 0) {
      return fmt::format(
          "container.env {} is not allowed for a mapped user's container: the node gives the job its "
          "GPUs",
          k);
    }
  }
  // `--volume SRC:DST[:OPTS]`: a ':' or ',' of the job's would add options of its own (podman's
  // `:U` chowns the source to the container's user, as root).
  for (const auto& m : spec.mounts) {
    for (const auto* p : {&m.source, &m.target}) {
      if (p->find_first_of(":,") != std::string::npos ||
          std::any_of(p->begin(), p->end(), [](unsigned char c) { return c < ' ' || c == 0x7f; })) {
        return fmt::format(
            "container mount path '{}' holds ':', ',' or a control character, which a mapped user's "
            "container may not use (they would be options to the runtime's --volume)",
            *p);
      }
    }
  }
  return std::nullopt;
}

std::vector<std::string> confinement_flags(const Confinement& c) {
  std::vector<std::string> a{"--user", fmt::format("{}:{}", c.uid, c.gid)};
  for (auto g : c.groups) {
    if (g != c.gid) a.insert(a.end(), {"--group-add", std::to_string(g)});
  }
  a.insert(a.end(), {"--cap-drop", "all", "--security-opt", "no-new-privileges"});
  return a;
}

namespace {
// Every builder that puts the image on a command line goes through here.
const std::string& checked_image(const std::string& image) {
  if (auto why = image_problem(image)) throw std::invalid_argument("container.image: " + *why);
  return image;
}

// docker and podman accept [a-zA-Z0-9][a-zA-Z0-9_.-]*; a --job-id may hold anything.
std::string name_safe(std::string id) {
  for (char& c : id) {
    const bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
    if (!ok) c = '_';
  }
  return id;
}
}  // namespace

std::string container_name(const std::string& job_id, int attempt, int rank) {
  return fmt::format("ddpctl-{}-a{}-r{}", name_safe(job_id), attempt, rank);
}

std::string check_container_name(const std::string& job_id, long long pid) {
  return fmt::format("ddpctl-{}-check-{}", name_safe(job_id), pid);
}

Env forwarded_into_container(const Env& inherited, const jobspec::JobSpec& spec) {
  static const std::vector<std::string> host_paths{"PATH", "VIRTUAL_ENV", "PYTHONPATH", "LD_LIBRARY_PATH"};
  Env out;
  for (const auto& [k, v] : inherited) {
    if (std::find(host_paths.begin(), host_paths.end(), k) != host_paths.end()) continue;
    if (contract::matches_forward(k, spec.env_forward)) out.emplace(k, v);
  }
  return out;
}

std::string env_file_text(ContainerRuntime runtime, const Env& env) {
  std::string out;
  for (const auto& [k, v] : env) {
    if (v.find('\n') != std::string::npos) {
      throw std::invalid_argument(
          fmt::format("the value of {} holds a newline, which no container env file can carry", k));
    }
    if (runtime == ContainerRuntime::apptainer) {
      std::string quoted;
      for (char c : v) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
      out += fmt::format("{}='{}'\n", k, quoted);
    } else {
      out += fmt::format("{}={}\n", k, v);
    }
  }
  return out;
}

std::string cpu_list(const std::vector<int>& cpus) {
  std::vector<int> c = cpus;
  std::sort(c.begin(), c.end());
  c.erase(std::unique(c.begin(), c.end()), c.end());
  std::string out;
  for (std::size_t i = 0; i < c.size();) {
    std::size_t j = i;
    while (j + 1 < c.size() && c[j + 1] == c[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += j == i ? std::to_string(c[i]) : fmt::format("{}-{}", c[i], c[j]);
    i = j + 1;
  }
  return out;
}

namespace {

// docker run / podman run. References:
//  docker: https://docs.docker.com/reference/cli/docker/container/run/ (--env-file, --gpus,
//    --ulimit, --cpuset-cpus/--cpuset-mems, --device, --init, --label, --pull) and
//    https://docs.docker.com/engine/containers/gpu/; NVIDIA's container toolkit docs say a list
//    in `device=` must itself be double-quoted ('"device=2,3"'), or docker's CSV parser splits
//    it at the comma and keeps only the first GPU.
//  podman: https://docs.podman.io/en/v4.3/markdown/podman-run.1.html (the same flags; --ulimit
//    host copies the client's limits) and NVIDIA's CDI support page
//    (https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/cdi-support.html):
//    `--device nvidia.com/gpu=<index or UUID>` after `nvidia-ctk cdi generate`.
std::vector<std::string> oci_run(const jobspec::ContainerSpec& spec, const RankRun& run, const HostLayout& host) {
  const bool docker = spec.runtime == ContainerRuntime::docker;
  std::vector<std::string> a{std::string(jobspec::runtime_name(spec.runtime)),
                             "run",
                             "--rm",
                             "--init",
                             "--name",
                             run.name,
                             "--label",
                             fmt::format("{}={}", kJobLabel, run.job_id),
                             "--label",
                             fmt::format("{}={}", kRankLabel, run.rank),
                             "--label",
                             fmt::format("{}={}", kOwnerLabel, run.owner_label),
                             "--network",
                             "host",
                             "--ipc",
                             "host",
                             "--pull=never"};  // the launcher pulled (or refused) before any rank started
  // RDMA registers memory: it wants memlock unlimited. Where the node's hard limit is lower it
  // cannot be raised; podman then copies the client's limits (`--ulimit host`: naming only
  // memlock would drop containers.conf's other defaults, which this node may not grant either).
  if (!host.memlock_hard) {
    a.insert(a.end(), {"--ulimit", "memlock=-1:-1"});
  } else if (docker) {
    a.insert(a.end(), {"--ulimit", fmt::format("memlock={0}:{0}", *host.memlock_hard)});
  } else {
    a.insert(a.end(), {"--ulimit", "host"});
  }
  if (!run.cpus.empty()) a.insert(a.end(), {"--cpuset-cpus", cpu_list(run.cpus)});
  if (run.mem_node) a.insert(a.end(), {"--cpuset-mems", std::to_string(*run.mem_node)});
  for (const auto& d : host.rdma_devices) a.insert(a.end(), {"--device", d});
  if (!run.gpus.empty()) {
    if (docker) {
      const std::string list = join(run.gpus, ",");
      a.insert(a.end(), {"--gpus", run.gpus.size() == 1 ? "device=" + list : fmt::format("\"device={}\"", list)});
    } else {
      for (const auto& g : run.gpus) a.insert(a.end(), {"--device", "nvidia.com/gpu=" + g});
    }
  }
  a.insert(a.end(), {"--env-file", run.env_file});
  if (run.confine) {
    if (auto why = confinement_problem(spec)) throw std::invalid_argument(*why);
    auto f = confinement_flags(*run.confine);
    a.insert(a.end(), f.begin(), f.end());
  }
  for (const auto& m : spec.mounts) {
    a.insert(a.end(), {"--volume", fmt::format("{}:{}{}", m.source, m.target, m.read_only ? ":ro" : "")});
  }
  if (spec.workdir) a.insert(a.end(), {"--workdir", *spec.workdir});
  a.insert(a.end(), spec.extra_args.begin(), spec.extra_args.end());
  a.push_back(checked_image(spec.image));
  a.insert(a.end(), run.argv.begin(), run.argv.end());
  return a;
}

// apptainer exec: https://apptainer.org/docs/user/main/cli/apptainer_exec.html (--cleanenv,
// --env-file, --nv, --pwd, --bind src:dest[:ro]). Host network, IPC and /dev are shared by
// default; the CPU binding reaches the container because its processes are the client's
// children and inherit its affinity.
std::vector<std::string> apptainer_exec(const jobspec::ContainerSpec& spec, const RankRun& run) {
  if (run.confine) throw std::invalid_argument(*confinement_problem(spec));
  std::vector<std::string> a{"apptainer", "exec", "--cleanenv", "--env-file", run.env_file};
  if (!run.gpus.empty()) a.push_back("--nv");
  if (spec.workdir) a.insert(a.end(), {"--pwd", *spec.workdir});
  for (const auto& m : spec.mounts) {
    a.insert(a.end(), {"--bind", fmt::format("{}:{}{}", m.source, m.target, m.read_only ? ":ro" : "")});
  }
  a.insert(a.end(), spec.extra_args.begin(), spec.extra_args.end());
  a.push_back(checked_image(spec.image));
  a.insert(a.end(), run.argv.begin(), run.argv.end());
  return a;
}

// enroot start: https://github.com/NVIDIA/enroot/blob/master/doc/cmd/start.md (`--env KEY`
// exports the client's value, `--mount` takes fstab fields colon-separated, an image file can be
// started directly) and doc/image-format.md (x-create=auto makes the mount point). GPUs and HCAs
// reach the container through enroot's standard hooks, which read NVIDIA_VISIBLE_DEVICES and
// MELLANOX_VISIBLE_DEVICES. enroot has no working-directory flag: a shell inside changes to it.
std::vector<std::string> enroot_start(const jobspec::ContainerSpec& spec, const RankRun& run, const HostLayout& host) {
  if (run.confine) throw std::invalid_argument(*confinement_problem(spec));
  std::vector<std::string> a{"enroot", "start"};
  Env names = run.env;
  for (const auto& [k, v] : client_env(spec, run, host)) names[k] = v;
  for (const auto& [k, v] : names) a.insert(a.end(), {"--env", k});
  for (const auto& m : spec.mounts) {
    a.insert(a.end(),
             {"--mount", fmt::format("{}:{}:none:x-create=auto,bind{}", m.source, m.target, m.read_only ? ",ro" : "")});
  }
  a.insert(a.end(), spec.extra_args.begin(), spec.extra_args.end());
  a.push_back(checked_image(spec.image));
  if (spec.workdir) a.insert(a.end(), {"/bin/sh", "-c", "cd -- \"$0\" && exec \"$@\"", *spec.workdir});
  a.insert(a.end(), run.argv.begin(), run.argv.end());
  return a;
}

}  // namespace

std::vector<std::string> run_argv(const jobspec::ContainerSpec& spec, const RankRun& run, const HostLayout& host) {
  switch (spec.runtime) {
    case ContainerRuntime::docker:
    case ContainerRuntime::podman:
      return oci_run(spec, run, host);
    case ContainerRuntime::apptainer:
      return apptainer_exec(spec, run);
    case ContainerRuntime::enroot:
      return enroot_start(spec, run, host);
  }
  return {};
}

Env client_env(const jobspec::ContainerSpec& spec, const RankRun& run, const HostLayout& host) {
  Env out;
  if (spec.runtime != ContainerRuntime::enroot) return out;
  out = run.env;
  if (!run.gpus.empty()) out["NVIDIA_VISIBLE_DEVICES"] = join(run.gpus, ",");
  if (!host.rdma_devices.empty()) out["MELLANOX_VISIBLE_DEVICES"] = "all";
  return out;
}

bool has_image_store(ContainerRuntime runtime) {
  return runtime == ContainerRuntime::docker || runtime == ContainerRuntime::podman;
}

std::vector<std::string> remove_argv(ContainerRuntime runtime, const std::vector<std::string>& names) {
  if (!has_image_store(runtime) || names.empty()) return {};
  // podman rm: --time 0 kills at once, --ignore skips names already gone. docker rm --force
  // kills; a name already gone only makes it exit 1, which the caller tolerates.
  std::vector<std::string> a{std::string(jobspec::runtime_name(runtime)), "rm", "--force"};
  if (runtime == ContainerRuntime::podman) a.insert(a.end(), {"--ignore", "--time", "0"});
  a.insert(a.end(), names.begin(), names.end());
  return a;
}

std::vector<std::string> list_owned_argv(ContainerRuntime runtime) {
  if (!has_image_store(runtime)) return {};
  // podman's .Labels is a map; docker's is one "k=v,k=v" string, which `index` cannot read
  // (docker exits 1: "cannot index slice/array with type string"): docker has .Label "key".
  const std::string label = runtime == ContainerRuntime::docker
                                ? fmt::format("{{{{.Label \"{}\"}}}}", kOwnerLabel)
                                : fmt::format("{{{{index .Labels \"{}\"}}}}", kOwnerLabel);
  return {std::string(jobspec::runtime_name(runtime)),
          "ps",
          "--all",
          "--filter",
          fmt::format("label={}", kOwnerLabel),
          "--format",
          "{{.Names}} " + label};
}

std::vector<std::string> image_identity_argv(ContainerRuntime runtime, const std::string& image) {
  if (!has_image_store(runtime)) return {};
  // podman's .Digest is the manifest digest it recorded; docker keeps one "repo@sha256:..." per
  // registry it pulled from (none for a built, imported or loaded image).
  const char* format =
      runtime == ContainerRuntime::podman ? "{{.Id}} {{.Digest}}" : "{{.Id}}{{range .RepoDigests}} {{.}}{{end}}";
  return {
      std::string(jobspec::runtime_name(runtime)), "image", "inspect", "--format", format, "--", checked_image(image)};
}

std::optional<ImageIdentity> parse_image_identity(ContainerRuntime runtime, std::string_view out) {
  auto line = trim(out.substr(0, out.find('\n')));
  std::vector<std::string_view> words;
  for (auto w : split(line, ' ')) {
    if (!trim(w).empty()) words.push_back(trim(w));
  }
  if (words.empty() || !has_image_store(runtime)) return std::nullopt;
  std::string_view id = words[0];
  if (id.substr(0, 7) == "sha256:") id.remove_prefix(7);  // docker says it, podman does not
  const bool hex = id.size() == 64 && std::all_of(id.begin(), id.end(), [](char c) {
                     return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
                   });
  if (!hex) return std::nullopt;
  ImageIdentity out_id{"sha256:" + std::string(id), ""};
  if (words.size() > 1) {
    auto d = words[1];
    if (auto at = d.find('@'); at != std::string_view::npos) d.remove_prefix(at + 1);
    if (d.substr(0, 7) == "sha256:") out_id.repo_digest = std::string(d);
  }
  return out_id;
}

std::vector<std::string> command_check_argv(const jobspec::ContainerSpec& spec, const std::string& argv0,
                                            const std::string& path, const std::string& name, const std::string& owner,
                                            const std::optional<Confinement>& confine) {
  if (confine) {
    if (auto why = confinement_problem(spec)) throw std::invalid_argument(*why);
  }
  // Exit 3: no such working directory; 4: no such command. `cd` here rather than the runtime's
  // working-directory flag, which docker and podman would create when it is missing.
  static const std::string script =
      "[ -z \"$1\" ] || cd -- \"$1\" || exit 3; command -v -- \"$2\" >/dev/null || exit 4";
  const std::string workdir = spec.workdir.value_or("");
  std::vector<std::string> a;
  auto mount = [&](const jobspec::Mount& m) {
    return fmt::format("{}:{}{}", m.source, m.target, m.read_only ? ":ro" : "");
  };
  switch (spec.runtime) {
    case ContainerRuntime::docker:
    case ContainerRuntime::podman:
      a = {std::string(jobspec::runtime_name(spec.runtime)), "run",       "--rm", "--name",      name, "--label",
           fmt::format("{}={}", kOwnerLabel, owner),         "--network", "none", "--pull=never"};
      for (const auto& m : spec.mounts) a.insert(a.end(), {"--volume", mount(m)});
      if (!path.empty()) a.insert(a.end(), {"--env", "PATH=" + path});
      // The image's shell runs with the job's mounts: as the job's user, like its workers.
      if (confine) {
        auto f = confinement_flags(*confine);
        a.insert(a.end(), f.begin(), f.end());
      }
      a.insert(a.end(), spec.extra_args.begin(), spec.extra_args.end());
      a.insert(a.end(), {"--entrypoint", "/bin/sh", checked_image(spec.image)});
      break;
    case ContainerRuntime::apptainer:
      a = {"apptainer", "exec", "--cleanenv"};
      for (const auto& m : spec.mounts) a.insert(a.end(), {"--bind", mount(m)});
      if (!path.empty()) a.insert(a.end(), {"--env", "PATH=" + path});
      a.insert(a.end(), spec.extra_args.begin(), spec.extra_args.end());
      a.insert(a.end(), {checked_image(spec.image), "/bin/sh"});
      break;
    case ContainerRuntime::enroot:
      a = {"enroot", "start"};
      if (!path.empty()) a.insert(a.end(), {"--env", "PATH"});  // by name: the client's environment carries it
      for (const auto& m : spec.mounts) {
        a.insert(a.end(), {"--mount", fmt::format("{}:{}:none:x-create=auto,bind{}", m.source, m.target,
                                                  m.read_only ? ",ro" : "")});
      }
      a.insert(a.end(), spec.extra_args.begin(), spec.extra_args.end());
      a.insert(a.end(), {checked_image(spec.image), "/bin/sh"});
      break;
  }
  a.insert(a.end(), {"-c", script, "sh", workdir, argv0});
  return a;
}

CommandCheck classify_command_check(ContainerRuntime, int exit_code) {
  switch (exit_code) {
    case 0:
      return CommandCheck::ok;
    case 3:
      return CommandCheck::no_workdir;
    case 4:
      return CommandCheck::no_command;
    case 126:
    case 127:
      return CommandCheck::no_shell;
    default:
      return CommandCheck::runtime_error;
  }
}

std::vector<std::string> pull_argv(ContainerRuntime runtime, const std::string& image) {
  if (!has_image_store(runtime)) return {};
  return {std::string(jobspec::runtime_name(runtime)), "pull", "--", checked_image(image)};
}

jobspec::ContainerSpec with_absolute_mounts(jobspec::ContainerSpec spec, const std::string& host_cwd) {
  for (auto& m : spec.mounts) {
    fs::path src(m.source);
    if (src.is_relative()) m.source = (fs::path(host_cwd) / src).lexically_normal().string();
    if (m.source.size() > 1 && m.source.back() == '/') m.source.pop_back();
  }
  return spec;
}

std::string worker_path(const jobspec::JobSpec& spec) {
  auto find = [](const auto& pairs) -> std::optional<std::string> {
    for (const auto& [k, v] : pairs) {
      if (k == "PATH") return v;
    }
    return std::nullopt;
  };
  if (spec.container) {
    if (auto p = find(spec.container->env)) return *p;
  }
  return find(spec.env).value_or("");
}

void wrap_plan(contract::Plan& plan, const jobspec::JobSpec& spec, const Env& inherited, const HostLayout& host,
               int attempt, const Owner& owner, const std::string& host_cwd,
               const std::optional<Confinement>& confine) {
  if (!spec.container) return;
  const jobspec::ContainerSpec cs = with_absolute_mounts(*spec.container, host_cwd);
  for (auto& r : plan.ranks) {
    RankRun run;
    run.name = container_name(plan.job_id, attempt, r.rank);
    run.env_file = cs.runtime == ContainerRuntime::enroot ? std::string()
                   : confine                              ? (fs::path(confine->env_dir) / (run.name + ".env")).string()
                                                          : fs::path(r.log_file).replace_extension(".env").string();
    run.argv = r.argv;
    run.env = r.env;
    // The GPUs the rank was given on the host, before container.env: a CUDA_VISIBLE_DEVICES
    // there is the container's own numbering, not a way to ask the runtime for more devices.
    if (auto it = run.env.find("CUDA_VISIBLE_DEVICES"); it != run.env.end()) {
      for (auto g : split(it->second, ',')) {
        if (!trim(g).empty()) run.gpus.emplace_back(trim(g));
      }
    }
    for (const auto& [k, v] : cs.env) run.env[k] = v;
    run.cpus = r.cpus;
    run.mem_node = r.mem_node;
    run.owner_label = owner.label();
    run.job_id = plan.job_id;
    run.rank = r.rank;
    run.confine = confine;

    r.argv = run_argv(cs, run, host);
    Env client = contract::scrub(inherited);
    for (const auto& [k, v] : client_env(cs, run, host)) client[k] = v;
    // The client may run as root (a root agent's job): nothing that changes what it loads.
    r.env = contract::without_loader_variables(client);
    r.container = contract::ContainerRun{std::string(jobspec::runtime_name(cs.runtime)), cs.image,
                                         has_image_store(cs.runtime) ? run.name : std::string(), run.env_file,
                                         std::move(run.env)};
  }
}

}  // namespace ddp::container
