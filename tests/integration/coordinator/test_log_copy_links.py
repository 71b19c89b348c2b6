"""A standing coordinator runs as root and keeps every user's copy of the job logs under its
--log-dir, in <user>/<job>/attempt-N. Those folders are made one at a time through descriptors,
never through a link: a link where one of them goes (a log root that someone else can write,
say) leaves the job without the coordinator's copy, said in its log, and nothing is written
where the link points. Before, the folders were made and chmod-ed by path, following links."""
import os
import pwd
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "multinode"))
from loopsite import running_site  # noqa: E402
from simcluster import finish  # noqa: E402


@pytest.fixture
def site():
    with running_site() as s:
        yield s


def run_job(site, name):
    job = site.job(name, ["/bin/echo", f"hello from {name}"])
    p = site.submit(job, "--job-id", name, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rc, out, err = finish(p, timeout=90)
    assert rc == 0, f"{out}\n{err}\n{site.logs()}"
    assert f"hello from {name}" in out + err, out + err
    return out + err


def test_a_link_where_a_log_folder_goes_is_not_followed(site):
    user = pwd.getpwuid(os.getuid()).pw_name
    logs = site.dir / "coord-logs"
    logs.mkdir(exist_ok=True)
    elsewhere = site.dir / "elsewhere"
    elsewhere.mkdir()
    os.chmod(elsewhere, 0o755)  # whatever the umask

    # The user's folder is a link.
    (logs / user).symlink_to(elsewhere)
    run_job(site, "linked-user")
    assert sorted(p.name for p in elsewhere.iterdir()) == [], "the coordinator wrote through the link"
    assert "job linked-user: no copy of its logs is kept" in site.log("coordinator.log"), site.logs()
    assert oct(elsewhere.stat().st_mode & 0o777) == oct(0o755)  # and did not chmod its target

    # The user's folder is the coordinator's own, the job's folder a link.
    (logs / user).unlink()
    run_job(site, "first")  # makes <user> as the coordinator's
    assert (logs / user / "first" / "attempt-0").is_dir(), sorted(str(p) for p in logs.rglob("*"))
    (logs / user / "linked-job").symlink_to(elsewhere)
    run_job(site, "linked-job")
    assert sorted(p.name for p in elsewhere.iterdir()) == [], "the coordinator wrote through the link"
    assert "cannot keep the launcher's copy of the logs" in site.log("coordinator.log"), site.logs()
