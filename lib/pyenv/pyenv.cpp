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
  return {{"python3"},
          std::string(facts::kGuessedSourcePrefix) +
              " python3 on the job's PATH, as the command is not a Python; set python: in the job file to say which",
          true};
}

const std::string& probe_script() {
  // Python 3.8+. Nothing here imports torch, nor json or importlib.metadata, whose imports (email,
  // re, ...) were most of the probe every job pays on every node: 50-88 against 12-18 ms with
  // Debian's python3 here. The answer is importlib.metadata's: the first torch distribution on
  // sys.path (`torch-*` or `torch` dist-info or egg-info, METADATA or PKG-INFO; in one folder in
  // the order it lists them, as there), except that one whose metadata says no version is passed
  // over for the next (importlib says None; newer releases prefer the valid one too); else the
  // version.py of the torch package importlib finds. Only regular files are read (no FIFO or
  // device can stall it). The JSON line is written by hand, every character outside printable
  // ASCII, and '"' and '\', escaped as json.dumps does; a path that is not UTF-8 (which no JSON
  // parser takes back) is left out: a sys.path folder, or the executable (null).
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
      "def utf8(p):\n"
      "    try:\n"
      "        return os.fsencode(p).decode('utf-8')\n"
      "    except Exception:\n"
      "        return None\n"
      "def header(path):\n"
      "    if not os.path.isfile(path):\n"
      "        return None\n"
      "    with open(path, encoding='utf-8', errors='replace') as f:\n"
      "        for line in f:\n"
      "            if not line.strip():\n"
      "                break\n"
      "            if line.startswith('Version:'):\n"
      "                return line[8:].strip() or None\n"
      "    return None\n"
      "def installed():\n"
      "    for p in sys.path:\n"
      "        try:\n"
      "            p = os.fsdecode(p) or '.'\n"
      "            names = os.listdir(p)\n"
      "        except Exception:\n"
      "            continue\n"
      "        for n in names:\n"
      "            low = n.lower()\n"
      "            if not low.endswith(('.dist-info', '.egg-info')) or low.rpartition('.')[0].partition('-')[0] != "
      "'torch':\n"
      "                continue\n"
      "            d = os.path.join(p, n)\n"
      "            for f in ([os.path.join(d, 'METADATA'), os.path.join(d, 'PKG-INFO')] if os.path.isdir(d) else "
      "[d]):\n"
      "                try:\n"
      "                    v = header(f)\n"
      "                except OSError:\n"
      "                    v = None\n"
      "                if v:\n"
      "                    return v\n"
      "    return None\n"
      "def module():\n"
      "    import importlib.util\n"
      "    spec = importlib.util.find_spec('torch')\n"
      "    if spec is None or not spec.origin or not spec.submodule_search_locations:\n"
      "        return None\n"
      "    path = os.path.join(os.path.dirname(spec.origin), 'version.py')\n"
      "    if not os.path.isfile(path):\n"
      "        return None\n"
      "    with open(path, encoding='utf-8', errors='replace') as f:\n"
      "        for line in f:\n"
      "            if line.startswith('__version__'):\n"
      "                v = line.split('=', 1)[1].strip()\n"
      "                if v[:1] in ('\"', \"'\"):\n"
      "                    v = v[1:].split(v[0], 1)[0]\n"
      "                return v if v[:1].isdigit() else None\n"
      "    return None\n"
      "torch = None\n"
      "for find in (installed, module):\n"
      "    try:\n"
      "        torch = find()\n"
      "    except Exception:\n"
      "        torch = None\n"
      "    if torch:\n"
      "        break\n"
      "try:\n"
      "    exe = utf8(os.path.realpath(sys.executable)) if sys.executable else None\n"
      "except Exception:\n"
      "    exe = None\n"
      "site = [u for u in map(utf8, sys.path) if u and os.path.isdir(u)][:32]\n"
      "print('DDPCTL-PYENV {\"executable\": %s, \"python\": %s, \"torch\": %s, \"site\": [%s]}' % (\n"
      "    q(exe), q('%d.%d.%d' % tuple(sys.version_info[:3])), q(torch), ', '.join(q(p) for p in site)))\n";
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
