"""The pod script `ddpctl render k8s` puts in every pod, run for real on simulated hosts (network
namespaces, tests/integration/multinode/simcluster.py) standing in for two pods of the Indexed
Job: each runs a one-shot ddp-agentd, pod 0 also `ddpctl launch` over the pods' DNS names
("<name>-<i>.<name>", as the headless Service makes them; here lines in each host's hosts file).
The container paths (/etc/ddpctl/token, /etc/ddpctl/job/job.yaml, /var/log/ddpctl) are
replaced by the run's files; the rest of the script runs as rendered."""
import os
import subprocess
import sys

import pytest
import yaml

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "multinode"))
from simcluster import Cluster, netns_unavailable  # noqa: E402

from ddptest import DDPCTL  # noqa: E402

pytestmark = pytest.mark.skipif(netns_unavailable() is not None, reason=str(netns_unavailable()))


def rendered_pod(job_file):
    r = subprocess.run([DDPCTL, "render", "k8s", job_file, "--image", "unused", "--name", "kjob"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    job = next(o for o in yaml.safe_load_all(r.stdout) if o["kind"] == "Job")
    c = job["spec"]["template"]["spec"]["containers"][0]
    return c["command"][2], {e["name"]: e["value"] for e in c["env"]}


def run_pods(c, worker_command, timeout=120):
    job_file = c.write("kjob.yaml", f"name: kjob\nnnodes: 2\ncommand: {worker_command}\n")
    script, env = rendered_pod(job_file)
    assert env["DDP_K8S_NODES"] == "kjob-0.kjob,kjob-1.kjob"
    script = (script.replace("/etc/ddpctl/token", c.token).replace("/etc/ddpctl/job/job.yaml", job_file)
              .replace("/var/log/ddpctl", "/tmp/ddp-logs"))
    # What the headless Service's DNS gives pods: "<job>-<index>.<service>" for each pod.
    for h in [c.ctl] + c.hosts:
        with open(f"/etc/netns/{h.ns}/hosts", "a") as f:
            f.writelines(f"{p.addr} kjob-{i}.kjob\n" for i, p in enumerate(c.hosts))
    pods = [h.popen(["env", f"JOB_COMPLETION_INDEX={i}", f"DDP_K8S_NODES={env['DDP_K8S_NODES']}",
                     f"PATH={c.bin}:/usr/bin:/bin", "/bin/sh", "-c", script],
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=c.dir)
            for i, h in enumerate(c.hosts)]
    results = []
    for p in pods:
        out, _ = p.communicate(timeout=timeout)
        results.append((p.returncode, out))
    return results


def test_two_pods_run_the_job_and_both_exit_with_it():
    with Cluster(nodes=2) as c:
        (rc0, out0), (rc1, out1) = run_pods(c, '[/bin/sh, -c, "echo rank=$RANK of $WORLD_SIZE on $(hostname)"]')
        assert rc0 == 0, out0
        assert rc1 == 0, out1  # the one-shot agent exits once its job is done
        assert "rank=0 of 2 on n1" in out0 and "rank=1 of 2 on n2" in out0, out0


def test_a_failing_rank_fails_pod_0_and_ends_every_pod():
    with Cluster(nodes=2) as c:
        (rc0, out0), (rc1, out1) = run_pods(c, '[/bin/sh, -c, "if [ $RANK = 1 ]; then exit 3; fi; sleep 60"]')
        assert rc0 == 1, out0  # ddpctl's "the job failed"; with backoffLimit 0 Kubernetes fails the Job
        assert "first failure: rank 1" in out0 and "exited with code 3" in out0, out0
        # Pod 1's agent ends with the job (its exit status is not the job's: pod 0's is).
        assert rc1 == 0 and "one-shot: exiting after the job" in out1, out1
