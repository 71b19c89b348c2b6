"""The job's Python and PyTorch (lib/pyenv) and the environment the contract sets for them.

Debian's /usr/bin/python3 here has torch 1.13, which reads only NCCL_ASYNC_ERROR_HANDLING: its
ranks must get that name, not the TORCH_ one it does not understand, and print no warning about
anything ddpctl set. Virtualenvs made in the test (with and without the system's site packages)
first on PATH: doctor and the dry-run name that interpreter and its torch (or none)."""
import json
import os
import subprocess
from pathlib import Path

from ddptest import DDPCTL, PYTHON, launch, venv, write_job

WORKER = """
import json, os, sys
import torch.distributed as dist
dist.init_process_group(backend="gloo", init_method="env://")
t = __import__("torch").ones(1)
dist.all_reduce(t)
assert t.item() == dist.get_world_size()
dist.barrier()
dist.destroy_process_group()
names = {k: v for k, v in os.environ.items() if "ASYNC_ERROR_HANDLING" in k}
json.dump(names, open(f"async-{os.environ['RANK']}.json", "w"))
print("rank done", flush=True)
"""


def env_with_path_first(d: Path) -> dict:
    return {"PATH": f"{d / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}", "VIRTUAL_ENV": str(d)}


def test_torch_113_ranks_get_its_name_and_print_no_warning(tmp_path):
    (tmp_path / "worker.py").write_text(WORKER)
    job = write_job(tmp_path, f"nproc_per_node: 2\ncommand: [{PYTHON}, worker.py]\nworkdir: {tmp_path}\n")
    r = launch(job, "--job-id", "py113")
    assert r.returncode == 0, r.stderr
    for rank in range(2):
        # The only name 1.13 reads; the TORCH_ one would be a variable it ignores.
        assert json.loads((tmp_path / f"async-{rank}.json").read_text()) == {"NCCL_ASYNC_ERROR_HANDLING": "1"}
        log = (tmp_path / "logs" / "py113" / "attempt-0" / f"rank-{rank}.log").read_text()
        assert "rank done" in log
        for word in ("Warning", "deprecated"):
            assert word not in log, f"rank {rank} printed a {word}:\n{log}"
    terminal = r.stdout + r.stderr
    assert "deprecated" not in terminal, terminal


def test_dry_run_and_doctor_show_a_virtualenvs_torch(tmp_path):
    with_torch = venv(tmp_path, "venv-sys", system_site=True)
    without = venv(tmp_path, "venv-bare", system_site=False)
    job = write_job(tmp_path, "nproc_per_node: 1\ncommand: [python3, train.py]\n")
    for d, torch in ((with_torch, "1.13."), (without, None)):
        env = dict(os.environ, **env_with_path_first(d))
        r = subprocess.run([DDPCTL, "launch", str(job), "--dry-run"], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        plan = json.loads(r.stdout)
        py = plan["nodes"][0]["python"]
        assert py["interpreter"] == str(d / "bin" / "python3"), py
        assert py["source"] == "the command's program"
        assert py["version"].startswith("3.")
        aeh = plan["nodes"][0]["async_error_handling"]
        rank_env = plan["ranks"][0]["env"]
        if torch:
            assert py["torch"].startswith(torch), py
            assert aeh["names"] == ["NCCL_ASYNC_ERROR_HANDLING"], aeh
            assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in rank_env
        else:
            assert "torch" not in py, py  # that venv has none, whatever the system Python has
            assert sorted(aeh["names"]) == ["NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_ASYNC_ERROR_HANDLING"], aeh
            assert "not known" in aeh["why"]

        # doctor: python3 on PATH by default, the job's interpreter with --job; same answer here.
        for args in (["--json"], ["--json", "--job", str(job)]):
            r = subprocess.run([DDPCTL, "doctor", "--no-nvml", *args], cwd=tmp_path, env=env, capture_output=True,
                               text=True, timeout=60)
            assert r.returncode in (0, 1), r.stderr
            facts = json.loads(r.stdout)
            assert facts["python"]["interpreter"] == str(d / "bin" / "python3"), facts["python"]
            assert facts["python"].get("torch", "none").startswith(torch or "none"), facts["python"]
        r = subprocess.run([DDPCTL, "doctor", "--no-nvml", "--job", str(job)], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=60)
        table = r.stdout
        assert str(d / "bin" / "python3") in table, table
        assert (f"torch {torch}" if torch else "torch none") in table, table


def test_python_key_names_the_interpreter_of_a_shell_script(tmp_path):
    with_torch = venv(tmp_path, "venv-sys", system_site=True)
    (tmp_path / "run.sh").write_text("#!/bin/sh\nexec python3 train.py\n")
    job = write_job(tmp_path, f"nproc_per_node: 1\ncommand: [sh, run.sh]\npython: {with_torch}/bin/python3\n")
    r = subprocess.run([DDPCTL, "launch", str(job), "--dry-run"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    py = json.loads(r.stdout)["nodes"][0]["python"]
    assert py["interpreter"] == f"{with_torch}/bin/python3" and py["torch"].startswith("1.13."), py
    assert py["source"].startswith("python: in "), py

    # Without it, the guess is said to be one.
    job = write_job(tmp_path, "nproc_per_node: 1\ncommand: [sh, run.sh]\n", name="guess.yaml")
    r = subprocess.run([DDPCTL, "launch", str(job), "--dry-run"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert "set python:" in json.loads(r.stdout)["nodes"][0]["python"]["source"]

    # A wrong python: is an error with its place in the file.
    bad = write_job(tmp_path, "command: [sh, run.sh]\npython: [uv, 3]\n", name="bad.yaml")
    bad.write_text("command: [sh, run.sh]\npython: {uv: run}\n")
    r = subprocess.run([DDPCTL, "launch", str(bad), "--dry-run"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode != 0
    assert "bad.yaml:2:9: error: python: expected a program" in r.stderr, r.stderr
