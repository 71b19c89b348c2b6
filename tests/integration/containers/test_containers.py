"""Workers inside real podman containers: the contract inside, exit codes, and no container left
after a failure, a stop, or kill -9 of ddpctl (with and without its watchdog).

Podman runs with a private store and run directory under the test's temporary directory
(CONTAINERS_CONF / CONTAINERS_STORAGE_CONF), so it never touches containers it did not create;
containers are looked up only by the names and labels these tests' jobs gave them. The image is
made here without a registry: busybox-static in a rootfs tarball, `podman import`ed; the torch test
bind-mounts the host's /usr (Debian's python3-torch) into it."""
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from ddptest import (DDPCTL, GUARDIAN_COMM, SOURCE_DIR, free_port, launch, proc_argv, proc_comm, start_launch, wait_for,
                     write_job)

PODMAN = shutil.which("podman")
BUSYBOX = shutil.which("busybox")
IMAGE = "localhost/ddptest-busybox:1"

pytestmark = [
    pytest.mark.skipif(PODMAN is None, reason="podman is not installed (scripts/setup installs it)"),
    pytest.mark.skipif(BUSYBOX is None, reason="busybox is not installed (scripts/setup installs busybox-static)"),
    pytest.mark.skipif(os.geteuid() != 0, reason="rootful podman needs root"),
]


def make_podman_store(base: Path, marker: str = ""):
    """A private podman (store, run and tmp directories) under `base`, holding IMAGE; `marker`
    goes into the image as a file, so two stores can hold different images under one name."""
    # This machine kind: root cannot raise rlimits (podman's own defaults would fail), and crun
    # refuses its hybrid cgroups (runc works). See shared/reference/test-environment.md.
    (base / "containers.conf").write_text(
        '[containers]\ndefault_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]\n'
        f'[engine]\nruntime = "runc"\ntmp_dir = "{base}/tmp"\n')
    (base / "storage.conf").write_text(
        f'[storage]\ndriver = "vfs"\ngraphroot = "{base}/graph"\nrunroot = "{base}/run"\n')
    env = dict(os.environ, CONTAINERS_CONF=str(base / "containers.conf"),
               CONTAINERS_STORAGE_CONF=str(base / "storage.conf"))
    rootfs = base / "rootfs"
    (rootfs / "bin").mkdir(parents=True)
    for d in ("usr", "etc", "tmp", "work"):
        (rootfs / d).mkdir()
    shutil.copy(BUSYBOX, rootfs / "bin" / "busybox")
    for applet in ("sh", "cat", "echo", "env", "sleep", "ls", "pwd", "grep", "stat"):
        (rootfs / "bin" / applet).symlink_to("busybox")
    # Debian's merged /usr: the loader is found through /lib64 once /usr is mounted.
    (rootfs / "lib").symlink_to("usr/lib")
    (rootfs / "lib64").symlink_to("usr/lib64")
    (rootfs / "etc" / "marker").write_text(marker)
    tar = base / "rootfs.tar"
    subprocess.run(["tar", "-C", str(rootfs), "-cf", str(tar), "."], check=True)
    subprocess.run([PODMAN, "import", str(tar), IMAGE], env=env, check=True, capture_output=True, timeout=120)
    return env


def drop_podman_store(env):
    """Only what these tests made: containers carrying our labels, then the image."""
    names = podman(env, "ps", "--all", "--filter", "label=ddpctl.owner", "--format", "{{.Names}}").split()
    if names:
        podman(env, "rm", "--force", "--ignore", "--time", "0", *names)
    subprocess.run([PODMAN, "rmi", "--force", IMAGE], env=env, capture_output=True, timeout=120)


@pytest.fixture(scope="module")
def podman_env(tmp_path_factory):
    """A private podman (store, run and tmp directories) and the test image in it."""
    env = make_podman_store(tmp_path_factory.mktemp("podman"))
    yield env
    drop_podman_store(env)


def podman(env, *args, timeout=60):
    return subprocess.run([PODMAN, *args], env=env, capture_output=True, text=True, timeout=timeout, check=True).stdout


def containers_of(env, job_id):
    """Names of every container, running or not, labelled with this job id."""
    out = podman(env, "ps", "--all", "--filter", f"label=ddpctl.job={job_id}", "--format", "{{.Names}}")
    return sorted(out.split())


def container_job(tmp: Path, command: str, nproc=2, extra="", container_extra=""):
    return write_job(tmp, f"""name: c
nproc_per_node: {nproc}
command: {command}
stop: {{grace: 3s}}
{extra}
container:
  runtime: podman
  image: {IMAGE}
  pull: never
  mounts: ["./:/work"]
  workdir: /work
{container_extra}""")


def test_ranks_see_their_contract_inside(tmp_path, podman_env):
    job = container_job(tmp_path, """[/bin/sh, -c, 'env > env-$RANK.txt; pwd > pwd-$RANK.txt']""",
                        extra="env: {FROM_JOB: job}", container_extra="  env: {FROM_CONTAINER: image-side}\n")
    host_path = podman_env["PATH"] + ":/opt/host-only/bin"
    r = launch(job, "--job-id", "ctr-contract", env=dict(podman_env, HOST_ONLY="secret", NCCL_DEBUG="WARN", PATH=host_path))
    assert r.returncode == 0, r.stderr
    for rank in range(2):
        env = dict(line.split("=", 1) for line in (tmp_path / f"env-{rank}.txt").read_text().splitlines() if "=" in line)
        assert env["RANK"] == str(rank) and env["LOCAL_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == "2" and env["LOCAL_WORLD_SIZE"] == "2"
        assert env["MASTER_ADDR"] == "127.0.0.1" and int(env["MASTER_PORT"]) > 0
        assert env["TORCHELASTIC_RUN_ID"] == "ctr-contract" and env["DDP_JOB_ID"] == "ctr-contract"
        assert env["FROM_JOB"] == "job" and env["FROM_CONTAINER"] == "image-side"
        assert env["NCCL_DEBUG"] == "WARN"      # forwarded (NCCL_* is in env_forward)
        assert "HOST_ONLY" not in env           # the host's environment stays outside
        assert "CONTAINERS_CONF" not in env     # the client's, not the worker's
        assert "/opt/host-only/bin" not in env["PATH"]  # the image's PATH, not the host's
        assert (tmp_path / f"pwd-{rank}.txt").read_text().strip() == "/work"
    assert containers_of(podman_env, "ctr-contract") == []
    assert not list((tmp_path / "logs" / "ctr-contract").rglob("*.env"))  # env files go with the attempt


def test_failing_rank_exit_code_and_teardown(tmp_path, podman_env):
    job = container_job(tmp_path, """[/bin/sh, -c, 'if [ "$RANK" = 1 ]; then sleep 1; exit 7; fi; exec sleep 300']""")
    t0 = time.monotonic()
    r = launch(job, "--job-id", "ctr-fail", "--result-json", str(tmp_path / "result.json"), env=podman_env)
    assert r.returncode == 1, r.stderr
    assert time.monotonic() - t0 < 60  # rank 0 was stopped, not waited for
    result = json.loads((tmp_path / "result.json").read_text())
    ff = result["attempts"][0]["first_failure"]
    assert ff["rank"] == 1 and ff["exit_code"] == 7
    assert "exited with code 7" in r.stderr
    assert containers_of(podman_env, "ctr-fail") == []


def test_sigterm_stops_the_containers(tmp_path, podman_env):
    job = container_job(tmp_path, """[/bin/sh, -c, 'echo up; exec sleep 300']""")
    p = start_launch(job, "--job-id", "ctr-stop", env=podman_env)
    try:
        wait_for(lambda: len(containers_of(podman_env, "ctr-stop")) == 2, timeout=60, what="both containers")
        env_files = sorted((tmp_path / "logs" / "ctr-stop" / "attempt-0").glob("*.env"))
        assert len(env_files) == 2
        assert all((f.stat().st_mode & 0o777) == 0o600 for f in env_files)  # the contract is not world-readable
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 143, err
    assert containers_of(podman_env, "ctr-stop") == []
    assert not any(f.exists() for f in env_files)


def own_children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except FileNotFoundError:
        return []


def test_kill_9_of_ddpctl_leaves_no_container(tmp_path, podman_env):
    job = container_job(tmp_path, """[/bin/sh, -c, 'exec sleep 300']""")
    p = start_launch(job, "--job-id", "ctr-kill9", env=podman_env)
    try:
        wait_for(lambda: len(containers_of(podman_env, "ctr-kill9")) == 2, timeout=60, what="both containers")
        p.kill()
        p.wait(timeout=30)
        # The watchdog removes them (no later launch needed).
        wait_for(lambda: containers_of(podman_env, "ctr-kill9") == [], timeout=60, what="containers removed")
    finally:
        if p.poll() is None:
            p.kill()


def test_next_launch_sweeps_what_a_dead_launcher_and_its_watchdog_left(tmp_path, podman_env):
    job = container_job(tmp_path, """[/bin/sh, -c, 'exec sleep 300']""")
    p = start_launch(job, "--job-id", "ctr-orphan", env=podman_env)
    try:
        wait_for(lambda: len(containers_of(podman_env, "ctr-orphan")) == 2, timeout=60, what="both containers")
        # The watchdog is the launcher's child that is a copy of ddpctl itself (not a runtime client),
        # and not the attempt's guardian, another copy, which names itself.
        watchdogs = [c for c in own_children(p.pid) if proc_argv(c)[:1] == [DDPCTL] and proc_comm(c) != GUARDIAN_COMM]
        assert len(watchdogs) == 1
        os.kill(watchdogs[0], signal.SIGKILL)
        p.kill()
        p.wait(timeout=30)
        time.sleep(1)  # what a watchdog would have done by now, had it lived
        assert containers_of(podman_env, "ctr-orphan") == ["ddpctl-ctr-orphan-a0-r0", "ddpctl-ctr-orphan-a0-r1"]
    finally:
        if p.poll() is None:
            p.kill()
    quick = container_job(tmp_path, "[/bin/sh, -c, 'exit 0']", nproc=1)
    r = launch(quick, "--job-id", "ctr-sweeper", env=podman_env)
    assert r.returncode == 0, r.stderr
    assert "left by a launcher that no longer runs" in r.stderr
    assert containers_of(podman_env, "ctr-orphan") == []


def test_missing_image_is_an_error_before_any_rank(tmp_path, podman_env):
    job = write_job(tmp_path, "command: [/bin/true]\ncontainer: {runtime: podman, image: localhost/no-such-image:1, pull: never}\n")
    r = launch(job, "--job-id", "ctr-noimage", env=podman_env)
    assert r.returncode == 2
    assert "image localhost/no-such-image:1 is not present on this node" in r.stderr
    assert "container.pull is never" in r.stderr
    assert not (tmp_path / "logs" / "ctr-noimage").exists()


def test_command_and_workdir_are_checked_inside_the_image(tmp_path, podman_env):
    # /bin/true is on this host, not in the image; /work/sub is in neither.
    job = container_job(tmp_path, "[/bin/true]")
    r = launch(job, "--job-id", "ctr-nocmd", env=podman_env)
    assert r.returncode == 2
    assert f"cannot run '/bin/true' inside image {IMAGE}: no such executable" in r.stderr
    job = write_job(tmp_path, f"command: [cat, /etc/marker]\ncontainer: {{runtime: podman, image: {IMAGE}, pull: never, "
                              "workdir: /work/sub}\n")
    r = launch(job, "--job-id", "ctr-nowd", env=podman_env)
    assert r.returncode == 2
    assert f"container.workdir /work/sub is not a directory inside image {IMAGE}" in r.stderr
    for job_id in ("ctr-nocmd", "ctr-nowd"):
        assert not (tmp_path / "logs" / job_id).exists()  # no rank started
        assert containers_of(podman_env, job_id) == []
    # A command that exists only on a mount of the job is found there.
    (tmp_path / "run.sh").write_text("#!/bin/sh\necho from the mount\n")
    (tmp_path / "run.sh").chmod(0o755)
    r = launch(container_job(tmp_path, "[./run.sh]", nproc=1), "--job-id", "ctr-mountcmd", env=podman_env)
    assert r.returncode == 0, r.stderr
    assert "[0] from the mount" in r.stdout


def test_multi_node_dry_run_shows_every_ranks_runtime_argv(tmp_path):
    """--dry-run --nodes --facts of a container job: each node's ranks as the agents would run
    them, their GPUs passed in by UUID (CDI), the worker's environment inside."""
    fixtures = SOURCE_DIR / "tests" / "fixtures" / "facts"
    job = write_job(tmp_path, f"nproc_per_node: gpu\ncommand: [python3, train.py]\n"
                              f"container: {{runtime: podman, image: {IMAGE}, mounts: ['./:/work'], workdir: /work}}\n")
    # names that resolve nowhere, looked up (MASTER_ADDR) in a network namespace without a route
    no_net = ["unshare", "--net"] if os.geteuid() == 0 else ["unshare", "--net", "--map-root-user"]
    r = subprocess.run([*no_net, DDPCTL, "launch", "--dry-run", "--nodes", "a,b", "--job-id", "ctr-nodes-dry", "--facts",
                        f"{fixtures / 'dgx-a.json'},{fixtures / 'dgx-b.json'}", str(job)],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    gpus = {n: [g["uuid"] for g in json.loads((fixtures / f"dgx-{n}.json").read_text())["gpus"]] for n in "ab"}
    seen = []
    for node in plan["nodes"]:
        for rank in (r for r in plan["ranks"] if r["node"] == node["node"]):
            argv = rank["argv"]
            assert argv[:4] == ["podman", "run", "--rm", "--init"]
            assert argv[argv.index("--name") + 1] == f"ddpctl-ctr-nodes-dry-a0-r{rank['rank']}"
            assert argv[-3:] == [IMAGE, "python3", "train.py"]
            assert argv[argv.index("--volume") + 1] == f"{tmp_path}:/work"
            devices = [argv[i + 1] for i, a in enumerate(argv) if a == "--device" and argv[i + 1].startswith("nvidia.com/")]
            assert devices == [f"nvidia.com/gpu={u}" for u in gpus[node["node"]]]  # the job's GPUs, local-rank order
            assert rank["env"]["RANK"] == str(rank["rank"]) and rank["env"]["GROUP_RANK"] == str(node["node_rank"])
            assert rank["container"]["env_file"].endswith(f"rank-{rank['rank']}.env")
            seen.append(rank["rank"])
    assert seen == list(range(16))


def test_dry_run_shows_each_ranks_runtime_command(tmp_path, podman_env):
    job = container_job(tmp_path, "[python3, train.py]")
    r = subprocess.run([DDPCTL, "launch", str(job), "--dry-run", "--job-id", "ctr-dry"], env=podman_env,
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    for rank in plan["ranks"]:
        argv = rank["argv"]
        assert argv[:4] == ["podman", "run", "--rm", "--init"]
        assert argv[argv.index("--name") + 1] == f"ddpctl-ctr-dry-a0-r{rank['rank']}"
        assert f"ddpctl.job=ctr-dry" in argv and "--network" in argv and "--ipc" in argv
        assert argv[-3:] == [IMAGE, "python3", "train.py"]
        assert rank["container"]["name"] == f"ddpctl-ctr-dry-a0-r{rank['rank']}"
        assert rank["env"]["RANK"] == str(rank["rank"])
    assert containers_of(podman_env, "ctr-dry") == []


def test_torch_ddp_inside_containers(tmp_path, podman_env):
    """Debian's torch, bind-mounted from the host, trains with gloo across two containerized ranks."""
    job = container_job(
        tmp_path, f"""[/usr/bin/python3, /src/examples/python/train_ddp.py, --epochs, "2", --checkpoint, /work/ckpt.pt]""",
        extra="env: {PYTHONUNBUFFERED: '1'}",
        container_extra=f"""  extra_args: [--volume, "/usr:/usr:ro", --volume, "/etc/alternatives:/etc/alternatives:ro",
               --volume, "/etc/ld.so.cache:/etc/ld.so.cache:ro", --volume, "{SOURCE_DIR}:/src:ro"]
""")
    r = launch(job, "--job-id", "ctr-torch", env=podman_env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "[0] epoch 1 loss" in r.stdout
    assert (tmp_path / "ckpt.pt").exists()
    assert containers_of(podman_env, "ctr-torch") == []


def test_packaging_image_builds_on_a_local_base_and_its_ddpctl_launches(tmp_path, podman_env):
    """packaging/container: bundle.sh's context, `podman build` with BASE set to the test image
    (no registry), then the image's own ddpctl runs a 2-rank job inside it."""
    context = tmp_path / "context"
    subprocess.run([str(SOURCE_DIR / "packaging" / "container" / "bundle.sh"), str(Path(DDPCTL).parents[1]), str(context)],
                   check=True, capture_output=True, timeout=120)
    # ddpctl loads OpenSSL when first called (ldd does not list it): the bundle carries it anyway.
    for lib in ("libssl.so.3", "libcrypto.so.3", "libc.so.6"):
        assert (context / "opt" / "ddpctl" / "lib" / lib).exists(), lib
    tag = "localhost/ddptest-ddpctl:1"
    b = subprocess.run([PODMAN, "build", "--build-arg", f"BASE={IMAGE}", "-t", tag, str(context)], env=podman_env,
                       capture_output=True, text=True, timeout=300)
    assert b.returncode == 0, b.stderr
    try:
        (tmp_path / "job.yaml").write_text('nproc_per_node: 2\ncommand: [/bin/sh, -c, "echo rank $RANK of $WORLD_SIZE"]\n')
        r = subprocess.run([PODMAN, "run", "--rm", "--network", "host", "--volume", f"{tmp_path}:/job", "--workdir", "/job",
                            tag, "ddpctl", "launch", "job.yaml", "--master-port", "0"],
                           env=podman_env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert "[0] rank 0 of 2" in r.stdout and "[1] rank 1 of 2" in r.stdout
        v = subprocess.run([PODMAN, "run", "--rm", tag, "ddp-agentd", "--help"], env=podman_env, capture_output=True,
                           text=True, timeout=120)
        assert v.returncode == 0 and "node agent" in v.stdout
    finally:
        subprocess.run([PODMAN, "rmi", "--force", tag], env=podman_env, capture_output=True, timeout=120)


def start_agents(tmp_path, env, n=2, envs=None):
    """n agents on loopback (the network rule: loopback only), each running one worker; `envs`:
    one environment per agent (each its own podman store) instead of `env` for all."""
    token = tmp_path / "token"
    fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(os.urandom(32).hex() + "\n")
    agents, ports = [], []
    for i in range(n):
        port = free_port()
        log = open(tmp_path / f"agent-{i}.log", "ab")
        agents.append(subprocess.Popen([str(Path(DDPCTL).parent / "ddp-agentd"), "--listen", f"127.0.0.1:{port}",
                                        "--token-file", str(token), "--log-dir", str(tmp_path / f"agent-logs-{i}"),
                                        "--name", f"node{i}"], env=envs[i] if envs else env, stdout=log,
                                       stderr=subprocess.STDOUT))
        ports.append(port)

    def listening(port):
        import socket
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0
    for port in ports:
        wait_for(lambda: listening(port), timeout=30, what=f"an agent on port {port}")
    return agents, ports, token


def test_multi_node_container_job_through_agents(tmp_path, podman_env):
    agents, ports, token = start_agents(tmp_path, podman_env)
    try:
        job = container_job(tmp_path, """[/bin/sh, -c, 'env > env-$RANK.txt']""", nproc=1)
        nodes = ",".join(f"127.0.0.1:{p}" for p in ports)
        r = subprocess.run([DDPCTL, "launch", "--nodes", nodes, "--token-file", str(token), "--master-port", str(free_port()), "--job-id", "ctr-multi",
                            str(job)], env=podman_env, capture_output=True, text=True, timeout=180, cwd=tmp_path)
        assert r.returncode == 0, r.stderr + "".join((tmp_path / f"agent-{i}.log").read_text() for i in range(2))
        for rank in range(2):
            env = dict(l.split("=", 1) for l in (tmp_path / f"env-{rank}.txt").read_text().splitlines() if "=" in l)
            assert env["RANK"] == str(rank) and env["WORLD_SIZE"] == "2"
            assert env["GROUP_RANK"] == str(rank) and env["GROUP_WORLD_SIZE"] == "2"
            assert env["MASTER_ADDR"] == "127.0.0.1" and env["GLOO_SOCKET_IFNAME"] == "lo"
            assert "CONTAINERS_CONF" not in env
        assert containers_of(podman_env, "ctr-multi") == []
    finally:
        for a in agents:
            a.terminate()
        for a in agents:
            try:
                a.wait(timeout=30)
            except subprocess.TimeoutExpired:
                a.kill()


def test_killed_agent_leaves_no_container(tmp_path, podman_env):
    agents, ports, token = start_agents(tmp_path, podman_env)
    job = container_job(tmp_path, """[/bin/sh, -c, 'exec sleep 300']""", nproc=1)
    nodes = ",".join(f"127.0.0.1:{p}" for p in ports)
    p = subprocess.Popen([DDPCTL, "launch", "--nodes", nodes, "--token-file", str(token), "--master-port", str(free_port()), "--job-id", "ctr-agentkill",
                          str(job)], env=podman_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        wait_for(lambda: len(containers_of(podman_env, "ctr-agentkill")) == 2, timeout=120, what="both containers")
        agents[1].kill()  # its shepherd tears its container down; the launcher stops the other node
        out, err = p.communicate(timeout=120)
        assert p.returncode != 0
        wait_for(lambda: containers_of(podman_env, "ctr-agentkill") == [], timeout=60, what="containers removed")
    finally:
        if p.poll() is None:
            p.kill()
        for a in agents:
            if a.poll() is None:
                a.terminate()
                a.wait(timeout=30)


def stop_agents(agents):
    for a in agents:
        if a.poll() is None:
            a.terminate()
    for a in agents:
        try:
            a.wait(timeout=30)
        except subprocess.TimeoutExpired:
            a.kill()
            a.wait(timeout=30)


def launch_nodes(tmp_path, env, ports, token, job, job_id, timeout=180):
    nodes = ",".join(f"127.0.0.1:{p}" for p in ports)
    return subprocess.run([DDPCTL, "launch", "--nodes", nodes, "--token-file", str(token), "--master-port", str(free_port()), "--job-id", job_id, str(job)],
                          env=env, capture_output=True, text=True, timeout=timeout, cwd=tmp_path)


def ranks_started(tmp_path, n, job_id):
    # <log_dir>/<user>/<job>/attempt-0: the agents run as root, and so do their jobs.
    return [i for i in range(n) if (tmp_path / f"agent-logs-{i}" / "root" / job_id / "attempt-0").exists()]


def test_agents_pull_per_policy_and_a_failed_pull_starts_no_rank(tmp_path, podman_env):
    agents, ports, token = start_agents(tmp_path, podman_env)
    try:
        # missing: the image is there, so no agent pulls.
        job = container_job(tmp_path, "[/bin/sh, -c, 'exit 0']", nproc=1, container_extra="  pull: missing\n")
        job.write_text(job.read_text().replace("  pull: never\n", ""))
        r = launch_nodes(tmp_path, podman_env, ports, token, job, "ctr-pull-missing")
        assert r.returncode == 0, r.stderr
        logs = "".join((tmp_path / f"agent-{i}.log").read_text() for i in range(2))
        assert "pulling" not in logs
        # always: every agent pulls before joining; there is no registry here, so the pull fails
        # on each node, and the launch stops before any rank starts anywhere.
        job.write_text(job.read_text().replace("  pull: missing\n", "  pull: always\n"))
        r = launch_nodes(tmp_path, podman_env, ports, token, job, "ctr-pull-always")
        assert r.returncode == 2
        assert "preflight failed on 127.0.0.1:" in r.stderr and f"podman pull {IMAGE} failed" in r.stderr
        assert ranks_started(tmp_path, 2, "ctr-pull-always") == []
        # (the first node to fail stops the launch, which may cancel the other's pull midway)
        logs = "".join((tmp_path / f"agent-{i}.log").read_text() for i in range(2))
        assert f"pulling {IMAGE} with podman" in logs
        # never, and the image is not there.
        job.write_text(job.read_text().replace(IMAGE, "localhost/no-such-image:1").replace("pull: always", "pull: never"))
        r = launch_nodes(tmp_path, podman_env, ports, token, job, "ctr-pull-never")
        assert r.returncode == 2
        assert "image localhost/no-such-image:1 is not present on this node" in r.stderr
        assert "container.pull is never" in r.stderr
        assert ranks_started(tmp_path, 2, "ctr-pull-never") == []
    finally:
        stop_agents(agents)


def test_agents_check_the_command_inside_the_image(tmp_path, podman_env):
    agents, ports, token = start_agents(tmp_path, podman_env)
    try:
        r = launch_nodes(tmp_path, podman_env, ports, token, container_job(tmp_path, "[/bin/true]", nproc=1), "ctr-agent-nocmd")
        assert r.returncode == 2
        assert f"cannot run '/bin/true' inside image {IMAGE}" in r.stderr
        assert ranks_started(tmp_path, 2, "ctr-agent-nocmd") == []
        assert containers_of(podman_env, "ctr-agent-nocmd") == []
    finally:
        stop_agents(agents)


def test_nodes_with_different_images_under_one_name_start_no_rank(tmp_path, tmp_path_factory, podman_env):
    """Node 1's podman store holds another image under the same name (another marker file):
    the launch names both digests and the nodes, and starts nothing."""
    other = make_podman_store(tmp_path_factory.mktemp("podman-other"), marker="other")
    try:
        ids = [podman(e, "image", "inspect", "--format", "{{.Id}}", IMAGE).strip() for e in (podman_env, other)]
        assert ids[0] != ids[1]
        agents, ports, token = start_agents(tmp_path, podman_env, envs=[podman_env, other])
        try:
            job = container_job(tmp_path, "[/bin/sh, -c, 'exit 0']", nproc=1)
            r = launch_nodes(tmp_path, podman_env, ports, token, job, "ctr-digests")
            assert r.returncode == 2
            assert f"the nodes have different images for {IMAGE}" in r.stderr
            assert f"127.0.0.1:{ports[0]} has sha256:{ids[0]}" in r.stderr
            assert f"127.0.0.1:{ports[1]} has sha256:{ids[1]}" in r.stderr
            assert ranks_started(tmp_path, 2, "ctr-digests") == []
        finally:
            stop_agents(agents)
    finally:
        drop_podman_store(other)


def test_doctor_shows_the_image_digest_here_and_on_every_node(tmp_path, tmp_path_factory, podman_env):
    image_id = "sha256:" + podman(podman_env, "image", "inspect", "--format", "{{.Id}}", IMAGE).strip()
    r = subprocess.run([DDPCTL, "doctor", "--json", "--image", IMAGE, "--runtime", "podman"], env=podman_env,
                       capture_output=True, text=True, timeout=120)
    here = json.loads(r.stdout)["container_image"]
    assert here["runtime"] == "podman" and here["image"] == IMAGE and here["digest"] == image_id
    job = container_job(tmp_path, "[/bin/true]")
    r = subprocess.run([DDPCTL, "doctor", "--job", str(job)], env=podman_env, capture_output=True, text=True, timeout=120)
    assert image_id in r.stdout
    r = subprocess.run([DDPCTL, "doctor", "--image", "localhost/no-such-image:1", "--runtime", "podman"], env=podman_env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert "image localhost/no-such-image:1 is not present on this node" in r.stdout and "[image-missing]" in r.stdout
    r = subprocess.run([DDPCTL, "doctor", "--image", IMAGE], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--image needs --runtime" in r.stderr

    # Two agents, each with its own store holding a different image under the same name.
    other = make_podman_store(tmp_path_factory.mktemp("podman-doctor"), marker="doctor")
    try:
        other_id = "sha256:" + podman(other, "image", "inspect", "--format", "{{.Id}}", IMAGE).strip()
        agents, ports, token = start_agents(tmp_path, podman_env, envs=[podman_env, other])
        try:
            nodes = ",".join(f"127.0.0.1:{p}" for p in ports)
            r = subprocess.run([DDPCTL, "doctor", "--json", "--nodes", nodes, "--token-file", str(token), "--image", IMAGE,
                                "--runtime", "podman"], env=podman_env, capture_output=True, text=True, timeout=120)
            out = json.loads(r.stdout)
            assert [n["container_image"]["digest"] for n in out["nodes"]] == [image_id, other_id]
            mismatch = [f for f in out["findings"] if f["code"] == "image-mismatch"]
            assert len(mismatch) == 1 and image_id in mismatch[0]["message"] and other_id in mismatch[0]["message"]
            assert r.returncode == 1
        finally:
            stop_agents(agents)
    finally:
        drop_podman_store(other)


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_stop_during_the_pull_ends_it_at_once(tmp_path, sig, code):
    # A pull may take half an hour; the launcher's stops were read only once its event loop ran,
    # after the preflight, so Ctrl-C and SIGTERM did nothing meanwhile. A stand-in podman (no
    # real one needed): `image inspect` finds nothing, `pull` hangs.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "podman"
    fake.write_text(f"""#!/bin/sh
if [ "$1" = pull ]; then
  echo $$ > {tmp_path}/pull.pid.tmp && mv {tmp_path}/pull.pid.tmp {tmp_path}/pull.pid
  exec sleep 600
fi
exit 1
""")
    fake.chmod(0o755)
    job = write_job(tmp_path, "command: [/bin/true]\ncontainer: {runtime: podman, image: localhost/slow:1, pull: missing}\n")
    p = start_launch(job, "--job-id", "ctr-stop-pull", "--result-json", str(tmp_path / "result.json"),
                     env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    pull = None
    try:
        wait_for(lambda: (tmp_path / "pull.pid").exists() or p.poll() is not None, 30, "the pull")
        assert p.poll() is None, p.communicate()
        pull = int((tmp_path / "pull.pid").read_text())
        p.send_signal(sig)
        out, err = p.communicate(timeout=10)
        assert p.returncode == code, err
        assert f"stopped by {signal.Signals(sig).name} during the container preflight" in err, err
        wait_for(lambda: not os.path.exists(f"/proc/{pull}") or "Z" in open(f"/proc/{pull}/stat").read().split(")")[-1][:3],
                 5, "the pull to be killed")
        result = json.loads((tmp_path / "result.json").read_text())
        assert result["status"] == "stopped" and result["exit_code"] == code, result
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
        if pull:
            try:
                os.kill(pull, signal.SIGKILL)
            except ProcessLookupError:
                pass
