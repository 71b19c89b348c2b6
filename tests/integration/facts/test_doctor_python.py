"""ddpctl doctor's python section as a user reads it, on this machine, with virtualenvs first on
PATH (one without torch, one with the system's site packages, where Debian's torch is):

- the label says why this interpreter was asked in this run, also when the answer comes from the
  probe's cache, which an earlier run asked for another reason;
- the versions table's torch is the python section's (the system Python's torch/version.py was
  shown beside "torch none");
- an interpreter without torch is a finding, an error where it is the job's own, never "ok"."""
import os
import subprocess
from pathlib import Path

from ddptest import PYTHON, venv

SRC = os.environ.get("DDP_SOURCE_DIR", os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))
BIN = os.path.join(os.environ.get("DDP_BINARY_DIR", os.path.join(SRC, "build")), "bin", "ddpctl")


def doctor(tmp: Path, first: Path, *args):
    """doctor in `tmp` with `first`'s bin first on PATH and a probe cache of the test's own."""
    env = dict(os.environ, PATH=f"{first / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}",
               VIRTUAL_ENV=str(first), XDG_CACHE_HOME=str(tmp / "cache"))
    env.pop("DDP_SYSFS_ROOT", None)
    return subprocess.run([BIN, "doctor", "--no-nvml", "--cpu-job", *args], cwd=tmp, env=env, capture_output=True,
                          text=True, timeout=60)


def block(out: str, title: str) -> str:
    """The lines of one section of the table: from its title to the next blank line."""
    lines = out.splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith(title))
    end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
    return "\n".join(lines[start:end])


def finding(out: str, code: str) -> str:
    return next((l for l in out.splitlines() if l.rstrip().endswith(f"[{code}]")), "")


def test_the_label_is_this_runs_even_from_the_cache(tmp_path):
    bare = venv(tmp_path, "venv-bare", system_site=False)
    shell = tmp_path / "shell.yaml"
    shell.write_text("nproc_per_node: 1\ncommand: [bash, run.sh]\n")
    own = tmp_path / "own.yaml"
    own.write_text("nproc_per_node: 1\ncommand: [python3, train.py]\n")

    # One interpreter (the venv's python3), one workdir, one environment: one cache entry.
    r = doctor(tmp_path, bare)
    assert "python (python3 on PATH (give --job FILE" in r.stdout, r.stdout
    assert (tmp_path / "cache" / "ddpctl" / "python.jsonl").exists()
    r = doctor(tmp_path, bare, "--job", str(shell))
    py = block(r.stdout, "python (")
    assert py.startswith("python (a guess: python3 on the job's PATH"), py
    assert "set python: in the job file" in py, py
    assert str(bare / "bin" / "python3") in py, py
    r = doctor(tmp_path, bare, "--job", str(own))
    py = block(r.stdout, "python (")
    assert py.startswith("python (the command's program)"), py
    # And back: the first question's own words again.
    r = doctor(tmp_path, bare)
    assert "python (python3 on PATH (give --job FILE" in r.stdout, r.stdout


def test_the_versions_table_says_the_python_sections_torch(tmp_path):
    bare = venv(tmp_path, "venv-bare", system_site=False)
    with_torch = venv(tmp_path, "venv-sys", system_site=True)
    system_torch = subprocess.run([PYTHON, "-c", "import torch.version as v; print(v.__version__)"],
                                  capture_output=True, text=True, timeout=120).stdout.strip()

    r = doctor(tmp_path, bare)
    versions, py = block(r.stdout, "versions"), block(r.stdout, "python (")
    assert "torch none" in py, py
    assert "(torch of the python below)" in versions, versions
    # The torch column: "none", as the python section says, not the system Python's beside it.
    head, row = versions.splitlines()[1].split(), versions.splitlines()[2].split()
    assert row[head.index("torch")] == "none", versions
    if system_torch:
        assert system_torch not in versions, versions

    r = doctor(tmp_path, with_torch)
    versions, py = block(r.stdout, "versions"), block(r.stdout, "python (")
    head, row = versions.splitlines()[1].split(), versions.splitlines()[2].split()
    torch = py.rsplit("torch ", 1)[1]
    assert torch != "none", py
    assert row[head.index("torch")] == torch, r.stdout


def test_an_interpreter_without_torch_is_not_ok(tmp_path):
    bare = venv(tmp_path, "venv-bare", system_site=False)
    with_torch = venv(tmp_path, "venv-sys", system_site=True)
    own = tmp_path / "own.yaml"
    own.write_text("nproc_per_node: 1\ncommand: [python3, train.py]\n")
    interpreter = str(bare / "bin" / "python3")

    # The job's own interpreter: an error (exit 1) that names it and says how to fix it.
    r = doctor(tmp_path, bare, "--job", str(own))
    assert r.returncode == 1, r.stdout + r.stderr
    line = finding(r.stdout, "python-no-torch")
    assert line.startswith("error"), r.stdout
    assert f"{interpreter} (the command's program)" in line, line
    assert "import torch" in line and "install PyTorch" in line and "python: key" in line, line
    assert "ok: no problems found" not in r.stdout

    # A guess (no job file): a warning that says how to ask the job's own.
    r = doctor(tmp_path, bare)
    line = finding(r.stdout, "python-no-torch")
    assert line.startswith("warning"), r.stdout
    assert interpreter in line and "ddpctl doctor --job FILE" in line, line
    assert "ok: no problems found" not in r.stdout

    # The same job with torch in its interpreter: no such finding.
    r = doctor(tmp_path, with_torch, "--job", str(own))
    assert "torch none" not in r.stdout, r.stdout
    assert not finding(r.stdout, "python-no-torch"), r.stdout
