// ddpctl entry point: parse, dispatch, turn uncaught errors into one clear line and exit 2.
#include "commands.hpp"
#include "common/log.hpp"
#include "common/strings.hpp"
#include "common/version.hpp"
#include "stacks/collect.hpp"

#include <algorithm>
#include <cctype>
#include <csignal>
#include <iostream>
#include <vector>

int main(int argc, char** argv) {
  // The privilege-separated native stack reader (lib/stacks/collect.hpp): this binary again.
  if (auto rc = ddp::stacks::run_reader_if_asked(argc, argv)) return *rc;
  // `ddpctl launch job.yaml | grep loss`, then Ctrl-C: grep is gone, and the next line written
  // must fail with EPIPE, not kill ddpctl in the middle of stopping workers. Workers get every
  // signal reset to its default before exec.
  std::signal(SIGPIPE, SIG_IGN);
  CLI::App app{"ddpctl: launch and supervise PyTorch DDP / NCCL training jobs"};
  app.set_version_flag("--version", ddp::kCtlVersion);
  app.require_subcommand(1);
  bool verbose = false;
  app.add_flag("-v,--verbose", verbose, "debug logging (same as DDP_LOG_LEVEL=debug)");

  // Each command's options, in --help's order. CLI11 makes every option when it is added, which
  // was two thirds of `ddpctl --version`'s instructions: only the command on the command line is
  // made; none for --version alone; every one without a command (--help, errors) and for
  // `generate` (the man page).
  using Commands = std::vector<ddpctl::Command>;
  const struct {
    std::vector<std::string> names;
    Commands (*add)(CLI::App&);
  } kinds[] = {
      {{"launch"}, [](CLI::App& a) { return Commands{ddpctl::add_launch_command(a)}; }},
      {{"doctor"}, [](CLI::App& a) { return Commands{ddpctl::add_doctor_command(a)}; }},
      {{"store"}, [](CLI::App& a) { return Commands{ddpctl::add_store_command(a)}; }},
      {{"render"}, [](CLI::App& a) { return Commands{ddpctl::add_render_command(a)}; }},
      {{"generate"}, [](CLI::App& a) { return Commands{ddpctl::add_generate_command(a)}; }},
      {{"stacks"}, [](CLI::App& a) { return Commands{ddpctl::add_stacks_command(a)}; }},
      {{"torchrun"}, [](CLI::App& a) { return Commands{ddpctl::add_torchrun_command(a)}; }},
      {{"status", "logs", "stop"}, [](CLI::App& a) { return ddpctl::add_control_commands(a); }},
  };
  std::vector<std::string> words(argv + 1, argv + argc);
  std::vector<std::string> names;
  for (const auto& k : kinds) names.insert(names.end(), k.names.begin(), k.names.end());
  const auto asked =
      std::find_if(words.begin(), words.end(), [](const std::string& w) { return !w.empty() && w[0] != '-'; });
  const auto has = [&](const char* flag) { return std::find(words.begin(), words.end(), flag) != words.end(); };
  const bool all = asked == words.end() || *asked == "generate";
  const bool none = asked == words.end() && has("--version") && !has("--help") && !has("-h");
  Commands commands;
  for (const auto& k : kinds) {
    if (none || (!all && std::find(k.names.begin(), k.names.end(), *asked) == k.names.end())) continue;
    for (auto& c : k.add(app)) commands.push_back(std::move(c));
  }

  // A misspelt command: CLI11 would say "a subcommand is required" to someone who gave one.
  if (asked != words.end()) {
    const auto i = static_cast<std::size_t>(asked - words.begin());  // words may be resized below
    const std::string word = *asked;
    if (std::find(names.begin(), names.end(), word) == names.end()) {
      std::cerr << "ddpctl: unknown command '" << word << "'";
      if (auto near = ddp::nearest(word, names)) std::cerr << " (did you mean '" << *near << "'?)";
      std::cerr << "; run ddpctl --help for the list\n";
      return 2;
    }
    // A command that reads its own words (torchrun), or keeps some from CLI11 (launch's command).
    const std::vector<std::string> after(words.begin() + static_cast<std::ptrdiff_t>(i) + 1, words.end());
    for (auto& c : commands) {
      if (!c.app || c.app->get_name() != word) continue;
      if (c.run_raw) {
        for (std::size_t j = 0; j < i; ++j) {
          if (words[j] == "-v" || words[j] == "--verbose") ddp::log::set_level(spdlog::level::debug);
        }
        try {
          return c.run_raw(after);
        } catch (const std::exception& e) {
          std::cerr << "ddpctl: " << e.what() << "\n";
          return 2;
        }
      }
      if (c.take_words) {
        auto kept = c.take_words(after);
        words.resize(i + 1);
        words.insert(words.end(), kept.begin(), kept.end());
      }
    }
  }
  try {
    // CLI11 takes the words last first.
    std::vector<std::string> reversed(words.rbegin(), words.rend());
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; a bad command line exits 2, as a bad job file does (CLI11's
    // own codes, 105-109, mean nothing to a script), said as every other error of ours is.
    if (e.get_exit_code() == 0) return app.exit(e);
    // The command being parsed when it failed: the deepest one CLI11 had entered (`store serve`).
    std::string cmd = "ddpctl";
    for (const CLI::App* at = &app; !at->get_subcommands().empty();) {
      at = at->get_subcommands().back();
      cmd += " " + at->get_name();
    }
    std::string what = e.what();
    if (what.size() > 1 && std::isupper(static_cast<unsigned char>(what[0])) &&
        (std::islower(static_cast<unsigned char>(what[1])) || what[1] == ' '))
      what[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(what[0])));
    std::cerr << cmd << ": " << what << "; see " << cmd << " --help\n";
    return 2;
  }
  if (verbose) ddp::log::set_level(spdlog::level::debug);

  try {
    for (auto& c : commands) {
      if (c.app && c.app->parsed()) return c.run();
    }
  } catch (const std::exception& e) {
    std::cerr << "ddpctl: " << e.what() << "\n";
    return 2;
  }
  return 2;
}
