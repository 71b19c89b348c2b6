"""A standing coordinator's jobs keep their control sockets and end records in a folder of their
own (`<runtime dir>/ddpctl/coordinator/`), apart from the launches its own user (root, on a real
site) makes on the same machine: a user who submits a job under the id of one of those cannot
reach it through the coordinator. Before, the submitted job found that id's socket taken, went on
without one, and `ddpctl stop --coordinator ID` was relayed to the other launch's socket."""
import os
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "multinode"))
from loopsite import DDPCTL, running_site  # noqa: E402
from simcluster import finish  # noqa: E402

WORKER = "import pathlib, sys, time\npathlib.Path(sys.argv[1]).write_text('up')\ntime.sleep(120)\n"


@pytest.fixture
def site():
    with running_site() as s:
        yield s


def wait_for(path, proc, what, timeout=60):
    deadline = time.time() + timeout
    while not path.exists():
        assert proc.poll() is None, f"{what} ended early"
        assert time.time() < deadline, f"{what} did not start"
        time.sleep(0.1)


def test_a_submitted_job_cannot_reach_a_local_launch_of_the_same_id(site):
    worker = site.dir / "worker.py"
    worker.write_text(WORKER)
    local_job = site.job("local", ["/usr/bin/python3", str(worker), str(site.dir / "local.up")])
    local = subprocess.Popen([DDPCTL, "launch", "-q", "--job-id", "same", str(local_job)], cwd=site.dir,
                             env=site.env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(site.dir / "local.up", local, "the local launch")
        assert (site.runtime / "ddpctl" / "same.sock").exists()
        sub_job = site.job("sub", ["/usr/bin/python3", str(worker), str(site.dir / "sub.up")])
        p = site.submit(sub_job, "--job-id", "same", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for(site.dir / "sub.up", p, "the submitted job")
        assert (site.runtime / "ddpctl" / "coordinator" / "same.sock").exists(), site.logs()
        r = site.ddpctl("stop", "same")
        assert r.returncode == 0, r.stdout + r.stderr
        rc, _, err = finish(p, timeout=60)
        assert rc != 0 and "stopped" in err, err  # the submitted job, stopped
        assert local.poll() is None, "the local launch of the same id was stopped through the coordinator"
        status = subprocess.run([DDPCTL, "status", "same"], cwd=site.dir, env=site.env(), capture_output=True,
                                text=True, timeout=30)
        assert status.returncode == 0 and "running" in status.stdout, status.stdout + status.stderr
    finally:
        if local.poll() is None:
            local.terminate()
        local.communicate(timeout=60)
