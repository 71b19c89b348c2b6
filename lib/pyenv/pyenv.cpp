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
  // Python 3.8+; nothing here imports torch, nor json and importlib.metadata, which cost a job's
  // start on every node two thirds of the probe (88 against 33 ms with Debian's python3 here):
  // torch's version is read from the torch/version.py that `import torch` would load (its
  // torch.__version__), the installed distribution's metadata only when there is none; the
  // answer is written as JSON by hand, every character outside printable ASCII, and '"' and '\',
  // escaped as json.dumps does (ensure_ascii).
  static const std::string s =
      "import os, sys\n"
      "def q(s):\n"
      "    if s is None:\n"
      "        return 'null'\n"
      "    o = []\n"
      "    for c in str(s):\n"
      "        n = ord(c)\n"
      "        if 0x20 <= n < 0x7f and c != '\"' and c != '\\\\':\n"
      "            o.append(c)\n"
      "        elif n > 0xffff:\n"
      "            n -= 0x10000\n"
      "            o.append('\\\\u%04x\\\\u%04x' % (0xd800 | n >> 10, 0xdc00 | n & 0x3ff))\n"
      "        else:\n"
      "            o.append('\\\\u%04x' % n)\n"
      "    return '\"' + ''.join(o) + '\"'\n"
      "torch = None\n"
      "try:\n"
      "    import importlib.util\n"
      "    spec = importlib.util.find_spec('torch')\n"
      "    if spec is not None and spec.origin:\n"
      "        with open(os.path.join(os.path.dirname(spec.origin), 'version.py')) as f:\n"
      "            for line in f:\n"
      "                if line.startswith('__version__'):\n"
      "                    torch = line.split('=', 1)[1].strip().strip('\\'\"')\n"
      "                    break\n"
      "        if torch and not torch[0].isdigit():\n"
      "            torch = None\n"
      "except Exception:\n"
      "    pass\n"
      "if not torch:\n"
      "    try:\n"
      "        from importlib import metadata\n"
      "        torch = metadata.version('torch')\n"
      "    except Exception:\n"
      "        torch = None\n"
      "site = [p for p in sys.path if p and os.path.isdir(p)][:32]\n"
      "print('DDPCTL-PYENV {\"executable\": %s, \"python\": %s, \"torch\": %s, \"site\": [%s]}' % (\n"
      "    q(os.path.realpath(sys.executable)), q('%d.%d.%d' % tuple(sys.version_info[:3])), q(torch),\n"
      "    ', '.join(q(p) for p in site)))\n";
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
