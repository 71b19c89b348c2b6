"""`ddpctl launch --nodes --dry-run` without --facts (issue 5): every node's plan from its agent's
live facts. n1 describes itself through the recorded DGX H100 tree, n2 through the same tree but
its agent manages only GPUs 0 and 1 (--gpus): the plan gives n1 8 ranks and n2 2, each with its
node's binding, and nothing is offered to or started on the agents. A node without an agent, and a
wrong token, fail the dry run (exit 2) naming the node. Nodes named by host name: MASTER_ADDR is
the address the run gives (issue 25), and the JSON has the local dry run's shape
(proto/dry-run.schema.json)."""
import json
import os
import shutil
import sys

import jsonschema
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import simcluster  # noqa: E402

SKIP = simcluster.netns_unavailable()
pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")
SCHEMA = json.load(open(os.path.join(simcluster.SRC, "proto", "dry-run.schema.json")))


def check_shape(plan):
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    jsonschema.Draft202012Validator(SCHEMA).validate(plan)


def test_dry_run_plans_from_the_agents_live_facts():
    with simcluster.Cluster(nodes=3) as c:
        n1, n2, n3 = c.hosts
        root = os.path.join(c.dir, "dgx-h100")  # outside /tmp, which each host replaces with its own
        shutil.copytree(os.path.join(simcluster.SRC, "tests", "fixtures", "sysfs", "dgx-h100"), root, symlinks=True)
        c.start_agent(n1, env={"DDP_SYSFS_ROOT": root})
        c.start_agent(n2, env={"DDP_SYSFS_ROOT": root}, extra=["--gpus", "0,1"])
        job = c.write("dry.yaml", "name: dry\nnproc_per_node: gpu\ncommand: [python3, train.py]\nstore: {port: 0}\n")
        ddpctl = os.path.join(c.bin, "ddpctl")
        r = c.ctl.run([ddpctl, "launch", "--dry-run", "--token-file", c.token, "--nodes", c.nodes_arg([n1, n2]), job],
                      timeout=60)
        assert r.returncode == 0, r.stderr
        plan = json.loads(r.stdout)
        check_shape(plan)
        assert plan["world_size"] == 10 and plan["master_addr"] == n1.addr
        assert [(n["node"], n["rank_base"], n["local_world_size"]) for n in plan["nodes"]] == [(n1.addr, 0, 8),
                                                                                                (n2.addr, 8, 2)]
        n2_ranks = [r for r in plan["ranks"] if r["node"] == n2.addr]
        assert [r["rank"] for r in n2_ranks] == [8, 9]
        # each node's binding from its own agent's facts: n2's workers see only its agent's 2 GPUs
        assert {len(r["env"]["CUDA_VISIBLE_DEVICES"].split(",")) for r in n2_ranks} == {2}
        assert {len(r["env"]["CUDA_VISIBLE_DEVICES"].split(",")) for r in plan["ranks"] if r["node"] == n1.addr} == {8}
        assert any("picks MASTER_PORT" in n for n in plan["notes"]), plan["notes"]
        for h in (n1, n2):  # asked for facts only: no job was offered
            assert "offered" not in c.agent_log(h), c.agent_log(h)

        r = c.ctl.run([ddpctl, "launch", "--dry-run", "--token-file", c.token, "--nodes", c.nodes_arg(), job], timeout=60)
        assert r.returncode == 2 and f"{n3.addr}: cannot reach its agent" in r.stderr, r.stderr
        assert r.stdout == ""
        bad = c.write_token("bad-token")
        r = c.ctl.run([ddpctl, "launch", "--dry-run", "--token-file", bad, "--nodes", n1.addr, job], timeout=60)
        assert r.returncode == 2 and "auth" in r.stderr, r.stderr


def test_dry_run_by_host_name_shows_the_address_the_run_uses():
    """--nodes n1,n2 by name: the run gives the workers n1's address (the one the coordinator
    reached its agent at), not the name; the dry run shows that address, from live facts and from
    recorded ones (resolved as the coordinator resolves it), and over SSH, where only the run can
    know it, says so in its place."""
    with simcluster.Cluster(nodes=2) as c:
        n1, n2 = c.hosts
        for h in (n1, n2):
            c.start_agent(h)
        job = c.write("named.yaml", "name: named\nnproc_per_node: 2\ncommand: [python3, train.py]\n")
        ddpctl = os.path.join(c.bin, "ddpctl")
        facts = os.path.join(simcluster.SRC, "tests", "fixtures", "facts", "cpu-a.json")
        names = f"{n1.name},{n2.name}"
        for how in ([], ["--facts", facts]):
            r = c.ctl.run([ddpctl, "launch", "--dry-run", "--token-file", c.token, "--nodes", names, *how, job],
                          timeout=60)
            assert r.returncode == 0, r.stderr
            plan = json.loads(r.stdout)
            check_shape(plan)
            assert [n["node"] for n in plan["nodes"]] == [n1.name, n2.name]
            assert plan["master_addr"] == n1.addr, (how, plan["master_addr"])
            assert {x["env"]["MASTER_ADDR"] for x in plan["ranks"]} == {n1.addr}
            assert [x["rank"] for x in plan["ranks"]] == [0, 1, 2, 3]

        r = c.ctl.run([ddpctl, "launch", "--dry-run", "--ssh", "--nodes", names, "--facts", facts, job], timeout=60)
        assert r.returncode == 0, r.stderr
        plan = json.loads(r.stdout)
        check_shape(plan)
        assert plan["master_addr"].startswith("<known at run time: n1's address as its sshd sees"), plan["master_addr"]
        assert {x["env"]["MASTER_ADDR"] for x in plan["ranks"]} == {plan["master_addr"]}
