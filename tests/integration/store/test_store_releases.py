"""The store and the PyTorch releases whose clients send no VALIDATE (1.13, 2.0, 2.1).

1.13/2.0 number WATCH_KEY=7, DELETE_KEY=8; 2.1 numbers DELETE_KEY=7, APPEND=8 (docs/store-protocol.md).
The bytes cannot tell them apart, so the store reads them as the job's release (the probed PyTorch,
or store.protocol in the job file) and otherwise refuses the client with a message naming the
releases. Debian's PyTorch 1.13 is the real client here; tests/fixtures/store covers the others.
"""
import datetime
import textwrap

import pytest
import torch.distributed as dist

from conftest import StoreProcess
from ddptest import PYTHON, launch, write_job

T = datetime.timedelta

WORKER = textwrap.dedent("""
    import datetime, os
    import torch.distributed as dist
    s = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None, False,
                      timeout=datetime.timedelta(seconds=30))
    s.set("a", "1")
    assert s.delete_key("a") is True   # DELETE_KEY = 8 in 1.13
    assert s.delete_key("a") is False
    print("deleted", flush=True)
""")


def test_without_the_release_delete_key_is_refused_not_misread(tmp_path):
    s = StoreProcess(tmp_path, "--threads", "0")
    try:
        c = dist.TCPStore(s.host, s.port, None, False, timeout=T(seconds=10))
        c.set("a", "1")  # 0..6 mean the same in every release: served
        assert c.get("a") == b"1"
        with pytest.raises(RuntimeError):
            c.delete_key("a")  # 8: DELETE_KEY (1.13, 2.0) or APPEND (2.1): closed, not guessed
        log = s.wait_for_log("APPEND in 2.1")
        assert "opcode 8 is DELETE_KEY in PyTorch 1.13 and 2.0 but APPEND in 2.1" in log
        assert 'store: {protocol: \\"1.13\\"}' in log or 'store: {protocol: "1.13"}' in log, log
        assert "--protocol 1.13 or 2.1" in log
        # The key is still there: nothing was read as an APPEND or a delete.
        other = dist.TCPStore(s.host, s.port, None, False, timeout=T(seconds=10))
        assert other.get("a") == b"1"
        assert s.alive()
    finally:
        assert s.stop() == 0


def test_store_serve_protocol_2_1_reads_seven_as_delete(tmp_path):
    # A 1.13 client cannot send a 2.1 DELETE_KEY, so this speaks 2.1's bytes itself.
    import socket
    import struct
    s = StoreProcess(tmp_path, "--threads", "0", "--protocol", "2.1")
    try:
        def pystr(b):
            return struct.pack("<Q", len(b)) + b
        with socket.create_connection((s.host, s.port), timeout=10) as c:
            c.sendall(b"\x00" + pystr(b"/k") + pystr(b"v") + b"\x07" + pystr(b"/k"))
            assert c.recv(8, socket.MSG_WAITALL) == struct.pack("<q", 1)  # i64 erased, not WATCH_KEY's 03
    finally:
        assert s.stop() == 0


def test_a_launch_reads_its_1_13_clients_by_the_probed_release(tmp_path):
    (tmp_path / "worker.py").write_text(WORKER)
    job = write_job(tmp_path, f"nproc_per_node: 1\ncommand: [{PYTHON}, worker.py]\nworkdir: {tmp_path}\n")
    r = launch(job, "--job-id", "rel113")
    assert r.returncode == 0, r.stderr
    assert "deleted" in (tmp_path / "logs" / "rel113" / "attempt-0" / "rank-0.log").read_text()


def test_store_protocol_in_the_job_file_wins_and_a_mismatch_is_said(tmp_path):
    (tmp_path / "worker.py").write_text(WORKER)
    job = write_job(tmp_path, f"nproc_per_node: 1\ncommand: [{PYTHON}, worker.py]\nworkdir: {tmp_path}\n"
                    "store: {protocol: \"2.3\"}\n")
    r = launch(job, "--job-id", "rel23")
    assert r.returncode != 0
    # The user sees why: this client sent no VALIDATE, so it is not the 2.3 the job file names.
    assert "not the job's release (store.protocol 2.3)" in r.stderr, r.stderr


@pytest.mark.parametrize("value", ["1.12", "3.0", "2.x", "latest"])
def test_store_protocol_is_validated_with_its_place(tmp_path, value):
    job = write_job(tmp_path, f"nproc_per_node: 1\ncommand: [{PYTHON}, worker.py]\nstore:\n  protocol: \"{value}\"\n")
    r = launch(job, "--dry-run")
    assert r.returncode != 0
    assert "job.yaml:4:13: error: store.protocol: expected auto or the job's PyTorch release from 1.13 on" in r.stderr, \
        r.stderr
