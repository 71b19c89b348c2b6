"""A failed attempt's NCCL flight recorder dumps in ddpctl's report (local launcher).

PyTorch 1.13 (Debian's, here) has no flight recorder, and gloo none either, so no real dump can
be made on this machine (tests/gpu/flight_on_h200.sh makes them with NCCL). So that ddpctl turns
it on, the job's Python is shown a torch 2.11 distribution record (a dist-info folder on
PYTHONPATH: what lib/pyenv's probe reads; torch itself is never imported by it), as
tests/integration/multinode/test_flight_nodes.py does. Rank 0 of the job then writes both ranks'
dumps itself, pickles in the recorder's documented layout
(torch/csrc/distributed/c10d/FlightRecorder.hpp), under the name ddpctl gave the recorder
(TORCH_NCCL_DEBUG_INFO_TEMP_FILE), and fails as a rank whose collective timed out does; what is
tested is everything after that: finding the dumps, the converter run with the job's Python, the
analysis, and the line in the report and in --result-json. Where ddpctl did not turn the recorder
on, dumps in the folder are not its to read."""
import json
import os
import subprocess

from ddptest import DDPCTL, PYTHON, launch, write_job

WRITER = r'''
import os, pickle, sys, time
rank = int(os.environ["RANK"])
# The name ddpctl gave the recorder; without one (recorder off) the same names, to show they are
# then left alone.
prefix = os.environ.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE") or os.path.join(
    os.path.dirname(os.environ["TORCHELASTIC_ERROR_FILE"]), "nccl-flight-rank-")
def entry(seq, state):
    return {"record_id": seq - 1, "pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": seq,
            "p2p_seq_id": 0, "op_id": seq, "profiling_name": "nccl:all_reduce", "time_created_ns": 1000 + seq,
            "input_sizes": [[1048576]], "input_dtypes": ["Float"], "output_sizes": [[1048576]],
            "output_dtypes": ["Float"], "state": state, "retired": state == "completed", "timeout_ms": 30000,
            "is_p2p": False, "frames": []}
if rank == 0:
    cfg = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}}
    dumps = {0: [entry(s, "completed") for s in (1, 2, 3)] + [entry(4, "started")],
             1: [entry(s, "completed") for s in (1, 2, 3)]}
    for r, es in dumps.items():
        with open(f"{prefix}{r}", "wb") as f:
            pickle.dump({"version": "2.4", "pg_config": cfg, "pg_status": {}, "entries": es}, f)
    sys.exit(6)  # as a rank that NCCL's watchdog aborted
time.sleep(600)  # rank 1: "stuck in Python" until ddpctl stops it
'''

EXPECTED = "flight recorder: rank 0 entered all_reduce #4 (pg 0, 4 MiB), rank 1 did not"


def fake_torch_2(tmp_path):
    """A folder for PYTHONPATH where the probe finds a torch 2.11 distribution record."""
    fake = tmp_path / "fake-torch"
    (fake / "torch-2.11.0.dist-info").mkdir(parents=True)
    (fake / "torch-2.11.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.11.0\n")
    os.chmod(fake, 0o755)
    return fake


def test_the_report_names_the_collective_rank_1_did_not_enter(tmp_path):
    (tmp_path / "writer.py").write_text(WRITER)
    fake = fake_torch_2(tmp_path)
    job = write_job(tmp_path, f"name: fr\nnproc_per_node: 2\ncommand: [{PYTHON}, writer.py]\n"
                              f"stop: {{grace: 5s}}\nenv: {{PYTHONPATH: {fake}}}\n")
    result = tmp_path / "result.json"
    r = launch(job, "--result-json", str(result), timeout=120)
    assert r.returncode == 1, r.stderr
    assert EXPECTED in r.stderr, r.stderr
    notes = json.loads(result.read_text())["attempts"][0]["notes"]
    assert EXPECTED in notes, notes


def test_dumps_are_not_read_where_ddpctl_did_not_turn_the_recorder_on(tmp_path):
    """PyTorch 1.13 (no fake): the recorder is off, so the same dumps are not ddpctl's to read."""
    (tmp_path / "writer.py").write_text(WRITER)
    job = write_job(tmp_path, f"name: fr\nnproc_per_node: 2\ncommand: [{PYTHON}, writer.py]\n"
                              "stop: {grace: 5s}\n")
    r = launch(job, timeout=120)
    assert r.returncode == 1, r.stderr
    assert "flight recorder" not in r.stderr, r.stderr


def test_no_dumps_no_line(tmp_path):
    job = write_job(tmp_path, f"name: fr\nnproc_per_node: 2\ncommand: [{PYTHON}, -c, 'import sys; sys.exit(3)']\n"
                              "stop: {grace: 1s}\n")
    r = launch(job, timeout=60)
    assert r.returncode == 1
    assert "flight recorder" not in r.stderr, r.stderr


def test_the_dry_run_says_this_pytorch_has_no_flight_recorder(tmp_path):
    """1.13 here: not turned on, and the dry-run says why; no variable of it in the plan."""
    job = write_job(tmp_path, f"name: fr\nnproc_per_node: 1\ncommand: [{PYTHON}, -c, 'pass']\n")
    r = subprocess.run([DDPCTL, "launch", "--dry-run", str(job)], cwd=tmp_path, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    node = plan["nodes"][0]
    torch = (node["python"] or {}).get("torch")
    assert torch and torch.startswith("1."), node["python"]
    assert node["flight_recorder"]["on"] is False
    assert torch in node["flight_recorder"]["why"]
    assert not any(k.startswith("TORCH_NCCL_TRACE") or k.startswith("TORCH_NCCL_DEBUG_INFO")
                   for k in plan["ranks"][0]["env"])
