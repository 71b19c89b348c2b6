"""`ddpctl doctor --nodes` (issue 5): live facts from each node's agent, checked together. n1
describes itself through the recorded DGX H100 tree, n2 through the CPU-only tree, n3 runs no
agent: the report covers n1 and n2, names n3 as unreachable, and fails the GPU job because n2
has no GPU."""
import json
import os
import shutil
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import simcluster  # noqa: E402

SKIP = simcluster.netns_unavailable()
pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")


def tree(c, name):
    root = os.path.join(c.dir, name)  # outside /tmp, which each host replaces with its own
    shutil.copytree(os.path.join(simcluster.SRC, "tests", "fixtures", "sysfs", name), root, symlinks=True)
    return root


def test_doctor_gathers_live_facts_and_names_what_differs():
    with simcluster.Cluster(nodes=3) as c:
        n1, n2, n3 = c.hosts
        c.start_agent(n1, env={"DDP_SYSFS_ROOT": tree(c, "dgx-h100")})
        c.start_agent(n2, env={"DDP_SYSFS_ROOT": tree(c, "cpu-only")})
        argv = [os.path.join(c.bin, "ddpctl"), "doctor", "--json", "--gpu-job", "--token-file", c.token,
                "--nodes", c.nodes_arg()]
        r = c.ctl.run(argv, timeout=60)
        assert r.returncode == 1, r.stdout + r.stderr
        assert f"{n3.addr}: cannot reach its agent" in r.stderr, r.stderr
        report = json.loads(r.stdout)
        assert [len(n["gpus"]) for n in report["nodes"]] == [8, 0]
        errors = [f for f in report["findings"] if f["severity"] == "error"]
        assert errors and any("GPU" in f["message"] for f in errors), report["findings"]

        # The same node with nothing wrong, plus one that does not answer: still a failed check.
        r = c.ctl.run([os.path.join(c.bin, "ddpctl"), "doctor", "--token-file", c.token, "--nodes", n1.addr], timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        r = c.ctl.run([os.path.join(c.bin, "ddpctl"), "doctor", "--token-file", c.token, "--nodes",
                       f"{n1.addr},{n3.addr}"], timeout=60)
        assert r.returncode == 1 and "not every node answered" in r.stderr, r.stdout + r.stderr

        # A node whose firewall drops the connection (no refusal): named once the 10 s for
        # reaching an agent are up, not after the whole 60 s the answers may take.
        rules = f"table inet ddpdrop {{\n chain out {{\n  type filter hook output priority 0; policy accept;\n" \
                f"  ip daddr {n3.addr} tcp dport 29410 drop\n }}\n}}\n"
        subprocess.run(["ip", "netns", "exec", c.ctl.ns, "nft", "-f", "-"], input=rules, text=True, check=True,
                       capture_output=True, timeout=30)
        r = c.ctl.run([os.path.join(c.bin, "ddpctl"), "doctor", "--token-file", c.token, "--nodes",
                       f"{n1.addr},{n3.addr}"], timeout=40)
        assert r.returncode == 1, r.stdout + r.stderr
        assert f"{n3.addr}: cannot reach its agent at port 29410: no answer within 10 s" in r.stderr, r.stderr

        # A wrong token: refused, said per node, nothing to check.
        bad = c.write_token("bad-token")
        r = c.ctl.run([*argv[:-4], "--token-file", bad, "--nodes", n1.addr], timeout=60)
        assert r.returncode == 2 and "auth" in r.stderr, r.stderr
