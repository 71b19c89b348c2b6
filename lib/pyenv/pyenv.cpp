#include "pyenv/pyenv.hpp"

#include "common/strings.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>

namespace ddp::pyenv {

bool looks_like_python(std::string_view program) {
  auto slash = program.rfind('/');
  auto name = slash == std::string_view::npos ? program : program.substr(slash + 1);
  for (std::string_view stem : {"python", "pypy"}) {
    if (!starts_with(name, stem)) continue;
    auto rest = name.substr(stem.size());
    // python, python3, python3.11, python3.11d: digits and dots, at most a short suffix.
    if (std::all_of(rest.begin(), rest.end(),
                    [](char c) { return std::isdigit(static_cast<unsigned char>(c)) || c == '.'; }))
      return true;
  }
  return false;
}

InterpreterChoice choose_interpreter(const jobspec::JobSpec& spec) {
  if (!spec.python.empty())
    return {spec.python, "python: in " + (spec.file.empty() ? std::string("the job file") : spec.file), false};
  if (!spec.shell && !spec.command.empty() && looks_like_python(spec.command.front()))
    return {{spec.command.front()}, "the command's program", false};
  return {
      {"python3"},
      "a guess: python3 on the job's PATH, as the command is not a Python; set python: in the job file to say which",
      true};
}

const std::string& probe_script() {
  // Python 3.8+ (importlib.metadata); nothing here imports torch.
  static const std::string s =
      "import json, os, sys\n"
      "r = {'executable': os.path.realpath(sys.executable), 'python': '%d.%d.%d' % tuple(sys.version_info[:3]), "
      "'torch': None}\n"
      "try:\n"
      "    from importlib import metadata\n"
      "    r['torch'] = metadata.version('torch')\n"
      "except Exception:\n"
      "    try:\n"
      "        import importlib.util\n"
      "        spec = importlib.util.find_spec('torch')\n"
      "        if spec is not None and spec.origin:\n"
      "            with open(os.path.join(os.path.dirname(spec.origin), 'version.py')) as f:\n"
      "                for line in f:\n"
      "                    if line.startswith('__version__'):\n"
      "                        r['torch'] = line.split('=', 1)[1].strip().strip('\\'\"')\n"
      "                        break\n"
      "    except Exception:\n"
      "        pass\n"
      "r['site'] = [p for p in sys.path if p and os.path.isdir(p)][:32]\n"
      "print('DDPCTL-PYENV ' + json.dumps(r))\n";
  return s;
}

namespace {
// Versions are short; anything longer is not one.
std::optional<std::string> short_string(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return std::nullopt;
  auto v = it->get<std::string>();
  if (v.empty() || v.size() > 256) return std::nullopt;
  return v;
}
}  // namespace

ProbeAnswer parse_probe_output(std::string_view text) {
  ProbeAnswer out;
  constexpr std::string_view kMark = "DDPCTL-PYENV ";
  std::optional<std::string_view> line;
  for (auto l : split(text, '\n'))
    if (starts_with(l, kMark)) line = l.substr(kMark.size());
  if (!line) {
    out.facts.error = "the interpreter gave no answer (is it a Python 3.8 or later?)";
    return out;
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(*line);
  } catch (const nlohmann::json::exception& e) {
    out.facts.error = std::string("the interpreter's answer is not JSON: ") + e.what();
    return out;
  }
  if (!j.is_object()) {
    out.facts.error = "the interpreter's answer is not a JSON object";
    return out;
  }
  out.facts.executable = short_string(j, "executable");
  out.facts.version = short_string(j, "python");
  if (auto t = short_string(j, "torch"); t && t->size() <= 64) out.facts.torch = t;
  if (auto it = j.find("site"); it != j.end() && it->is_array())
    for (const auto& p : *it)
      if (p.is_string() && out.site.size() < kMaxSiteDirs && p.get<std::string>().size() < 4096) out.site.push_back(p);
  if (!out.facts.version) out.facts.error = "the interpreter's answer has no Python version";
  return out;
}

}  // namespace ddp::pyenv
