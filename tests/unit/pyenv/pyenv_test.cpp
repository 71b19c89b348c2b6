// lib/pyenv: the interpreter choice and the probe's parser (pure), and the probe itself against
// stand-in interpreters (shell scripts in a temporary folder): answer, timeout, cache, staleness.
#include "pyenv/pyenv.hpp"
#include "pyenv/probe.hpp"
#include "supervisor/run_bounded.hpp"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>

using namespace ddp;
using namespace ddp::pyenv;
namespace fs = std::filesystem;

namespace {
jobspec::JobSpec spec_of(const std::string& yaml) {
  return jobspec::parse_job_yaml(yaml, "t.yaml");
}
}  // namespace

TEST(Pyenv, LooksLikePython) {
  for (const auto* p : {"python", "python3", "python3.11", "/venv/bin/python3", "pypy3", "./python"})
    EXPECT_TRUE(looks_like_python(p)) << p;
  for (const auto* p : {"bash", "uv", "conda", "torchrun", "python-config", "/usr/bin/pythonista", "train.py", ""})
    EXPECT_FALSE(looks_like_python(p)) << p;
}

TEST(Pyenv, ChoosesThePythonKeyThenTheCommandThenAGuess) {
  auto c = choose_interpreter(spec_of("command: [sh, run.sh]\npython: [uv, run, python]\n"));
  EXPECT_EQ(c.argv, (std::vector<std::string>{"uv", "run", "python"}));
  EXPECT_FALSE(c.guessed);
  EXPECT_NE(c.source.find("python: in t.yaml"), std::string::npos);

  c = choose_interpreter(spec_of("command: [/venv/bin/python3, train.py]\n"));
  EXPECT_EQ(c.argv, (std::vector<std::string>{"/venv/bin/python3"}));
  EXPECT_FALSE(c.guessed);

  c = choose_interpreter(spec_of("command: [bash, run.sh]\n"));
  EXPECT_EQ(c.argv, (std::vector<std::string>{"python3"}));
  EXPECT_TRUE(c.guessed);
  EXPECT_NE(c.source.find("set python:"), std::string::npos);

  // A shell string is a shell, even when it starts with python.
  EXPECT_TRUE(choose_interpreter(spec_of("command: python3 train.py\n")).guessed);
}

TEST(Pyenv, ParsesTheAnswerAfterNoise) {
  auto a = parse_probe_output(
      "hello from sitecustomize\nDDPCTL-PYENV {\"executable\": \"/usr/bin/python3.11\", \"python\": \"3.11.2\", "
      "\"torch\": \"1.13.0a0+git\", \"site\": [\"/usr/lib/python3/dist-packages\", 7]}\n");
  EXPECT_FALSE(a.facts.error);
  EXPECT_EQ(a.facts.executable, "/usr/bin/python3.11");
  EXPECT_EQ(a.facts.version, "3.11.2");
  EXPECT_EQ(a.facts.torch, "1.13.0a0+git");
  EXPECT_EQ(a.site, (std::vector<std::string>{"/usr/lib/python3/dist-packages"}));  // a non-string is dropped

  a = parse_probe_output("DDPCTL-PYENV {\"executable\": \"/v/bin/python\", \"python\": \"3.11.2\", \"torch\": null}\n");
  EXPECT_FALSE(a.facts.error);
  EXPECT_FALSE(a.facts.torch);  // no torch there
}

TEST(Pyenv, BadAnswersAreErrorsNotGuesses) {
  EXPECT_NE(parse_probe_output("").facts.error->find("no answer"), std::string::npos);
  EXPECT_NE(parse_probe_output("DDPCTL-PYENV {nope\n").facts.error->find("not JSON"), std::string::npos);
  EXPECT_NE(parse_probe_output("DDPCTL-PYENV [1]\n").facts.error->find("not a JSON object"), std::string::npos);
  EXPECT_NE(parse_probe_output("DDPCTL-PYENV {\"torch\": \"2.1\"}\n").facts.error->find("no Python version"),
            std::string::npos);
  // An absurd torch string is not a version.
  auto a = parse_probe_output("DDPCTL-PYENV {\"python\": \"3.11.2\", \"torch\": \"" + std::string(200, '9') + "\"}\n");
  EXPECT_FALSE(a.facts.torch);
}

// ---- the probe, against stand-ins

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    char tmpl[] = "/tmp/pyenv-test-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// A stand-in "python3" that answers like the probe script would (and counts its runs).
void write_interpreter(const fs::path& file, const std::string& body) {
  std::ofstream(file) << "#!/bin/sh\n" << body;
  fs::permissions(file, fs::perms::owner_all);
}

std::string answering(const fs::path& site, const fs::path& counter, const std::string& torch) {
  return "echo run >> " + counter.string() +
         "\necho 'DDPCTL-PYENV {\"executable\": \"'$0'\", \"python\": \"3.11.2\", "
         "\"torch\": \"" +
         torch + "\", \"site\": [\"" + site.string() + "\"]}'\n";
}

int runs(const fs::path& counter) {
  std::ifstream in(counter);
  int n = 0;
  for (std::string l; std::getline(in, l);) ++n;
  return n;
}

ProbeRequest request_in(const TempDir& d) {
  ProbeRequest r;
  r.choice = {{"python3"}, "test", false};
  r.env = {{"PATH", (d.path / "bin").string()}};
  r.workdir = d.path.string();
  return r;
}

}  // namespace

TEST(PyenvProbe, FindsTheInterpreterOnTheJobsPathAndCachesUntilSitePackagesChange) {
  TempDir d;
  fs::create_directories(d.path / "bin");
  fs::create_directories(d.path / "site");
  const auto counter = d.path / "runs";
  write_interpreter(d.path / "bin/python3", answering(d.path / "site", counter, "2.11.0+cu128"));
  ProbeCache cache(d.path / "cache/python.jsonl");
  auto f = probe_python(request_in(d), &cache);
  ASSERT_FALSE(f.error) << *f.error;
  EXPECT_EQ(f.interpreter, (d.path / "bin/python3").string());
  EXPECT_EQ(f.torch, "2.11.0+cu128");
  EXPECT_EQ(runs(counter), 1);

  // The same request: answered from the cache, also by a new process's cache (the file).
  EXPECT_EQ(probe_python(request_in(d), &cache).torch, "2.11.0+cu128");
  ProbeCache reloaded(d.path / "cache/python.jsonl");
  EXPECT_EQ(probe_python(request_in(d), &reloaded).torch, "2.11.0+cu128");
  EXPECT_EQ(runs(counter), 1);

  // Another user's view or another PATH is another key.
  auto other = request_in(d);
  other.env["PYTHONPATH"] = "/elsewhere";
  probe_python(other, &cache);
  EXPECT_EQ(runs(counter), 2);

  // "pip install": a new entry in a site folder changes its mtime; the cached answer is stale.
  struct timespec ts[2] = {{0, UTIME_OMIT}, {1, 0}};  // an mtime that cannot be the cached one
  ASSERT_EQ(::utimensat(AT_FDCWD, (d.path / "site").c_str(), ts, 0), 0);
  write_interpreter(d.path / "bin/python3", answering(d.path / "site", counter, "2.12.0"));
  EXPECT_EQ(probe_python(request_in(d), &cache).torch, "2.12.0");
  EXPECT_EQ(runs(counter), 3);
}

// The cache holds the interpreter's answer, never the question's words: doctor without --job
// ("python3 on PATH"), then with a job whose command is python3 ("the command's program"), ask
// one interpreter in one place for different reasons. The second was shown the first's label.
TEST(PyenvProbe, ACachedAnswerCarriesTheCurrentQuestionsLabel) {
  TempDir d;
  fs::create_directories(d.path / "bin");
  fs::create_directories(d.path / "site");
  const auto counter = d.path / "runs";
  write_interpreter(d.path / "bin/python3", answering(d.path / "site", counter, "2.11.0"));
  const auto file = d.path / "cache/python.jsonl";
  ProbeCache cache(file);
  auto first = request_in(d);
  first.choice = {{"python3"}, "python3 on PATH (give --job FILE)", true};
  auto f = probe_python(first, &cache);
  ASSERT_FALSE(f.error) << *f.error;
  EXPECT_TRUE(f.guessed);

  auto second = request_in(d);
  second.choice = {{"python3"}, "the command's program", false};
  f = probe_python(second, &cache);
  EXPECT_EQ(f.source, "the command's program");
  EXPECT_FALSE(f.guessed);
  EXPECT_EQ(f.torch, "2.11.0");
  ProbeCache reloaded(file);  // another process: the file
  f = probe_python(second, &reloaded);
  EXPECT_EQ(f.source, "the command's program");
  EXPECT_FALSE(f.guessed);
  EXPECT_EQ(f.torch, "2.11.0");
  EXPECT_EQ(f.interpreter, (d.path / "bin/python3").string());
  EXPECT_EQ(runs(counter), 1);  // answered from the cache all the same

  // The label is not in the file at all.
  std::ifstream in(file);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text.find("python3 on PATH"), std::string::npos) << text;
  EXPECT_EQ(text.find("guessed"), std::string::npos) << text;
}

// The file keeps the 64 newest entries, one per line; a launch parses only the line it looks up,
// so a damaged line costs that key one probe and no other key anything.
TEST(PyenvProbe, TheCacheFileKeepsTheNewestEntriesAndSurvivesADamagedLine) {
  TempDir d;
  const auto file = d.path / "cache/python.jsonl";
  auto facts_for = [](int i) {
    facts::PythonFacts f;
    f.interpreter = "/opt/py" + std::to_string(i) + "/bin/python3";
    f.version = "3.11." + std::to_string(i);
    return f;
  };
  {
    ProbeCache cache(file);
    for (int i = 0; i < 70; ++i) cache.put("key-" + std::to_string(i), facts_for(i), {d.path.string()});
  }
  {
    // Put again, a key keeps one line, with the newest answer (and it counts as the newest).
    ProbeCache cache(file);
    cache.put("key-6", facts_for(106), {d.path.string()});
  }
  ProbeCache reloaded(file);
  EXPECT_EQ(reloaded.find("key-6")->interpreter, facts_for(106).interpreter);
  for (int i = 0; i < 6; ++i) EXPECT_FALSE(reloaded.find("key-" + std::to_string(i))) << i;  // the oldest went
  for (int i = 7; i < 70; ++i) {
    const auto f = reloaded.find("key-" + std::to_string(i));
    ASSERT_TRUE(f) << i;
    EXPECT_EQ(f->interpreter, facts_for(i).interpreter);
    EXPECT_EQ(f->version, facts_for(i).version);
  }
  // An entry too large for its share of the file (a key holding a huge PYTHONPATH) is not
  // cached, and costs the others nothing: the file stays under the size a launch reads.
  {
    ProbeCache cache(file);
    cache.put("huge-" + std::string(20 << 10, 'p'), facts_for(200), {d.path.string()});
    EXPECT_FALSE(cache.find("huge-" + std::string(20 << 10, 'p')));
    EXPECT_TRUE(cache.find("key-7"));  // the oldest left stays
    for (int i = 0; i < 70; ++i)
      cache.put("long-" + std::to_string(i) + std::string(15 << 10, 'l'), facts_for(i), {d.path.string()});
  }
  EXPECT_LE(fs::file_size(file), 1u << 20);
  ProbeCache full(file);
  EXPECT_TRUE(full.find("long-69" + std::string(15 << 10, 'l')));
  {
    ProbeCache cache(file);  // back to the short keys for what follows
    for (int i = 0; i < 70; ++i) cache.put("key-" + std::to_string(i), facts_for(i), {d.path.string()});
    cache.put("key-6", facts_for(106), {d.path.string()});
  }
  reloaded = ProbeCache(file);

  // A key that is a prefix of another's is not that other's.
  EXPECT_FALSE(reloaded.find("key-6\\"));
  EXPECT_FALSE(reloaded.find("key-"));

  // key-10's line cut short; every other line still answers.
  std::string text;
  {
    std::ifstream in(file);
    std::stringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }
  const auto at = text.find("[\"key-10\",");
  ASSERT_NE(at, std::string::npos);
  text.erase(at + 20, text.find('\n', at) - at - 20);
  std::ofstream(file, std::ios::trunc) << text;
  ProbeCache damaged(file);
  EXPECT_FALSE(damaged.find("key-10"));
  EXPECT_TRUE(damaged.find("key-11"));
  EXPECT_TRUE(damaged.find("key-69"));

  // Another version's file is not read at all.
  std::ofstream(file, std::ios::trunc) << "{\"version\":1,\"entries\":{}}\n" << text.substr(text.find('\n') + 1);
  EXPECT_FALSE(ProbeCache(file).find("key-69"));
}

// The cache's folder may be another user's (ddpctl run by root with that user's HOME): a link
// left at the name of the file being written, or at the file's own name, is never written
// through; the cache is written all the same, as a file of its own, readable by its owner alone.
TEST(PyenvProbe, TheCacheIsNeverWrittenThroughALinkLeftInItsFolder) {
  TempDir d;
  fs::create_directories(d.path / "cache");
  const auto file = d.path / "cache/python.jsonl";
  const auto victim = d.path / "victim";
  std::ofstream(victim) << "keep me\n";
  fs::create_symlink(victim, d.path / ("cache/python.jsonl." + std::to_string(::getpid()) + ".tmp"));
  fs::create_symlink(victim, file);
  facts::PythonFacts f;
  f.interpreter = "/opt/py/bin/python3";
  {
    ProbeCache cache(file);
    cache.put("key", f, {d.path.string()});
  }
  std::ifstream in(victim);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "keep me\n");
  ASSERT_FALSE(fs::is_symlink(file));
  EXPECT_EQ(fs::status(file).permissions() & fs::perms::all, fs::perms::owner_read | fs::perms::owner_write);
  EXPECT_EQ(ProbeCache(file).find("key")->interpreter, f.interpreter);
}

TEST(PyenvProbe, MissingSilentOrHangingInterpretersAreErrors) {
  TempDir d;
  fs::create_directories(d.path / "bin");
  auto f = probe_python(request_in(d), nullptr);
  ASSERT_TRUE(f.error);
  EXPECT_NE(f.error->find("python3 not found"), std::string::npos) << *f.error;

  write_interpreter(d.path / "bin/python3", "echo 'SyntaxError: nope' >&2\nexit 1\n");
  f = probe_python(request_in(d), nullptr);
  ASSERT_TRUE(f.error);
  EXPECT_NE(f.error->find("exit status 1: SyntaxError: nope"), std::string::npos) << *f.error;

  // A wrapper that never answers (and a child of it holding the pipe): killed at the deadline.
  write_interpreter(d.path / "bin/python3", "/bin/sleep 60 &\nexec /bin/sleep 60\n");
  auto r = request_in(d);
  r.timeout = std::chrono::milliseconds(300);
  const auto t0 = std::chrono::steady_clock::now();
  f = probe_python(r, nullptr);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  ASSERT_TRUE(f.error);
  EXPECT_NE(f.error->find("did not answer within 300 ms"), std::string::npos) << *f.error;
}

TEST(PyenvProbe, TheRealScriptOnThisMachinesPython) {
  // Debian's python3 here has torch 1.13 (python3-torch); the script must not import it.
  ASSERT_TRUE(fs::exists("/usr/bin/python3")) << "scripts/setup installs python3-torch";
  ProbeRequest r;
  r.choice = {{"/usr/bin/python3"}, "test", false};
  r.env = {{"PATH", "/usr/bin:/bin"}};
  auto f = probe_python(r, nullptr);
  ASSERT_FALSE(f.error) << *f.error;
  EXPECT_EQ(f.version->substr(0, 2), "3.");
  ASSERT_TRUE(f.torch);
  EXPECT_EQ(f.torch->substr(0, 5), "1.13.");
}

namespace {
// PYTHONPATH of these folders.
std::string search_path(const std::vector<fs::path>& dirs) {
  std::string path;
  for (const auto& d : dirs) {
    if (!path.empty()) path += ':';
    path += d.string();
  }
  return path;
}

// The real script on this machine's python3 (`-S`: without site, so without Debian's own torch in
// dist-packages), with `dirs` on its PYTHONPATH.
facts::PythonFacts real_probe(const std::vector<fs::path>& dirs, const fs::path& workdir) {
  ProbeRequest r;
  r.choice = {{"/usr/bin/python3", "-S"}, "test", false};
  r.env = {{"PATH", "/usr/bin:/bin"}, {"PYTHONPATH", search_path(dirs)}};
  r.workdir = workdir.string();
  return probe_python(r, nullptr);
}

// What importlib.metadata itself says there, "none" when it finds no torch.
std::string metadata_says(const fs::path& dir, const fs::path& workdir) {
  supervisor::SpawnSpec spec;
  spec.argv = {"/usr/bin/python3", "-S", "-c",
               "from importlib import metadata\n"
               "try:\n    print(metadata.version('torch'))\n"
               "except metadata.PackageNotFoundError:\n    print('none')\n"};
  spec.env = {{"PATH", "/usr/bin:/bin"}, {"PYTHONPATH", dir.string()}};
  spec.workdir = workdir.string();
  const auto ran = supervisor::run_bounded(spec, std::chrono::seconds(10), 1 << 12, 1 << 12);
  return ran.out.substr(0, ran.out.find('\n'));
}

// A stand-in torch package that must never be imported, with a version.py when given one.
void fake_torch_package(const fs::path& site, std::optional<std::string> version_py) {
  fs::create_directories(site / "torch");
  std::ofstream(site / "torch/__init__.py") << "raise SystemExit('the probe must not import torch')\n";
  if (version_py) std::ofstream(site / "torch/version.py") << "from typing import Optional\n" << *version_py << "\n";
}

// An installed distribution's metadata; a Version line in its body (after the headers) is not
// the version.
void dist_info(const fs::path& site, const std::string& version) {
  fs::create_directories(site / ("torch-" + version + ".dist-info"));
  std::ofstream(site / ("torch-" + version + ".dist-info/METADATA"))
      << "Metadata-Version: 2.1\nName: torch\nVersion: " << version << "\nSummary: x\n\nVersion: 0.0.0\n";
}

// An egg-info folder (`folder`: torch-VERSION.egg-info, or torch.egg-info as a source checkout has).
void egg_info(const fs::path& site, const std::string& folder, const std::string& version) {
  fs::create_directories(site / folder);
  std::ofstream(site / folder / "PKG-INFO") << "Metadata-Version: 2.1\nName: torch\nVersion: " << version << "\n";
}
}  // namespace

// The answer is JSON written by hand (the script imports no json): folder names with quotes,
// backslashes, control characters and characters outside the BMP come back as they are.
TEST(PyenvProbe, TheRealScriptEscapesEveryAwkwardFolderName) {
  TempDir d;
  ASSERT_TRUE(fs::exists("/usr/bin/python3")) << "scripts/setup installs python3";
  const std::vector<std::string> names = {"a\"quote",    "back\\slash",           "new\nline", "tab\tand\x01\x7f",
                                          "caf\xc3\xa9", "smile\xf0\x9f\x98\x80", "plain"};
  std::vector<fs::path> dirs;
  for (const auto& n : names) {
    dirs.push_back(d.path / n);
    fs::create_directories(dirs.back());
  }
  std::string path = search_path(dirs);
  // A name that is not UTF-8 (Python holds it with lone surrogates, which no JSON parser takes
  // back) is left out of the answer; it does not cost the whole answer.
  const std::string not_utf8 = (d.path / "latin1-caf\xe9").string();
  fs::create_directories(not_utf8);
  path += ":" + not_utf8;
  supervisor::SpawnSpec spec;
  spec.argv = {"/usr/bin/python3", "-c", probe_script()};
  spec.env = {{"PATH", "/usr/bin:/bin"}, {"PYTHONPATH", path}};
  spec.workdir = d.path.string();
  const auto ran = supervisor::run_bounded(spec, std::chrono::seconds(10), 1 << 16, 1 << 12);
  ASSERT_EQ(ran.status, 0) << ran.err;
  const auto answer = parse_probe_output(ran.out);
  ASSERT_FALSE(answer.facts.error) << *answer.facts.error << "\n" << ran.out;
  for (const auto& dir : dirs) {
    EXPECT_NE(std::find(answer.site.begin(), answer.site.end(), dir.string()), answer.site.end()) << "missing: " << dir;
  }
  EXPECT_EQ(std::find(answer.site.begin(), answer.site.end(), not_utf8), answer.site.end());
  EXPECT_EQ(answer.facts.version->substr(0, 2), "3.");
}

// The script finds torch's version as importlib.metadata does, without importing that (or torch):
// the first distribution on sys.path, a dist-info's METADATA or an egg-info's PKG-INFO (a folder
// or a file); only when there is none, the version.py of the torch package importlib finds.
TEST(PyenvProbe, TheRealScriptAnswersAsImportlibMetadataAndNeverImportsTorch) {
  ASSERT_TRUE(fs::exists("/usr/bin/python3")) << "scripts/setup installs python3";
  TempDir d;
  struct Case {
    std::string name;
    std::function<void(const fs::path&)> make;
    std::optional<std::string> expected;
  };
  const std::vector<Case> cases = {
      {"dist-info before version.py",
       [](const fs::path& p) {
         fake_torch_package(p, "__version__ = '2.11.0+cu130'");
         dist_info(p, "2.11.0");
       },
       "2.11.0"},
      {"egg-info folder",
       [](const fs::path& p) {
         fake_torch_package(p, "__version__ = '1.13.0a0'");
         egg_info(p, "torch-1.13.0a0+gitunknown.egg-info", "1.13.0a0+gitunknown");
       },
       "1.13.0a0+gitunknown"},
      {"egg-info file",
       [](const fs::path& p) {
         fs::create_directories(p);
         std::ofstream(p / "torch-1.12.1-py3.11.egg-info") << "Metadata-Version: 1.1\nName: torch\nVersion: 1.12.1\n";
       },
       "1.12.1"},
      {"another project whose name starts with torch",
       [](const fs::path& p) {
         fs::create_directories(p / "torch_tb_profiler-0.4.3.dist-info");
         std::ofstream(p / "torch_tb_profiler-0.4.3.dist-info/METADATA") << "Name: torch-tb-profiler\nVersion: 0.4.3\n";
         fake_torch_package(p, "__version__ = '2.4.1'  # generated");
       },
       "2.4.1"},
      {"a source checkout's torch.egg-info (setup.py develop)",
       [](const fs::path& p) {
         fake_torch_package(p, "__version__ = '2.5.0a0+git1'");
         egg_info(p, "torch.egg-info", "2.5.0a0+git1");
       },
       "2.5.0a0+git1"},
      {"version.py that says no version",
       [](const fs::path& p) { fake_torch_package(p, "__version__ = get_version()"); }, std::nullopt},
      {"a torch.py module, not the package, beside another project's version.py",
       [](const fs::path& p) {
         fs::create_directories(p);
         std::ofstream(p / "torch.py") << "raise SystemExit('the probe must not import torch')\n";
         std::ofstream(p / "version.py") << "__version__ = '0.3.1'\n";
       },
       std::nullopt},
  };
  int i = 0;
  for (const auto& c : cases) {
    const auto dir = d.path / std::to_string(i++);
    c.make(dir);
    const auto f = real_probe({dir}, d.path);
    ASSERT_FALSE(f.error) << c.name << ": " << *f.error;
    EXPECT_EQ(f.torch, c.expected) << c.name;
    // Wherever importlib.metadata finds a torch, the script says what it says.
    const auto said = metadata_says(dir, d.path);
    if (said != "none") {
      EXPECT_EQ(f.torch, said) << c.name;
    }
  }
  // An egg-info and a dist-info in one folder: importlib.metadata takes the one the folder lists
  // first, not the dist-info (a folder is chosen whose listing has the egg-info first).
  std::optional<fs::path> both;
  // Made in either order by turns: a file system that lists in creation order, or in its reverse,
  // lists the egg-info first in one of them; one that hashes names, in some.
  for (int k = 0; k < 64 && !both; ++k) {
    const auto dir = d.path / ("both-" + std::to_string(k));
    if (k % 2) dist_info(dir, "2.0." + std::to_string(k));
    egg_info(dir, "torch-1.0." + std::to_string(k) + ".egg-info", "1.0." + std::to_string(k));
    if (k % 2 == 0) dist_info(dir, "2.0." + std::to_string(k));
    if (fs::directory_iterator(dir)->path().extension() == ".egg-info") both = dir;
  }
  ASSERT_TRUE(both) << "no folder listed its egg-info first";
  const auto f = real_probe({*both}, d.path);
  ASSERT_TRUE(f.torch);
  EXPECT_EQ(f.torch->substr(0, 4), "1.0.");
  EXPECT_EQ(f.torch, metadata_says(*both, d.path));

  // A distribution whose metadata says no version is passed over for the next one, where
  // importlib.metadata would answer None (a stale dist-info left by an upgrade, cpython#100666).
  fs::create_directories(d.path / "stale/torch-2.0.0.dist-info");
  std::ofstream(d.path / "stale/torch-2.0.0.dist-info/REQUESTED") << "";
  dist_info(d.path / "good", "2.2.0");
  EXPECT_EQ(real_probe({d.path / "stale", d.path / "good"}, d.path).torch, "2.2.0");

  // Two folders with a distribution each: the first on sys.path, as importlib.metadata.
  dist_info(d.path / "first", "2.5.0");
  dist_info(d.path / "second", "2.6.0");
  EXPECT_EQ(real_probe({d.path / "first", d.path / "second"}, d.path).torch, "2.5.0");
}

// An interpreter whose path is not UTF-8 costs the answer only its `executable` (a JSON parser
// takes back no lone surrogate), not the Python and torch versions.
TEST(PyenvProbe, TheRealScriptOnAnInterpreterWhosePathIsNotUtf8) {
  ASSERT_TRUE(fs::exists("/usr/bin/python3")) << "scripts/setup installs python3";
  TempDir d;
  const auto bin = d.path / "bin-caf\xe9";
  fs::create_directories(bin);
  fs::copy_file(fs::canonical("/usr/bin/python3"), bin / "python3");
  dist_info(d.path / "site", "2.3.0");
  ProbeRequest r;
  r.choice = {{(bin / "python3").string(), "-S"}, "test", false};
  r.env = {{"PATH", "/usr/bin:/bin"}, {"PYTHONPATH", (d.path / "site").string()}};
  r.workdir = d.path.string();
  const auto f = probe_python(r, nullptr);
  ASSERT_FALSE(f.error) << *f.error;
  EXPECT_EQ(f.version->substr(0, 2), "3.");
  EXPECT_EQ(f.torch, "2.3.0");
  EXPECT_FALSE(f.executable);
  // Shown as text (the byte that is not UTF-8 as '?'), and neither the cache's key nor its file
  // throws on the path: such an interpreter is probed each time, never cached.
  EXPECT_NE(f.interpreter.find("bin-caf?"), std::string::npos) << f.interpreter;
  ProbeCache cache(d.path / "cache/python.jsonl");
  ASSERT_FALSE(probe_python(r, &cache).error);
  ASSERT_FALSE(probe_python(r, &cache).error);
  EXPECT_FALSE(fs::exists(d.path / "cache/python.jsonl"));
}

// Bytes that are not UTF-8 anywhere in a request (a variable, the workdir, the job file's path in
// `source`) or in what a failing interpreter prints: the key holds them in hex and finds them
// again, and nothing the probe returns is refused by a strict JSON dump.
TEST(PyenvProbe, BytesThatAreNotUtf8AreKeptInTheKeyAndCleanedInWhatIsShown) {
  TempDir d;
  fs::create_directories(d.path / "bin");
  fs::create_directories(d.path / "site");
  const auto counter = d.path / "runs";
  write_interpreter(d.path / "bin/python3", answering(d.path / "site", counter, "2.11.0"));
  auto r = request_in(d);
  r.env["PYTHONPATH"] = "/opt/caf\xe9";
  r.choice.source = "python: in /jobs/caf\xe9/job.yaml";
  ProbeCache cache(d.path / "cache/python.jsonl");
  auto f = probe_python(r, &cache);
  ASSERT_FALSE(f.error) << *f.error;
  EXPECT_NO_THROW((void)facts::to_json(f).dump());
  ProbeCache reloaded(d.path / "cache/python.jsonl");
  EXPECT_EQ(probe_python(r, &reloaded).torch, "2.11.0");
  EXPECT_EQ(runs(counter), 1);
  // The same bytes as text are another key: no string is mistaken for a hex rendering.
  auto other = r;
  other.env["PYTHONPATH"] = "{\"hex\":\"2f6f70742f636166e9\"}";
  probe_python(other, &cache);
  EXPECT_EQ(runs(counter), 2);

  // A failing wrapper that prints its own path (not UTF-8) and an escape sequence.
  write_interpreter(d.path / "bin/python3", "printf '%s: \\033[31mno\\n' \"$0\" >&2\nexit 3\n");
  fs::create_directories(d.path / "caf\xe9");
  fs::copy_file(d.path / "bin/python3", d.path / "caf\xe9/python3");
  auto failing = request_in(d);
  failing.choice = {{(d.path / "caf\xe9/python3").string()}, "test", false};
  f = probe_python(failing, nullptr);
  ASSERT_TRUE(f.error);
  EXPECT_NO_THROW((void)facts::to_json(f).dump()) << *f.error;
  EXPECT_EQ(f.error->find('\033'), std::string::npos) << *f.error;
  EXPECT_NE(f.error->find("exit status 3"), std::string::npos) << *f.error;
}
