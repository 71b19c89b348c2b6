#include "cliexport/cliexport.hpp"

#include <gtest/gtest.h>

using ddp::cliexport::bash_completion;
using ddp::cliexport::man_page;

namespace {

// A small program shaped like ddpctl: a flag, a valued option, nested and hidden subcommands.
struct Program {
  CLI::App app{"tool: does things"};
  std::string file, out, secret;
  bool verbose = false, hush = false;
  int n = 0;
  Program() {
    app.add_flag("-v,--verbose", verbose, "more output");
    auto* run = app.add_subcommand("run", "run a job-file");
    run->add_option("job_file", file, "the job file")->required();
    run->add_option("-n,--count", n, "how many; at least 1")->check(CLI::Range(1, 9));
    run->add_option("--out", out, ".starts with a dot, has a \\ backslash");
    run->add_flag("--hush", hush, "no output")->group("");
    auto* render = app.add_subcommand("render", "write manifests");
    render->add_subcommand("k8s", "Kubernetes");
    app.add_subcommand("secret-export", "for the build")->group("");
  }
};

}  // namespace

TEST(CliExport, ManPageHasEverySectionOptionAndSubcommand) {
  Program p;
  const auto man = man_page(p.app, {"tool", 1, "tool 1.0", "other(8)"});
  EXPECT_EQ(man.rfind(".TH TOOL 1 \"\" \"tool 1.0\" \"User Commands\"\n", 0), 0u) << man;
  EXPECT_NE(man.find(".SH NAME\ntool \\- does things\n"), std::string::npos) << man;
  EXPECT_NE(man.find("\\fB\\-v\\fR, \\fB\\-\\-verbose\\fR\nmore output"), std::string::npos) << man;
  EXPECT_NE(man.find(".SS \"tool run\"\n\\fBtool run\\fR [\\fIOPTIONS\\fR] \\fIjob_file\\fR"), std::string::npos)
      << man;
  EXPECT_NE(man.find("\\fB\\-n\\fR, \\fB\\-\\-count\\fR \\fIINT\\fR\nhow many; at least 1"), std::string::npos) << man;
  EXPECT_NE(man.find(".SS \"tool render k8s\""), std::string::npos) << man;
  EXPECT_NE(man.find("\\&.starts with a dot, has a \\e backslash"), std::string::npos) << man;  // not a request
  EXPECT_NE(man.find(".SH SEE ALSO\nother(8)"), std::string::npos) << man;
  EXPECT_EQ(man.find("hush"), std::string::npos);    // hidden option
  EXPECT_EQ(man.find("secret"), std::string::npos);  // hidden subcommand
}

TEST(CliExport, BashCompletionKnowsPathsOptionsAndValues) {
  Program p;
  const auto sh = bash_completion(p.app, "tool");
  EXPECT_NE(sh.find("complete -o filenames -F _tool tool"), std::string::npos) << sh;
  EXPECT_NE(sh.find("\" run\"|\" render\"|\" render k8s\")"), std::string::npos) << sh;
  EXPECT_NE(sh.find("\"\") subs=\"run render\"; opts=\"-h --help -v --verbose\"; valued=\"\"; files=0 ;;"),
            std::string::npos)
      << sh;
  // -n/--count and --out take values (file names are completed after them); run takes a file.
  EXPECT_NE(
      sh.find("\" run\") subs=\"\"; opts=\"-h --help -n --count --out\"; valued=\"-n --count --out\"; files=1 ;;"),
      std::string::npos)
      << sh;
  EXPECT_EQ(sh.find("hush"), std::string::npos);
  EXPECT_EQ(sh.find("secret"), std::string::npos);
}
