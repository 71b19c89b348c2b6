"""Workers inside real docker containers, against dockerds the test starts: on this host (loopback)
and one per simulated node (tests/integration/multinode/simcluster.py). The contract inside, exit
codes, a stop, kill -9 of ddpctl and of an agent leaving no container, the sweep of what a dead
launcher left, and the GPU flags as docker itself reads them.

Time budget: 90 s on 2 cores (measured 40-66 s with other builds running: three dockerds start in
about 3 s, each container run costs about 1 s). Setup is one module fixture, `world`.

The docker is Debian's docker.io (scripts/setup installs it): /usr/sbin/dockerd, and /usr/bin/docker
as the client, first on the PATH that ddpctl and the agents get (this machine kind has another
docker in /usr/local/bin). Each dockerd is the test's own and touches nothing of the machine's:
  - its data root, exec root, pid file and socket in a folder of the test's (/var/tmp: the
    simulated hosts replace /tmp), the CLI pointed at it by DOCKER_HOST, and DOCKER_CONFIG an
    empty folder (no user config, context or credential helper of the machine's);
  - `--bridge=none --iptables=false --ip6tables=false`: no bridge, no firewall rule;
  - its own mount namespace with a tmpfs on /run, so the /run/docker and /run/containerd that
    dockerd and containerd make, and the nsfs mount that dockerd leaves under its exec root,
    live and die with it (nothing appears in the machine's /run or mount table);
  - its own pid namespace, with dockerd as its init: when dockerd ends, the kernel ends its
    containerd, shims and containers with it (the teardown's bound, should a stop hang);
  - `--cgroup-parent` a cgroup named for the run (removed at teardown), not docker's default.
A simulated node's dockerd is entered into that node's network namespace (nsenter --net; not
`ip netns exec`, which remounts /sys and hides the cgroups dockerd needs), so `--network host`
puts the node's containers in the node's network, as on a real node: a dockerd in the root
namespace would put every node's containers on the root's network. The image is busybox-static in
a rootfs tarball, `docker import`ed once and `docker save`d / `docker load`ed into every dockerd,
so every node holds the same image id, as the launch's digest check requires (no registry).
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "multinode"))
import simcluster  # noqa: E402
from ddptest import (DDPCTL, GUARDIAN_COMM, SOURCE_DIR, launch, proc_argv, proc_comm, start_launch,  # noqa: E402
                     wait_for, write_job)

DOCKER = "/usr/bin/docker"
DOCKERD = "/usr/sbin/dockerd"
BUSYBOX = shutil.which("busybox")
IMAGE = "localhost/ddptest-busybox:1"
# The client ddpctl and the agents find: Debian's, not /usr/local/bin's.
PATH = "/usr/bin:/usr/sbin:/bin:/sbin"


def _unavailable():
    if os.geteuid() != 0:
        return "a dockerd of the test's own needs root"
    for tool in (DOCKER, DOCKERD):
        if not os.access(tool, os.X_OK):
            return f"{tool} is not installed (scripts/setup installs Debian's docker.io)"
    if BUSYBOX is None:
        return "busybox is not installed (scripts/setup installs busybox-static)"
    return simcluster.netns_unavailable()


SKIP = _unavailable()
pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")


class Dockerd:
    """One dockerd of the test's (see the module's docstring), in `netns` (a name under
    /run/netns) or in the root network namespace."""

    def __init__(self, base: Path, name: str, netns=None, hostname=None):
        self.base = base / name
        self.base.mkdir(parents=True)
        (self.base / "config").mkdir()
        self.sock = self.base / "docker.sock"
        self.cgroup = f"ddptest-docker-{os.getpid()}-{name}"
        self.env = dict(os.environ, PATH=PATH, DOCKER_HOST=f"unix://{self.sock}",
                        DOCKER_CONFIG=str(self.base / "config"))
        self.log_path = self.base / "dockerd.log"
        enter = ["nsenter", f"--net=/run/netns/{netns}"] if netns else []
        inner = "mount -t tmpfs tmpfs /run && " + (f"hostname {hostname} && " if hostname else "") + 'exec "$@"'
        argv = [*enter, "unshare", "--mount", "--propagation", "private", "--uts", "--pid", "--fork", "--kill-child",
                "--mount-proc", "sh", "-c", inner, "sh", DOCKERD, "--bridge=none", "--iptables=false",
                "--ip6tables=false", f"--cgroup-parent=/{self.cgroup}", "--data-root", str(self.base / "data"),
                "--exec-root", str(self.base / "exec"), "--pidfile", str(self.base / "docker.pid"), "-H",
                f"unix://{self.sock}"]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self):
        try:
            wait_for(lambda: self.sock.exists() or self.proc.poll() is not None, timeout=60, what="dockerd's socket")
            assert self.proc.poll() is None, "dockerd ended"
            # The socket exists before the API serves; a request queues until it does.
            self.docker("version", "--format", "{{.Server.Version}}", timeout=60)
        except BaseException as e:
            raise AssertionError(f"dockerd in {self.base} did not start ({e}):\n{self.log()}") from e

    def log(self):
        return self.log_path.read_text(errors="replace")[-4000:]

    def docker(self, *args, timeout=60, check=True):
        r = subprocess.run([DOCKER, *args], env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"docker {' '.join(args)} exited {r.returncode}: {r.stderr}")
        return r.stdout

    def containers(self, label="ddpctl.owner", name=None):
        """Names of every container, running or not, carrying `label` (key or key=value) and, if
        given, whose name holds `name`."""
        by_name = ["--filter", f"name={name}"] if name else []
        return sorted(self.docker("ps", "--all", "--filter", f"label={label}", *by_name, "--format",
                                  "{{.Names}}").split())

    def stop(self):
        """Its containers, then dockerd (SIGTERM; SIGKILL after 30 s, which ends its pid namespace),
        then its cgroups."""
        if self.proc.poll() is None:
            try:
                names = self.containers()
                if names:
                    self.docker("rm", "--force", *names, check=False)
            except (AssertionError, subprocess.TimeoutExpired):
                pass
            # unshare --fork --kill-child: dockerd (its child) gets SIGKILL if unshare dies, so
            # SIGTERM goes to dockerd itself, and unshare exits when it has.
            for child in _children(self.proc.pid):
                os.kill(child, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        for d in Path("/sys/fs/cgroup").glob(f"*/{self.cgroup}"):
            try:
                d.rmdir()
            except OSError:
                pass
        # Its mounts were in its own mount namespace; none may have reached this one.
        with open("/proc/self/mountinfo") as f:
            leaked = [line.split()[4] for line in f if line.split()[4].startswith(str(self.base))]
        for m in leaked:
            subprocess.run(["umount", "-l", m], capture_output=True, timeout=30)
        assert not leaked, f"dockerd left mounts in the test's mount namespace: {leaked}"


def _children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except FileNotFoundError:
        return []


def _image_tar(base: Path):
    rootfs = base / "rootfs"
    (rootfs / "bin").mkdir(parents=True)
    for d in ("etc", "tmp", "work"):
        (rootfs / d).mkdir()
    shutil.copy(BUSYBOX, rootfs / "bin" / "busybox")
    for applet in ("sh", "cat", "echo", "env", "sleep", "hostname", "ip", "grep", "tr"):
        (rootfs / "bin" / applet).symlink_to("busybox")
    tar = base / "rootfs.tar"
    subprocess.run(["tar", "-C", str(rootfs), "-cf", str(tar), "."], check=True)
    return tar


class World:
    pass


@pytest.fixture(scope="module")
def world():
    """A dockerd on this host, a simulated cluster (n1, n2 and the launcher's ctl) with a dockerd
    in each node's network namespace, and the same image in every dockerd."""
    w = World()
    w.base = Path(tempfile.mkdtemp(prefix="ddp-docker-", dir="/var/tmp"))
    w.daemons = []
    w.cluster = simcluster.Cluster(nodes=2)
    try:
        w.cluster.__enter__()
        w.local = Dockerd(w.base, "local")
        w.nodes = {h.name: Dockerd(w.base, h.name, netns=h.ns, hostname=h.name) for h in w.cluster.hosts}
        w.daemons = [w.local, *w.nodes.values()]
        for d in w.daemons:
            d.wait_ready()
        w.local.docker("import", str(_image_tar(w.base)), IMAGE, timeout=120)
        saved = w.base / "image.tar"
        w.local.docker("save", "--output", str(saved), IMAGE, timeout=120)
        for d in w.nodes.values():
            d.docker("load", "--input", str(saved), timeout=120)
        w.image_id = w.local.docker("image", "inspect", "--format", "{{.Id}}", IMAGE).strip()
        yield w
    finally:
        errors = []
        for d in w.daemons:
            try:
                d.stop()
            except AssertionError as e:
                errors.append(str(e))
        w.cluster.teardown()
        shutil.rmtree(w.base, ignore_errors=True)
        assert not errors, errors


def container_job(tmp: Path, command: str, nproc=2, extra="", container_extra=""):
    return write_job(tmp, f"""name: d
nproc_per_node: {nproc}
command: {command}
stop: {{grace: 3s}}
{extra}
container:
  runtime: docker
  image: {IMAGE}
  pull: never
  mounts: ["./:/work"]
  workdir: /work
{container_extra}""")


def env_of(path: Path):
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


# ---- on this host ----


def test_ranks_see_their_contract_inside(tmp_path, world):
    job = container_job(tmp_path, """[/bin/sh, -c, 'env > env-$RANK.txt; tr "\\0" " " < /proc/1/cmdline > init-$RANK.txt']""",
                        extra="env: {FROM_JOB: job}", container_extra="  env: {FROM_CONTAINER: image-side}\n")
    r = launch(job, "--job-id", "dk-contract", env=dict(world.local.env, HOST_ONLY="secret", NCCL_DEBUG="WARN",
                                                        PATH=PATH + ":/opt/host-only/bin"))
    assert r.returncode == 0, r.stderr
    for rank in range(2):
        env = env_of(tmp_path / f"env-{rank}.txt")
        assert env["RANK"] == str(rank) and env["LOCAL_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == "2" and env["LOCAL_WORLD_SIZE"] == "2"
        assert env["GROUP_RANK"] == "0" and env["GROUP_WORLD_SIZE"] == "1"
        assert env["MASTER_ADDR"] == "127.0.0.1" and int(env["MASTER_PORT"]) > 0
        assert env["TORCHELASTIC_RUN_ID"] == "dk-contract" and env["DDP_JOB_ID"] == "dk-contract"
        assert env["FROM_JOB"] == "job" and env["FROM_CONTAINER"] == "image-side"
        assert env["NCCL_DEBUG"] == "WARN"
        assert "HOST_ONLY" not in env and "DOCKER_HOST" not in env  # the client's, not the worker's
        assert "/opt/host-only/bin" not in env["PATH"]  # the image's PATH, not the host's
        # --init: docker's init is pid 1 and the worker's shell its child.
        assert (tmp_path / f"init-{rank}.txt").read_text().startswith("/sbin/docker-init -- /bin/sh -c")
    assert world.local.containers("ddpctl.job=dk-contract") == []
    assert not list((tmp_path / "logs" / "dk-contract").rglob("*.env"))


def test_failing_rank_exit_code_and_teardown(tmp_path, world):
    job = container_job(tmp_path, """[/bin/sh, -c, 'if [ "$RANK" = 1 ]; then sleep 1; exit 7; fi; exec sleep 300']""")
    t0 = time.monotonic()
    r = launch(job, "--job-id", "dk-fail", "--result-json", str(tmp_path / "result.json"), env=world.local.env)
    assert r.returncode == 1, r.stderr
    assert time.monotonic() - t0 < 60  # rank 0 was stopped, not waited for
    ff = json.loads((tmp_path / "result.json").read_text())["attempts"][0]["first_failure"]
    assert ff["rank"] == 1 and ff["exit_code"] == 7
    assert "exited with code 7" in r.stderr
    assert world.local.containers("ddpctl.job=dk-fail") == []


def test_sigterm_reaches_the_worker_and_stops_the_containers(tmp_path, world):
    job = container_job(tmp_path, """[/bin/sh, -c, 'trap "echo got-TERM > term-$RANK.txt; exit 143" TERM;
                        echo > up-$RANK.txt; while true; do sleep 1; done']""")
    p = start_launch(job, "--job-id", "dk-stop", env=world.local.env)
    try:
        # Both workers have set their trap.
        wait_for(lambda: all((tmp_path / f"up-{r}.txt").exists() for r in range(2)) or p.poll() is not None,
                 timeout=60, what="both workers up")
        assert p.poll() is None, p.communicate()[1]
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 143, err
    assert world.local.containers("ddpctl.job=dk-stop") == []
    # The stop went client -> container -> docker-init -> the worker's shell, which said so.
    assert [(tmp_path / f"term-{r}.txt").read_text().strip() for r in range(2)] == ["got-TERM"] * 2, err


def test_kill_9_of_ddpctl_leaves_no_container(tmp_path, world):
    job = container_job(tmp_path, """[/bin/sh, -c, 'exec sleep 300']""")
    p = start_launch(job, "--job-id", "dk-kill9", env=world.local.env)
    try:
        wait_for(lambda: len(world.local.containers("ddpctl.job=dk-kill9")) == 2, timeout=60, what="both containers")
        p.kill()
        p.wait(timeout=30)
        # docker's containers live under dockerd, out of the launcher's reach: its watchdog removes them.
        wait_for(lambda: world.local.containers("ddpctl.job=dk-kill9") == [], timeout=60, what="containers removed")
    finally:
        if p.poll() is None:
            p.kill()


def test_next_launch_sweeps_what_a_dead_launcher_and_its_watchdog_left(tmp_path, world):
    """The sweep lists containers by owner label; its `ps --format` must be one docker reads
    (docker's .Labels is a string, not podman's map: `index .Labels` made docker exit 1, and the
    sweep found nothing)."""
    job = container_job(tmp_path, """[/bin/sh, -c, 'exec sleep 300']""")
    p = start_launch(job, "--job-id", "dk-orphan", env=world.local.env)
    try:
        wait_for(lambda: len(world.local.containers("ddpctl.job=dk-orphan")) == 2, timeout=60, what="both containers")
        # Not the attempt's guardian, another copy of ddpctl, which names itself.
        watchdogs = [c for c in _children(p.pid) if proc_argv(c)[:1] == [DDPCTL] and proc_comm(c) != GUARDIAN_COMM]
        assert len(watchdogs) == 1
        os.kill(watchdogs[0], signal.SIGKILL)
        p.kill()
        p.wait(timeout=30)
        assert world.local.containers("ddpctl.job=dk-orphan") == ["ddpctl-dk-orphan-a0-r0", "ddpctl-dk-orphan-a0-r1"]
    finally:
        if p.poll() is None:
            p.kill()
    try:
        r = launch(container_job(tmp_path, "[/bin/sh, -c, 'exit 0']", nproc=1), "--job-id", "dk-sweeper",
                   env=world.local.env)
        assert r.returncode == 0, r.stderr
        assert "removing 2 container(s) left by a launcher that no longer runs" in r.stderr, r.stderr
        assert world.local.containers("ddpctl.job=dk-orphan") == []
    finally:
        left = world.local.containers("ddpctl.job=dk-orphan")
        if left:
            world.local.docker("rm", "--force", *left, check=False)


def test_image_and_command_are_checked_with_docker(tmp_path, world):
    job = write_job(tmp_path, "command: [/bin/true]\ncontainer: {runtime: docker, image: localhost/no-such-image:1, pull: never}\n")
    r = launch(job, "--job-id", "dk-noimage", env=world.local.env)
    assert r.returncode == 2, r.stderr
    assert "image localhost/no-such-image:1 is not present on this node" in r.stderr
    r = launch(container_job(tmp_path, "[/bin/true]"), "--job-id", "dk-nocmd", env=world.local.env)
    assert r.returncode == 2, r.stderr
    assert f"cannot run '/bin/true' inside image {IMAGE}: no such executable" in r.stderr
    job = write_job(tmp_path, f"command: [cat]\ncontainer: {{runtime: docker, image: {IMAGE}, pull: never, workdir: /work/sub}}\n")
    r = launch(job, "--job-id", "dk-nowd", env=world.local.env)
    assert r.returncode == 2, r.stderr
    assert f"container.workdir /work/sub is not a directory inside image {IMAGE}" in r.stderr
    for job_id in ("dk-noimage", "dk-nocmd", "dk-nowd"):
        assert not (tmp_path / "logs" / job_id).exists()
        assert world.local.containers(name=f"ddpctl-{job_id}-check-") == []  # the check's throwaway container


def test_gpu_flags_are_read_by_docker_as_the_ranks_gpus(tmp_path, world):
    """The runtime argv of --dry-run --nodes --facts (two DGX fixtures, 8 GPUs each), as lib/container
    builds it, given to the real docker CLI with `create` for `run` (no GPU here to start it on):
    docker's own reading of `--gpus` is each rank's GPU UUID, in order, with the gpu capability."""
    fixtures = SOURCE_DIR / "tests" / "fixtures" / "facts"
    job = write_job(tmp_path, f"nproc_per_node: gpu\ncommand: [python3, train.py]\n"
                              f"container: {{runtime: docker, image: {IMAGE}, mounts: ['./:/work'], workdir: /work}}\n")
    r = subprocess.run(["unshare", "--net", DDPCTL, "launch", "--dry-run", "--nodes", "a,b", "--job-id", "dk-gpu",
                        "--facts", f"{fixtures / 'dgx-a.json'},{fixtures / 'dgx-b.json'}", str(job)],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path, env=world.local.env)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    gpus = {n: [g["uuid"] for g in json.loads((fixtures / f"dgx-{n}.json").read_text())["gpus"]] for n in "ab"}
    ranks = [r for r in plan["ranks"] if r["rank"] in (0, 9)]  # one per node
    assert len(ranks) == 2
    created = []
    try:
        for rank in ranks:
            argv = rank["argv"]
            assert argv[:2] == ["docker", "run"]
            # The flag as lib/container builds it: docker reads --gpus as CSV, so the list is quoted.
            assert argv[argv.index("--gpus") + 1] == f'"device={",".join(gpus[rank["node"]])}"'
            # This host has neither those CPUs nor those NUMA nodes (docker refuses them at
            # create), and the env file's folder is the node's agent's: only those go; every
            # other flag is docker's to read as the node's agent would give it.
            env_file = tmp_path / f"rank-{rank['rank']}.env"
            env_file.write_text("")
            args, i, dropped = [], 2, []
            while i < len(argv):
                if argv[i] in ("--cpuset-cpus", "--cpuset-mems"):
                    dropped.append(argv[i])
                    i += 2
                    continue
                args.append(argv[i])
                if argv[i] == "--env-file":
                    args.append(str(env_file))
                    i += 1
                i += 1
            assert dropped == ["--cpuset-cpus", "--cpuset-mems"]
            world.local.docker("create", *args)
            name = rank["container"]["name"]
            created.append(name)
            requests = json.loads(world.local.docker("container", "inspect", "--format",
                                                     "{{json .HostConfig.DeviceRequests}}", name))
            # Every GPU the node gave the job (the binding's CUDA_VISIBLE_DEVICES, in local-rank
            # order, so set_device(LOCAL_RANK) inside picks the rank's own): the quoted list is
            # read as one list of 8, not split at its commas.
            assert rank["env"]["CUDA_VISIBLE_DEVICES"] == ",".join(gpus[rank["node"]])
            assert requests == [{"Driver": "", "Count": 0, "DeviceIDs": gpus[rank["node"]],
                                 "Capabilities": [["gpu"]], "Options": {}}], requests
    finally:
        if created:
            world.local.docker("rm", "--force", *created, check=False)


# ---- across simulated nodes, one dockerd in each node's network namespace ----


@pytest.fixture
def agents(world):
    """An agent on n1 and n2, each pointed at its node's dockerd; stopped after the test."""
    c = world.cluster
    for h in c.hosts:
        d = world.nodes[h.name]
        c.start_agent(h, env={"PATH": PATH, "DOCKER_HOST": d.env["DOCKER_HOST"], "DOCKER_CONFIG": d.env["DOCKER_CONFIG"]})
    yield c
    for h in c.hosts:
        a = c.agents.pop(h.name, None)
        if a is not None and a.poll() is None:
            a.terminate()
            try:
                a.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(a.pid, signal.SIGKILL)
                a.wait(timeout=30)


def node_job(c, name, command, nproc=1):
    return simcluster.job_file(c, name, command, nproc=nproc, extra=(
        f"container:\n  runtime: docker\n  image: {IMAGE}\n  pull: never\n  mounts: ['./:/work']\n  workdir: /work\n"))


def on_nodes(world, job_id):
    return {n: d.containers(f"ddpctl.job={job_id}") for n, d in world.nodes.items()}


def none_on_nodes(world, job_id):
    return all(v == [] for v in on_nodes(world, job_id).values())


def test_contract_across_simulated_nodes_in_each_nodes_network(world, agents):
    c = agents
    job = node_job(c, "dk-nodes", ["/bin/sh", "-c", "env > env-$RANK.txt; hostname > host-$RANK.txt; "
                                                    "ip -o -4 addr show eth0 > addr-$RANK.txt"], nproc=2)
    rc, out, err = simcluster.finish(c.launch(job, "--job-id", "dk-nodes"), timeout=120)
    assert rc == 0, err + "".join(c.agent_log(h) for h in c.hosts)
    n1, n2 = c.hosts
    d = Path(c.dir)
    for rank in range(4):
        host = n1 if rank < 2 else n2
        env = env_of(d / f"env-{rank}.txt")
        assert env["RANK"] == str(rank) and env["LOCAL_RANK"] == str(rank % 2)
        assert env["WORLD_SIZE"] == "4" and env["LOCAL_WORLD_SIZE"] == "2"
        assert env["GROUP_RANK"] == str(rank // 2) and env["GROUP_WORLD_SIZE"] == "2"
        assert env["MASTER_ADDR"] == n1.addr and env["MASTER_PORT"] == "29500"
        assert env["GLOO_SOCKET_IFNAME"] == "eth0" and env["TORCHELASTIC_RUN_ID"] == "dk-nodes"
        assert "DOCKER_HOST" not in env
        # The container is on its node's network (that node's eth0 and address), not the root's.
        assert f"inet {host.addr}/24" in (d / f"addr-{rank}.txt").read_text()
        assert (d / f"host-{rank}.txt").read_text().strip() == host.name
    assert none_on_nodes(world, "dk-nodes")


def test_failing_rank_on_a_node_is_named_and_no_container_is_left(world, agents):
    c = agents
    job = node_job(c, "dk-nodefail", ["/bin/sh", "-c", 'if [ "$RANK" = 1 ]; then echo ready; sleep 1; exit 7; fi; '
                                                       "exec sleep 300"])
    rc, out, err = simcluster.finish(c.launch(job, "--job-id", "dk-nodefail"), timeout=120)
    assert rc == 1, err
    assert f"first failure: rank 1 (local rank 0, node {c.hosts[1].addr}" in err, err
    assert "exited with code 7" in err, err
    assert none_on_nodes(world, "dk-nodefail"), on_nodes(world, "dk-nodefail")


def test_kill_9_of_an_agent_leaves_no_container_on_any_node(world, agents):
    c = agents
    job = node_job(c, "dk-agentkill", ["/bin/sh", "-c", "exec sleep 300"])
    p = c.launch(job, "--job-id", "dk-agentkill")
    try:
        wait_for(lambda: all(len(v) == 1 for v in on_nodes(world, "dk-agentkill").values()), timeout=90,
                 what="a container on each node")
        os.kill(c.agents["n2"].pid, signal.SIGKILL)  # its shepherd removes n2's; the launcher stops n1's
        rc, out, err = simcluster.finish(p, timeout=90)
        assert rc == 1, err
        assert f"node {c.hosts[1].addr} was lost" in err, err
        wait_for(lambda: none_on_nodes(world, "dk-agentkill"), timeout=60, what="every node's container removed")
    finally:
        if p.poll() is None:
            p.kill()


def test_kill_9_of_ddpctl_leaves_no_container_on_any_node(world, agents):
    c = agents
    job = node_job(c, "dk-ctlkill", ["/bin/sh", "-c", "exec sleep 300"])
    p = c.launch(job, "--job-id", "dk-ctlkill")
    try:
        wait_for(lambda: all(len(v) == 1 for v in on_nodes(world, "dk-ctlkill").values()), timeout=90,
                 what="a container on each node")
        os.kill(p.pid, signal.SIGKILL)  # the agents see the connection close and stop the job
        p.wait(timeout=30)
        # connection closed or heartbeat timeout (3 s) + stop grace (3 s) + container removal
        wait_for(lambda: none_on_nodes(world, "dk-ctlkill"), timeout=60, what="every node's container removed")
        assert all(a.poll() is None for a in c.agents.values()), "the agents keep serving"
    finally:
        if p.poll() is None:
            p.kill()
