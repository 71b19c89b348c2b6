"""A step of the coordinator's wall clock loses no node (issue 23). ddpctl runs under libfaketime
with a timestamp file the test rewrites while the job runs: its wall clock jumps 60 s ahead, then
60 s back, as an NTP step would move it; its monotonic clock does not move (as with a real step).
With deadlines on the wall clock the first heartbeat after the forward step made every other node
60 s silent, past the 6 s heartbeat timeout: lost, and the job failed. With the deadlines on the
monotonic clock nothing happens and the job ends normally.

The absence of a loss is watched over a window per step that the workers' own output measures:
12 lines from each rank, 0.25 s apart, relayed through the coordinator after the step was
written (3 s: three of each agent's heartbeats, where the old code lost a node at the first)."""
import json
import os
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import simcluster  # noqa: E402

SKIP = simcluster.netns_unavailable()
FAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
if SKIP is None and not os.path.exists(FAKETIME):
    SKIP = "libfaketime is not installed (scripts/setup installs faketime)"
pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")

PY = "/usr/bin/python3"
# Prints UP, then a TICK every 0.25 s until the release file exists (at most 120 s: then it fails).
WORKER = r'''
import json, os, sys, time
release = sys.argv[1]
print("UP " + json.dumps({"pid": os.getpid()}), flush=True)
for i in range(480):
    if os.path.exists(release):
        sys.exit(0)
    print("TICK " + json.dumps({"i": i}), flush=True)
    time.sleep(0.25)
sys.exit(3)
'''

# What the test relies on libfaketime for: the wall clock follows the file, the monotonic one not.
PROBE = r'''
import json, time
print(json.dumps({"wall": time.time(), "mono": time.monotonic()}))
'''


def faked_env(stamp_file):
    # FAKETIME_NO_CACHE: every clock read reads the file, so a rewrite steps a running process.
    # FAKETIME_DONT_FAKE_MONOTONIC: an NTP step leaves CLOCK_MONOTONIC alone; so does this one.
    return {"LD_PRELOAD": FAKETIME, "FAKETIME_TIMESTAMP_FILE": stamp_file, "FAKETIME_NO_CACHE": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


def step(stamp_file, offset):
    tmp = stamp_file + ".new"
    with open(tmp, "w") as f:
        f.write(offset + "\n")
    os.replace(tmp, stamp_file)  # whole: a reader never sees it half written


def read_until(p, want, seen_lines, timeout=60):
    """Reads ddpctl's stdout until want(lines so far) holds; fails with what it printed if not."""
    deadline = time.monotonic() + timeout
    os.set_blocking(p.stdout.fileno(), True)
    start = len(seen_lines)
    while not want(seen_lines[start:]) and time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        seen_lines.append(line)
    if not want(seen_lines[start:]):
        p.kill()
        _, err = p.communicate(timeout=30)
        raise AssertionError(f"ddpctl's output stopped short:\n{''.join(seen_lines[-40:])}\nstderr:\n{err}")


def ticks_from_each(n_ranks, count):
    def want(lines):
        text = "".join(lines)
        by_rank = {}
        for line in text.splitlines():
            m = simcluster.LINE.match(line)
            if m and m["text"].startswith("TICK "):
                by_rank[int(m["rank"])] = by_rank.get(int(m["rank"]), 0) + 1
        return len(by_rank) == n_ranks and min(by_rank.values()) >= count
    return want


def test_probe_steps_wall_not_monotonic(tmp_path):
    """The mechanism itself: a process under faked_env sees the file's step on its wall clock only."""
    stamp = str(tmp_path / "stamp")
    step(stamp, "+60s")
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    before = {"wall": time.time(), "mono": time.monotonic()}
    out = subprocess.run(["env", *(f"{k}={v}" for k, v in faked_env(stamp).items()), PY, str(probe)],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    got = json.loads(out)
    assert 55 < got["wall"] - before["wall"] < 70, (before, got)
    assert 0 <= got["mono"] - before["mono"] < 10, (before, got)


def test_wall_clock_steps_lose_no_node():
    with simcluster.Cluster(nodes=2) as c:
        for h in c.hosts:
            c.start_agent(h)
        worker = c.write("ticker.py", WORKER)
        release = os.path.join(c.dir, "release")
        job = simcluster.job_file(c, "clockstep", [PY, worker, release])
        stamp = os.path.join(c.dir, "faketime")
        step(stamp, "+0")
        result = os.path.join(c.dir, "result.json")
        argv = ["env", *(f"{k}={v}" for k, v in faked_env(stamp).items()),
                os.path.join(c.bin, "ddpctl"), "launch", "--nodes", c.nodes_arg(), "--token-file", c.token,
                "--result-json", result, job]
        p = c.ctl.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=c.dir)
        lines = []
        simcluster.wait_for_tagged(p, 2, "UP ")
        read_until(p, ticks_from_each(2, 4), lines)  # running, heartbeats flowing
        step(stamp, "+60s")
        read_until(p, ticks_from_each(2, 12), lines)
        step(stamp, "+0")  # and 60 s back
        read_until(p, ticks_from_each(2, 12), lines)
        open(release, "w").close()
        rc, out, err = simcluster.finish(p, timeout=60)
        assert rc == 0, f"the job did not end normally (exit {rc}):\n{''.join(lines[-20:])}{out}\n{err}"
        for word in ("lost", "giving up", "no heartbeat"):
            assert word not in err, err
        r = json.load(open(result))
        assert r["status"] == "succeeded" and r["restarts"] == 0, r
        assert sorted(e["rank"] for e in r["attempts"][0]["exits"]) == [0, 1], r
