"""The man pages and bash completion the build writes into build/share/ from the programs' CLI
definitions: man renders them without warnings, every flag of `--help` is documented, and the
completion completes subcommands and options when bash runs it."""
import gzip
import re
import shutil
import subprocess

import pytest

from ddptest import BINARY_DIR, DDPCTL, SOURCE_DIR

SHARE = BINARY_DIR / "share"
AGENTD = str(BINARY_DIR / "bin" / "ddp-agentd")


def man_text(name):
    return gzip.decompress((SHARE / name).read_bytes()).decode()


@pytest.mark.skipif(shutil.which("man") is None, reason="man-db is not installed (scripts/setup installs it)")
@pytest.mark.parametrize("page", ["ddpctl.1.gz", "ddp-agentd.8.gz"])
def test_man_pages_render_without_warnings(page):
    r = subprocess.run(["man", "--warnings", "-l", str(SHARE / page)], capture_output=True, text=True,
                       env={"MANWIDTH": "80", "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, timeout=60)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert "SYNOPSIS" in r.stdout and "OPTIONS" in r.stdout


def long_flags(help_text):
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]+", help_text))


@pytest.mark.parametrize("argv,page", [
    ([DDPCTL, "launch", "--help"], "ddpctl.1.gz"),
    ([DDPCTL, "render", "k8s", "--help"], "ddpctl.1.gz"),
    ([DDPCTL, "doctor", "--help"], "ddpctl.1.gz"),
    ([AGENTD, "--help"], "ddp-agentd.8.gz"),
    ([str(BINARY_DIR / "bin" / "ddp-coordinator"), "--help"], "ddp-coordinator.8.gz"),
])
def test_every_flag_in_help_is_in_the_man_page(argv, page):
    help_text = subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout
    flags = {f for f in long_flags(help_text) if f not in ("--help",)}
    # Flags named only inside descriptions (e.g. "see --nodes") are flags too; all must appear.
    text = man_text(page).replace("\\-", "-")
    missing = sorted(f for f in flags if f"\\fB{f}\\fR" not in text)
    assert flags and not missing, missing
    assert "generate-man" not in text and "generate" not in re.findall(r'\.SS "ddpctl (\w+)', text)


def complete(*words):
    script = (f"source {SHARE / 'ddpctl.bash-completion'}\n"
              "COMP_WORDS=(\"$@\"); COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); _ddpctl; printf '%s\\n' \"${COMPREPLY[@]}\"")
    r = subprocess.run(["bash", "-c", script, "bash", "ddpctl", *words], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return [w for w in r.stdout.split("\n") if w]


def test_bash_completion_completes_subcommands_options_and_files(tmp_path):
    assert complete("la") == ["launch"]
    assert complete("launch", "--no") == ["--nodes"]
    assert complete("-v", "render", "") == ["k8s"]
    assert complete("render", "k8s", "--ima") == ["--image"]
    assert set(complete("store", "serve", "--")) >= {"--listen", "--allow", "--world-size", "--help"}
    # A job file after `launch`, and a path after an option that takes one.
    (tmp_path / "train.yaml").write_text("command: [x]\n")
    assert complete("launch", str(tmp_path / "tra")) == [str(tmp_path / "train.yaml")]
    assert complete("launch", "--result-json", str(tmp_path / "tr")) == [str(tmp_path / "train.yaml")]


# The README and the reference name ddpctl's commands with their flags; each flag named with a
# subcommand must be one that subcommand accepts (its --help), so a renamed or removed flag
# fails here instead of sending a user to an error.
DOCS_WITH_COMMANDS = ["README.md", "docs/reference.md", "docs/multinode.md", "docs/torchrun.md", "docs/jobfile.md",
                      "docs/containers.md", "docs/protocol.md", "docs/security.md"]
SUBCOMMANDS = {"launch", "doctor", "status", "logs", "stop", "stacks", "torchrun", "store serve", "render k8s"}
FLAG = r"(?<![\w-])--[a-z][a-z0-9_-]+"


def commands_in(text):
    """(subcommand, the text after it) for every `ddpctl SUB ...` in code spans and code blocks;
    the script's or the command's own words (after `--` or a *.py) are left out."""
    spans = re.findall(r"`([^`\n]+)`", text) + re.findall(r"^```.*?\n(.*?)^```", text, re.M | re.S)
    for span in spans:
        for line in span.split("\n"):
            line = re.sub(r"\s#.*$", "", line)
            for m in re.finditer(r"(?<![\w/-])ddpctl ((?:store|render) \w+|[a-z|]+)(.*)", line):
                rest = re.split(r" -- |\S+\.py\b", m.group(2))[0]
                for sub in m.group(1).split("|"):
                    if sub in SUBCOMMANDS:
                        yield sub, rest


def test_every_flag_the_docs_name_with_a_subcommand_exists():
    helps, seen, missing = {}, set(), []
    for doc in DOCS_WITH_COMMANDS:
        for sub, rest in commands_in((SOURCE_DIR / doc).read_text()):
            if sub not in helps:
                r = subprocess.run([DDPCTL, *sub.split(), "--help"], capture_output=True, text=True, timeout=30)
                assert r.returncode == 0, r.stderr
                helps[sub] = set(re.findall(FLAG, r.stdout))
            seen.add(sub)
            missing += [f"{doc}: ddpctl {sub} {f}" for f in re.findall(FLAG, rest) if f not in helps[sub]]
    assert {"launch", "torchrun", "status", "logs", "stop", "stacks", "doctor"} <= seen, seen
    assert not missing, missing


def test_the_launch_flag_table_lists_exactly_the_flags_launch_takes():
    text = (SOURCE_DIR / "docs/reference.md").read_text()
    section = text.split("## `ddpctl launch`", 1)[1].split("\n## ", 1)[0]
    documented = set()
    for row in re.findall(r"^\| (.+?) \|", section, re.M):
        documented |= set(re.findall(FLAG, row))
    help_text = subprocess.run([DDPCTL, "launch", "--help"], capture_output=True, text=True, timeout=30).stdout
    options = set(re.findall(r"^\s+(?:-\w,)?(--[a-z][\w-]*)", help_text, re.M)) - {"--help"}
    assert options, help_text
    assert not options - documented, f"launch flags missing from docs/reference.md: {sorted(options - documented)}"
    assert not documented - options, f"docs/reference.md names launch flags that do not exist: {sorted(documented - options)}"
