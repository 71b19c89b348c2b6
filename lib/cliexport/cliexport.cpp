#include "cliexport/cliexport.hpp"

#include <fmt/format.h>

#include <cctype>
#include <vector>

namespace ddp::cliexport {

namespace {

bool hidden(const CLI::Option* o) {
  return o->get_group().empty();
}
bool hidden(const CLI::App* a) {
  return a->get_group().empty();
}

std::vector<const CLI::App*> subcommands(const CLI::App& app) {
  return app.get_subcommands([](const CLI::App* a) { return !hidden(a); });
}

std::vector<const CLI::Option*> options(const CLI::App& app) {
  return app.get_options([](const CLI::Option* o) { return !hidden(o) && o->nonpositional(); });
}

std::vector<const CLI::Option*> positionals(const CLI::App& app) {
  return app.get_options([](const CLI::Option* o) { return !hidden(o) && !o->nonpositional(); });
}

// Flags have no type name; options that take a value do (what CLI11's own help shows).
bool takes_value(const CLI::Option* o) {
  return o->get_type_size() != 0 && !o->get_type_name().empty();
}

// "INT" for an option CLI11 shows as "INT:INT in [1 - 10000]" (the checks are in the text).
std::string value_name(const CLI::Option* o) {
  std::string t = o->get_type_name();
  t = t.substr(0, t.find(':'));
  return t;
}

// Text for roff: backslashes escaped, '-' as a real minus (so it can be searched and pasted),
// and a line starting with '.' or '\'' kept from being read as a request.
std::string roff(const std::string& s) {
  std::string out;
  bool line_start = true;
  for (char c : s) {
    if (line_start && (c == '.' || c == '\'')) out += "\\&";
    if (c == '\\')
      out += "\\e";
    else if (c == '-')
      out += "\\-";
    else
      out += c;
    line_start = c == '\n';
  }
  return out;
}

std::string option_names(const CLI::Option* o) {
  std::vector<std::string> names;
  for (const auto& s : o->get_snames()) names.push_back(fmt::format("\\fB\\-{}\\fR", roff(s)));
  for (const auto& l : o->get_lnames()) names.push_back(fmt::format("\\fB\\-\\-{}\\fR", roff(l)));
  std::string text = fmt::format("{}", fmt::join(names, ", "));
  if (takes_value(o)) text += fmt::format(" \\fI{}\\fR", roff(value_name(o)));
  return text;
}

// "ddpctl render k8s [OPTIONS] job_file"
std::string usage(const CLI::App& app, const std::string& path) {
  std::string u = fmt::format("\\fB{}\\fR", roff(path));
  if (!options(app).empty()) u += " [\\fIOPTIONS\\fR]";
  if (!subcommands(app).empty()) u += " \\fICOMMAND\\fR";
  for (const auto* p : positionals(app)) {
    const std::string name = fmt::format("\\fI{}\\fR", roff(p->get_name()));
    u += p->get_required() ? " " + name : " [" + name + "]";
  }
  return u;
}

void man_options(std::string& out, const CLI::App& app) {
  for (const auto* o : options(app)) out += fmt::format(".TP\n{}\n{}\n", option_names(o), roff(o->get_description()));
  for (const auto* p : positionals(app))
    out += fmt::format(".TP\n\\fI{}\\fR\n{}\n", roff(p->get_name()), roff(p->get_description()));
}

void man_commands(std::string& out, const CLI::App& app, const std::string& path) {
  for (const auto* sub : subcommands(app)) {
    const std::string sub_path = path + " " + sub->get_name();
    out +=
        fmt::format(".SS \"{}\"\n{}\n.PP\n{}\n", roff(sub_path), usage(*sub, sub_path), roff(sub->get_description()));
    man_options(out, *sub);
    man_commands(out, *sub, sub_path);
  }
}

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

std::string man_page(const CLI::App& app, const ManInfo& info) {
  // The description reads "prog: what it does"; NAME wants "prog \- what it does".
  std::string what = app.get_description();
  if (what.rfind(info.program + ": ", 0) == 0) what = what.substr(info.program.size() + 2);
  std::string out = fmt::format(".TH {} {} \"\" \"{}\" \"{}\"\n", upper(info.program), info.section, roff(info.version),
                                info.section == 8 ? "System Administration" : "User Commands");
  out += fmt::format(".SH NAME\n{} \\- {}\n", roff(info.program), roff(what));
  out += fmt::format(".SH SYNOPSIS\n{}\n", usage(app, info.program));
  out += fmt::format(".SH DESCRIPTION\n{}\n", roff(what));
  if (!options(app).empty() || !positionals(app).empty()) {
    out += ".SH OPTIONS\n";
    man_options(out, app);
  }
  if (!subcommands(app).empty()) {
    out += ".SH COMMANDS\n";
    man_commands(out, app, info.program);
  }
  if (!info.see_also.empty()) out += fmt::format(".SH SEE ALSO\n{}\n", roff(info.see_also));
  return out;
}

namespace {

void completion_cases(std::string& paths, std::string& cases, const CLI::App& app, const std::string& path) {
  std::vector<std::string> subs, opts, valued;
  for (const auto* s : subcommands(app)) subs.push_back(s->get_name());
  for (const auto* o : options(app)) {
    for (const auto& s : o->get_snames()) (takes_value(o) ? valued : opts).push_back("-" + s);
    for (const auto& l : o->get_lnames()) (takes_value(o) ? valued : opts).push_back("--" + l);
  }
  std::vector<std::string> all_opts = opts;
  all_opts.insert(all_opts.end(), valued.begin(), valued.end());
  cases += fmt::format("    \"{}\") subs=\"{}\"; opts=\"{}\"; valued=\"{}\"; files={} ;;\n", path, fmt::join(subs, " "),
                       fmt::join(all_opts, " "), fmt::join(valued, " "), positionals(app).empty() ? 0 : 1);
  for (const auto* s : subcommands(app)) {
    const std::string sub_path = path + " " + s->get_name();
    paths += fmt::format("|\"{}\"", sub_path);
    completion_cases(paths, cases, *s, sub_path);
  }
}

}  // namespace

std::string bash_completion(const CLI::App& app, const std::string& program) {
  std::string paths, cases;
  completion_cases(paths, cases, app, "");
  std::string fn = "_" + program;
  for (char& c : fn) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return fmt::format(R"(# bash completion for {prog}, generated from its command-line definition.
{fn}() {{
  local cur=${{COMP_WORDS[COMP_CWORD]}} prev=${{COMP_WORDS[COMP_CWORD-1]}} path="" i
  # The subcommand path typed so far (options and their values in between are skipped).
  for ((i = 1; i < COMP_CWORD; i++)); do
    case "$path ${{COMP_WORDS[i]}}" in
      {paths}) path="$path ${{COMP_WORDS[i]}}" ;;
    esac
  done
  local subs="" opts="" valued="" files=0
  case "$path" in
{cases}  esac
  if [[ -n $valued && " $valued " == *" $prev "* ]]; then
    COMPREPLY=($(compgen -f -- "$cur"))
  elif [[ $cur == -* ]]; then
    COMPREPLY=($(compgen -W "$opts" -- "$cur"))
  else
    COMPREPLY=($(compgen -W "$subs" -- "$cur"))
    if ((files)); then COMPREPLY+=($(compgen -f -- "$cur")); fi
  fi
}}
complete -o filenames -F {fn} {prog}
)",
                     fmt::arg("prog", program), fmt::arg("fn", fn),
                     fmt::arg("paths", paths.empty() ? "\"\"" : paths.substr(1)), fmt::arg("cases", cases));
}

}  // namespace ddp::cliexport
