"""The man pages and bash completion the build writes into build/share/ from the programs' CLI
definitions: man renders them without warnings, every flag of `--help` is documented, and the
completion completes subcommands and options when bash runs it."""
import gzip
import re
import shutil
import subprocess

import pytest

from ddptest import BINARY_DIR, DDPCTL

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
