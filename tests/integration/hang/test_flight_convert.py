"""The flight recorder's converter (lib/hang/flight_convert.py) on dumps in PyTorch's layout.

Debian's PyTorch here is 1.13, which has no NCCL flight recorder (it came with 2.2/2.3: see
docs/architecture.md), so nothing here pretends to be one: the test writes pickles with the keys
and shapes of torch/csrc/distributed/c10d/FlightRecorder.hpp (format versions 1.2 and 2.x) and
checks what the converter makes of them, and of files that are not dumps. The dumps of a real
recorder are read on the H200 (tests/gpu/flight_recorder.sh)."""
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

from ddptest import SOURCE_DIR

SCRIPT = SOURCE_DIR / "lib" / "hang" / "flight_convert.py"


def convert(folder: Path, *names):
    """The converter as ddpctl runs it: `python3 -I -c SCRIPT DIR NAME...`; its lines parsed."""
    r = subprocess.run([sys.executable, "-I", "-c", SCRIPT.read_text(), str(folder), *names], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert [x["file"] for x in lines] == list(names)
    return lines


def entry(record_id, seq, op="nccl:all_reduce", state="completed", pg=("0", "default_pg"), size=(1024,),
          p2p=False):
    """One entry as FlightRecorder<...>::getCollectiveTrace builds it (2.x)."""
    return {
        "record_id": record_id, "pg_id": 0, "process_group": pg,
        "collective_seq_id": 0 if p2p else seq, "p2p_seq_id": seq if p2p else 0, "op_id": seq,
        "profiling_name": op, "time_created_ns": 1_700_000_000_000_000_000 + record_id,
        "input_sizes": [list(size)], "input_dtypes": ["Float"],
        "output_sizes": [list(size)], "output_dtypes": ["Float"],
        "state": state, "time_discovered_started_ns": None, "time_discovered_completed_ns": None,
        "retired": state == "completed", "timeout_ms": 600000, "is_p2p": p2p,
        "frames": [{"name": "train", "filename": "train.py", "line": 42}],
    }


def dump_v2(entries, ranks="[0, 1]"):
    return {"version": "2.4", "comm_lib_version": "2.21.5",
            "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": ranks}},
            "pg_status": {"0": {"last_enqueued_collective": 2, "last_started_collective": 2,
                                "last_completed_collective": 1}},
            "entries": entries, "nccl_comm_state": {}}


def test_a_2x_dump_is_summarised(tmp_path):
    d = dump_v2([entry(0, 1), entry(1, 2, state="started"), entry(2, 3, op="nccl:send", state="scheduled", p2p=True)])
    (tmp_path / "nccl-flight-rank-0").write_bytes(pickle.dumps(d, protocol=2))
    [s] = convert(tmp_path, "nccl-flight-rank-0")
    assert "error" not in s, s
    assert s["rank"] == 0 and s["version"] == "2.4"
    assert s["groups"] == {"0": {"desc": "default_pg", "ranks": [0, 1]}}
    assert [(e["seq"], e["op"], e["state"], e["p2p"]) for e in s["entries"]] == [
        (1, "nccl:all_reduce", "completed", False), (2, "nccl:all_reduce", "started", False),
        (3, "nccl:send", "scheduled", True)]
    assert s["entries"][1]["in"] == [[1024]] and s["entries"][1]["in_dtypes"] == ["Float"]
    assert s["entries"][1]["pg"] == "0" and s["entries"][1]["desc"] == "default_pg"
    assert "frames" not in s["entries"][0]  # stacks stay in the dump: the summary stays small


def test_a_1x_dump_with_torchs_list_builders(tmp_path):
    """1.2 layout ({uid: [ranks]} pg_config), and lists as torch's C++ pickler writes typed ones
    (GLOBAL torch.jit._pickle build_intlist), read without importing torch."""
    class IntList(list):
        def __reduce__(self):
            return (_build_intlist, (list(self),))
    global _build_intlist

    def _build_intlist(x):
        return x
    _build_intlist.__module__ = "torch.jit._pickle"
    _build_intlist.__qualname__ = "build_intlist"
    sys.modules.setdefault("torch.jit._pickle", type(sys)("torch.jit._pickle"))
    sys.modules["torch.jit._pickle"].build_intlist = _build_intlist
    e = entry(5, 7, state="started")
    e["input_sizes"] = [IntList([4, 256])]
    del e["process_group"]  # 1.x: pg_id only
    d = {"version": "1.2", "pg_config": {0: [0, 1, 2]}, "entries": [e]}
    raw = pickle.dumps(d, protocol=2)
    assert b"build_intlist" in raw
    (tmp_path / "nccl-flight-rank-2").write_bytes(raw)
    [s] = convert(tmp_path, "nccl-flight-rank-2")
    assert "error" not in s, s
    assert s["rank"] == 2
    assert s["groups"] == {"0": {"desc": "", "ranks": [0, 1, 2]}}
    assert s["entries"][0]["pg"] == "0" and s["entries"][0]["in"] == [[4, 256]]


def test_a_pickle_that_would_run_code_is_refused(tmp_path):
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))
    (tmp_path / "nccl-flight-rank-0").write_bytes(pickle.dumps({"entries": [Evil()]}))
    [s] = convert(tmp_path, "nccl-flight-rank-0")
    assert "refused global" in s["error"], s
    assert not marker.exists()


def test_each_bad_dump_is_its_own_error_and_the_others_still_convert(tmp_path):
    (tmp_path / "nccl-flight-rank-0").write_bytes(b"\x80\x04garbage")
    (tmp_path / "nccl-flight-rank-1").write_bytes(pickle.dumps([1, 2, 3]))
    os.symlink("/etc/passwd", tmp_path / "nccl-flight-rank-2")
    os.mkfifo(tmp_path / "nccl-flight-rank-3")  # would block a reader that opened it plainly
    (tmp_path / "nccl-flight-rank-4").write_bytes(pickle.dumps(dump_v2([entry(0, 1)])))
    out = convert(tmp_path, *(f"nccl-flight-rank-{r}" for r in range(6)))
    assert [("error" in s) for s in out] == [True, True, True, True, False, True]
    assert "not a flight recorder dump" in out[1]["error"]
    assert "not a regular file" in out[3]["error"]
    assert "FileNotFoundError" in out[5]["error"]


def test_the_summary_is_bounded(tmp_path):
    """2000 collectives (PyTorch's recommended buffer) of huge shapes: the newest 64 per group."""
    es = [entry(i, i + 1, size=tuple(range(1, 30))) for i in range(2000)]
    es[-1]["profiling_name"] = "x" * 100000
    (tmp_path / "nccl-flight-rank-0").write_bytes(pickle.dumps(dump_v2(es)))
    [s] = convert(tmp_path, "nccl-flight-rank-0")
    assert len(s["entries"]) == 64 and s["dropped"] == 2000 - 64
    assert s["entries"][0]["seq"] == 2000 - 63 and s["entries"][-1]["seq"] == 2000
    assert len(s["entries"][0]["in"][0]) == 8 and len(s["entries"][-1]["op"]) == 128
    assert len(json.dumps(s)) < 64 * 1024
