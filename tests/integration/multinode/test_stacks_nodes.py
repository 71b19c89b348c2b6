"""`ddpctl stacks JOB` for a job across 3 simulated nodes (simcluster.py): the launcher asks every
node's agent (stacks_request, protocol 6), each agent its shepherd, which reads its ranks; the
answers are merged and name ranks and nodes. Rank 1 (on n2) is stuck in a Python function while
ranks 0 and 2 wait in gloo's all_reduce. ddpctl stacks runs in the launcher's namespace and
reaches it through its control socket (a file in the shared folder), never over the network."""
import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import simcluster  # noqa: E402
from ddptest import wait_for  # noqa: E402

SKIP = simcluster.netns_unavailable()
pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")

WORKER = r'''
import os
import torch
import torch.distributed as dist


def stuck_here():
    r, w = os.pipe()
    os.read(r, 1)  # nobody writes


def step(t):
    dist.all_reduce(t)
    return t


dist.init_process_group("gloo")
print("joined", flush=True)
if dist.get_rank() == 1:
    stuck_here()
else:
    step(torch.ones(4))
'''


def main_top(proc):
    main = next((t for t in proc["threads"] if t["main"]), None)
    return main["python"][0]["function"] if main and main["python"] else None


def test_stacks_across_three_nodes_name_ranks_and_nodes():
    with simcluster.Cluster(nodes=3) as c:
        for h in c.hosts:
            c.start_agent(h)
        worker = c.write("hang.py", WORKER)
        job = simcluster.job_file(c, "hang", ["/usr/bin/python3", worker], nproc=1, extra="env: {OMP_NUM_THREADS: '1'}\n")
        rt = os.path.join(c.dir, "rt")
        os.mkdir(rt, 0o700)
        env = dict(os.environ, XDG_RUNTIME_DIR=rt)
        ddpctl = os.path.join(c.bin, "ddpctl")
        p = c.ctl.popen([ddpctl, "launch", "--nodes", c.nodes_arg(), "--token-file", c.token, "--job-id", "mn-hang",
                         "-q", job], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=c.dir, env=env)

        def stacks(*args):
            r = c.ctl.run([ddpctl, "stacks", "mn-hang", *args], timeout=60, env=env)
            return r

        last = {}

        def hung():
            r = stacks("--json")
            try:
                last["j"] = j = json.loads(r.stdout)
            except ValueError:
                last["j"] = {"stderr": r.stderr}
                return False
            procs = {pr["rank"]: pr for pr in j["processes"]}
            return len(procs) == 3 and main_top(procs[1]) == "stuck_here" and all(
                main_top(procs[k]) == "all_reduce" for k in (0, 2))

        try:
            wait_for(hung, timeout=120, what="rank 1 stuck and ranks 0, 2 in all_reduce, on three nodes")
        except AssertionError:
            p.kill()
            _, err = p.communicate(timeout=30)
            # The agents' logs too: a rank killed early (seen once under the suite's load, not
            # explained) says there who stopped it.
            agents = "".join(f"\nagent {h.name}:\n{c.agent_log(h)[-6000:]}" for h in c.hosts)
            raise AssertionError(f"last answer: {json.dumps(last.get('j'))[:4000]}\nlauncher:\n{err}{agents}")
        j = last["j"]
        n1, n2, n3 = c.hosts
        assert j["world_size"] == 3
        assert {pr["rank"]: pr["node"] for pr in j["processes"]} == {0: n1.addr, 1: n2.addr, 2: n3.addr}
        first = j["groups"][0]
        assert first["ranks"] == [1] and first["nodes"] == [n2.addr], first
        assert first["python"][0]["function"] == "stuck_here"
        coll = next(g for g in j["groups"] if g["python"] and g["python"][0]["function"] == "all_reduce")
        assert coll["ranks"] == [0, 2] and coll["nodes"] == sorted([n1.addr, n3.addr]), coll
        # The text: the odd rank first, with its node.
        r = stacks()
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines()[0].startswith(f"rank 1 (1 of 3) on {n2.addr}"), r.stdout
        # --ranks: only node n3's rank is asked for.
        j2 = json.loads(stacks("--json", "--ranks", "2").stdout)
        assert [(pr["rank"], pr["node"]) for pr in j2["processes"]] == [(2, n3.addr)]
        assert main_top(j2["processes"][0]) == "all_reduce"
        p.kill()
        p.communicate(timeout=60)
