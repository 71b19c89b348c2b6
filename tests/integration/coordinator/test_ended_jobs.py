"""A job that ended on a standing coordinator still answers `ddpctl status|logs|stop --coordinator`
from its end record, as a local launch's does: how it ended, where its logs are, and its ranks'
lines; to its own user (and root) only. Before, the coordinator said the job was not running,
and the record it wrote was read by nobody."""
import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "multinode"))
from loopsite import running_site  # noqa: E402
from simcluster import finish  # noqa: E402

WORKER = ("import os, sys\n"
          "print(f'hello from rank {os.environ[\"RANK\"]}', flush=True)\n"
          "sys.exit(3 if os.environ['RANK'] == '1' else 0)\n")


@pytest.fixture
def site():
    with running_site() as s:
        yield s


def test_an_ended_job_answers_status_logs_and_stop(site):
    worker = site.dir / "worker.py"
    worker.write_text(WORKER)
    job = site.job("ends", ["/usr/bin/python3", str(worker)], nproc=2)
    p = site.submit(job, "--job-id", "ends-1", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rc, _, err = finish(p, timeout=120)
    assert rc != 0 and "failed" in err, err + site.logs()

    r = site.ddpctl("status", "ends-1")
    assert r.returncode == 1, r.stdout + r.stderr  # not running
    # The exit code the submitter's ddpctl gave.
    assert "job ends-1 ended" in r.stderr and f"(failed, exit code {rc})" in r.stderr, (rc, r.stderr)
    assert "not running on this coordinator" not in r.stderr, r.stderr

    r = site.ddpctl("status", "--json", "ends-1")
    assert r.returncode == 1, r.stderr
    record = json.loads(r.stdout)
    assert record["state"] == "ended" and record["status"] == "failed" and record["exit_code"] == rc, record
    assert "files" not in record  # paths on the coordinator's machine are not handed out

    # Without an id, with nothing running: the last job that ended, said as such.
    r = site.ddpctl("status")
    assert r.returncode == 1 and "no job of yours is running; the last one: job ends-1 ended" in r.stderr, r.stderr

    # Its ranks' lines, read on the coordinator's machine and sent inline.
    r = site.ddpctl("logs", "ends-1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[0] hello from rank 0" in r.stdout and "[1] hello from rank 1" in r.stdout, r.stdout + r.stderr
    assert "job ends-1 ended" in r.stderr, r.stderr
    r = site.ddpctl("logs", "--ranks", "1", "ends-1")
    assert r.returncode == 0 and "[1] hello from rank 1" in r.stdout and "[0]" not in r.stdout, r.stdout + r.stderr
    r = site.ddpctl("logs", "--ranks", "7", "ends-1")
    assert r.returncode != 0 and "no rank 7" in r.stderr, r.stdout + r.stderr

    r = site.ddpctl("stop", "ends-1")
    assert r.returncode == 1 and "nothing to stop" in r.stderr and "ended" in r.stderr, r.stderr

    # An id that never ran here is still refused, saying so.
    r = site.ddpctl("status", "other")
    assert r.returncode == 1 and "not running on this coordinator" in r.stderr, r.stderr
