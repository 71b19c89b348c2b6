"""The README's quick start, run exactly as written.

The fenced block after the `<!-- quick-start: ... -->` marker in README.md is read here and
each of its lines runs, word for word, under bash, in a fresh copy of this checkout (the
source tree without build*/, logs/ or .git) whose `build` is a link to the build under test, as
a user who just cloned the tree and ran `./scripts/build` would have it. So `./scripts/build`
runs for real (on a built tree: `scripts/setup` finds every package and ninja has nothing to
do), and every `build/bin/ddpctl ...` line runs the binaries this suite tests. PATH is a fresh
Debian 12 root shell's, as the README promises: there `python3` is Debian's, with the
python3-torch that scripts/setup installs (a developer's PATH may put another python3 first).

What a user would look at after each kind of command is asserted; every line must exit 0, and
each kind must be in the block (a README that drops its launch line fails here, as does one
whose command or flag no longer works)."""
import json
import os
import re
import shutil
import subprocess

import pytest

from ddptest import BINARY_DIR, SOURCE_DIR

README = SOURCE_DIR / "README.md"
MARKER = "<!-- quick-start:"


def quickstart_lines(text):
    """The command lines of the first fenced block after the marker, as written."""
    at = text.find(MARKER)
    assert at >= 0, f"README.md has no '{MARKER}' marker before its quick-start block"
    rest = text[at:].split("\n")
    opening = next((i for i, l in enumerate(rest) if l.startswith("```")), None)
    assert opening is not None, "no fenced block after the quick-start marker"
    lines = []
    for line in rest[opening + 1:]:
        if line.startswith("```"):
            return lines
        if line.strip():
            lines.append(line)
    raise AssertionError("the quick-start block is not closed")


def kind(line):
    if re.match(r"^\./scripts/build(\s|$)", line):
        return "build"
    if re.search(r"\bddpctl launch\b.*--dry-run", line):
        return "dry-run"
    if re.search(r"\bddpctl launch\b.*configs/train_ddp\.yaml", line):
        return "launch"
    if re.search(r"\bddpctl torchrun\b", line):
        return "torchrun"
    return "other"


def checkout_copy(dest):
    """The source tree as a fresh clone has it, plus `build` -> the build under test."""
    def ignore(folder, names):
        top = os.path.samefile(folder, SOURCE_DIR)
        return [n for n in names if n == "__pycache__" or (top and (n in ("build", "logs", "checkpoints", ".git")
                                                                     or n.startswith("build-")))]
    shutil.copytree(SOURCE_DIR, dest, ignore=ignore, symlinks=True)
    os.symlink(BINARY_DIR, dest / "build")
    return dest


DEBIAN_ROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def run(line, cwd):
    return subprocess.run(["bash", "-c", line], cwd=cwd, capture_output=True, text=True, timeout=400,
                          env={**os.environ, "PATH": DEBIAN_ROOT_PATH})


def job_dirs(tree):
    return {d for d in (tree / "logs").glob("*/attempt-0")}


def test_the_readme_marks_a_quickstart_block_with_each_kind_of_command():
    lines = quickstart_lines(README.read_text())
    kinds = [kind(l) for l in lines]
    assert kinds[0] == "build", f"the quick start must begin with ./scripts/build: {lines}"
    for k in ("launch", "dry-run", "torchrun"):
        assert k in kinds, f"no {k} command in the README's quick start: {lines}"


def test_the_readme_quickstart_runs_as_written(tmp_path):
    lines = quickstart_lines(README.read_text())
    tree = checkout_copy(tmp_path / "ddpctl")
    seen = set()
    for line in lines:
        k = kind(line)
        before = job_dirs(tree)
        r = run(line, tree)
        new_jobs = job_dirs(tree) - before
        out = r.stdout + r.stderr
        assert r.returncode == 0, f"README quick start: `{line}` exited {r.returncode}:\n{out[-4000:]}"
        seen.add(k)
        if k == "launch":
            # The loss is printed by rank 0 every epoch (examples/python/train_ddp.py) and falls;
            # every rank of the 4 has its log file; the job ended.
            losses = [float(m) for m in re.findall(r"^\[0\] epoch \d+ loss ([0-9.]+)$", r.stdout, re.M)]
            assert len(losses) == 6 and losses[-1] < losses[0], out[-4000:]
            assert re.search(r"job train-ddp-\S+ succeeded", out), out[-4000:]
            assert len(new_jobs) == 1, new_jobs
            ranks = sorted(p.name for p in next(iter(new_jobs)).glob("rank-*.log"))
            assert ranks == [f"rank-{r}.log" for r in range(4)], ranks
            ckpts = list((tree / "logs" / "checkpoints").glob("train-ddp-*.pt"))
            assert len(ckpts) == 1, ckpts  # {run_id} filled in by the script with the job id
        elif k == "dry-run":
            plan = json.loads(r.stdout)
            assert plan["world_size"] == 4 and [x["rank"] for x in plan["ranks"]] == [0, 1, 2, 3], plan
            assert not new_jobs, new_jobs  # it starts nothing
        elif k == "torchrun":
            assert re.search(r"^\[0\] epoch 1 loss [0-9.]+$", r.stdout, re.M), out[-4000:]
            assert re.search(r"job \S+ succeeded", out), out[-4000:]
            # Rank 1 prints nothing of its own (only rank 0 reports the loss): its log file is there.
            assert len(new_jobs) == 1, new_jobs
            ranks = sorted(p.name for p in next(iter(new_jobs)).glob("rank-*.log"))
            assert ranks == ["rank-0.log", "rank-1.log"], ranks
    assert {"build", "launch", "dry-run", "torchrun"} <= seen


def github_anchor(heading):
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path):
    found, in_code = set(), False
    for line in path.read_text().split("\n"):
        if line.startswith("```"):
            in_code = not in_code
        m = re.match(r"^#{1,6} (.*)", line)
        if m and not in_code:
            found.add(github_anchor(m.group(1)))
    return found


def test_every_link_in_the_readme_and_docs_leads_somewhere():
    """The README sends users to docs/ for everything long: each relative link names a file of the
    tree and, with #anchor, a heading in it (GitHub's anchors)."""
    broken = []
    for doc in [README, *sorted((SOURCE_DIR / "docs").glob("*.md"))]:
        for link in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
            if re.match(r"^[a-z]+://", link):
                continue
            path, _, anchor = link.partition("#")
            target = (doc.parent / path).resolve() if path else doc
            if not target.exists():
                broken.append(f"{doc.name}: {link} (no such file)")
            elif anchor and target.suffix == ".md" and anchor not in anchors(target):
                broken.append(f"{doc.name}: {link} (no such heading)")
    assert not broken, broken
