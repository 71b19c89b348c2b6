#include "jobspec/flags.hpp"

#include "jobspec/parse_node.hpp"

#include <fmt/format.h>

namespace ddp::jobspec {

bool is_python_script(std::string_view word) {
  return word.size() > 3 && word.ends_with(".py");
}

std::string name_from_command(const std::vector<std::string>& argv) {
  std::string base;
  for (std::size_t i = 0; i < argv.size(); ++i) {
    if (i > 0 && argv[i - 1] == "-m") {
      const auto dot = argv[i].rfind('.');
      base = dot == std::string::npos ? argv[i] : argv[i].substr(dot + 1);
      break;
    }
    if (is_python_script(argv[i])) {
      base = argv[i];
      break;
    }
  }
  if (base.empty() && !argv.empty()) base = argv[0];
  if (auto slash = base.rfind('/'); slash != std::string::npos) base = base.substr(slash + 1);
  if (auto dot = base.rfind('.'); dot != std::string::npos && dot > 0) base = base.substr(0, dot);
  // The job file's rule for names: [A-Za-z0-9][A-Za-z0-9._-]{0,63}.
  std::string name;
  for (char c : base) {
    const bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (name.empty() && !alnum) continue;
    name += alnum || c == '.' || c == '_' || c == '-' ? c : '_';
    if (name.size() == 64) break;
  }
  return name.empty() ? "job" : name;
}

JobSpec spec_from_flags(const JobFlags& f, const std::string& where) {
  if (f.command.empty()) {
    throw JobSpecError({{where, 0, 0, "no command: give the worker's command after --, e.g. -- python3 train.py"}});
  }
  YAML::Node root(YAML::NodeType::Map);
  root["name"] = f.name.value_or(name_from_command(f.command));
  YAML::Node command(YAML::NodeType::Sequence);
  for (const auto& word : f.command) command.push_back(word);
  root["command"] = command;
  if (f.nproc_per_node) root["nproc_per_node"] = *f.nproc_per_node;
  if (f.nnodes) root["nnodes"] = *f.nnodes;
  if (f.max_restarts) root["restart"]["max_restarts"] = *f.max_restarts;
  if (f.log_dir) root["logs"]["dir"] = *f.log_dir;
  if (f.store_port) root["store"]["port"] = *f.store_port;
  if (f.stop_grace) root["stop"]["grace"] = *f.stop_grace;
  if (f.numa_binding) root["binding"]["numa"] = *f.numa_binding;
  return parse_job_node(root, where);
}

LaunchWords split_launch_words(const std::vector<std::string>& words,
                               const std::function<std::optional<bool>(std::string_view)>& takes_value) {
  LaunchWords out;
  bool have_job_file = false;
  for (std::size_t i = 0; i < words.size(); ++i) {
    const std::string& w = words[i];
    if (w == "--") {
      out.command.assign(words.begin() + static_cast<std::ptrdiff_t>(i) + 1, words.end());
      if (out.command.empty()) out.own.push_back(w);  // a bare `--`: the option parser's to judge
      return out;
    }
    if (w.size() > 1 && w[0] == '-') {
      out.own.push_back(w);
      if (w.find('=') != std::string::npos) continue;
      // -n4: a short option with its value attached.
      if (w[1] != '-' && w.size() > 2) continue;
      if (takes_value(w).value_or(false) && i + 1 < words.size()) out.own.push_back(words[++i]);
      continue;
    }
    if (!have_job_file && is_python_script(w)) {
      out.command.emplace_back(kDefaultPython);
      out.command.insert(out.command.end(), words.begin() + static_cast<std::ptrdiff_t>(i), words.end());
      out.script = true;
      return out;
    }
    have_job_file = true;
    out.own.push_back(w);
  }
  return out;
}

}  // namespace ddp::jobspec
