"""Simulated hosts for the multi-node tests: one network namespace per host, joined by a bridge.

Each host gets its own namespace (veth 'eth0' on a bridge, an address in a test-private
10.213.X.0/24 chosen per run), its own hostname (unshare --uts, plus /etc/netns/NS/hosts naming
every host) and a private /tmp (unshare --mount + tmpfs), so logs and error files reach the
launcher only through the protocol. The launcher (ddpctl) runs in a namespace of its own.
With homes=True each host (the launcher's too) also gets a private home: a folder of the run's
bind-mounted over /root in its mount namespace, where start_sshd() puts what sshd and ssh read
(authorized_keys, ~/.ssh/config, known_hosts, the upload cache).

The network rule: nothing here connects from the root namespace to a namespace address. As a
guard, the root namespace gets a blackhole route for the run's /24, so a mistake fails instead of
leaving the machine. Everything made here is torn down by what it is (the pids we started, the
namespaces, links, route and /etc/netns folders we named); never by process name.
"""
import json
import os
import random
import re
import shutil
import signal
import subprocess
import tempfile
import time

SRC = os.environ.get("DDP_SOURCE_DIR", os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))
BUILD = os.environ.get("DDP_BINARY_DIR", os.path.join(SRC, "build"))
BIN = os.path.join(BUILD, "bin")
AGENT_PORT = 29410


def _run(*cmd, check=True):
    return subprocess.run(list(cmd), capture_output=True, text=True, check=check, timeout=30)


def netns_unavailable():
    """A reason to skip, or None when namespaces work here."""
    if os.geteuid() != 0:
        return "needs root for network namespaces"
    for tool in ("ip", "unshare", "mount"):
        if not shutil.which(tool):
            return f"'{tool}' not found"
    name = f"ddpprobe{os.getpid() % 100000}"
    r = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if r.returncode != 0:
        return f"ip netns add is not permitted here: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


BUILT = ("ddpctl", "ddp-agentd", "ddp-ncclid", "ddp-coordinator")  # every build makes these


def require_built(*names):
    """Fails (never skips) when the build did not make a binary the tests need."""
    for b in names or BUILT:
        assert os.access(os.path.join(BIN, b), os.X_OK), f"{b} is not built in {BIN}: the build should have made it"



# ddpctl's live stream: "[node:rank] text" (node with its port when --nodes gave one).
LINE = re.compile(r"^\[(?P<node>[^\]:]+(?::\d+)?):(?P<rank>\d+)\] (?P<text>.*)$")


def job_file(cluster, name, command, nproc=1, extra="", store="{port: 29500}"):
    """A job file in the cluster's folder: `command` on `nproc` workers per node, the store as
    `store` (port 29500), 3 s of stop grace, then `extra` (YAML lines)."""
    return cluster.write(f"{name}.yaml", f"name: {name}\nnproc_per_node: {nproc}\ncommand: {json.dumps(command)}\n"
                                         f"store: {store}\nstop: {{grace: 3s}}\n{extra}")


def finish(p, timeout=90):
    """(returncode, stdout, stderr) of a ddpctl run; past the timeout it is killed and the test fails."""
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        raise AssertionError(f"ddpctl did not finish within {timeout} s\nstdout:\n{out}\nstderr:\n{err}")
    return p.returncode, out, err


def tagged(text, tag):
    """{rank: (node, value)} from the lines "[node:rank] TAG {json}" that workers print."""
    by_rank = {}
    for line in text.splitlines():
        m = LINE.match(line)
        if m and m["text"].startswith(tag):
            by_rank[int(m["rank"])] = (m["node"], json.loads(m["text"][len(tag):]))
    return by_rank


def contracts(text):
    """{rank: (node, env)} from the CONTRACT lines the contract workers print."""
    return tagged(text, "CONTRACT ")


def wait_for_tagged(p, n, tag, timeout=60):
    """Reads ddpctl's stdout until n ranks printed their TAG line; returns {rank: (node, value)}.
    If they do not, ddpctl is killed and the test fails with what it printed."""
    seen, lines = {}, []
    deadline = time.time() + timeout
    os.set_blocking(p.stdout.fileno(), True)
    while len(seen) < n and time.time() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        lines.append(line)
        seen.update(tagged(line, tag))
    if len(seen) < n:
        p.kill()
        _, err = p.communicate(timeout=30)
        raise AssertionError(f"only {sorted(seen)} of {n} ranks printed {tag.strip()} within {timeout} s:\n"
                             f"{''.join(lines)}\n{err}")
    return seen


def wait_for_contracts(p, n, timeout=60):
    return wait_for_tagged(p, n, "CONTRACT ", timeout)


_HOLD_PORT = r'''
import socket, sys, time
s = socket.socket()
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen()
print("held", flush=True)
time.sleep(300)
'''


class Host:
    def __init__(self, cluster, index, name):
        self.cluster = cluster
        self.name = name
        self.ns = f"{cluster.tag}{name}"[:15]
        self.veth = f"v{cluster.tag}{index}"[:15]
        self.index = index

    @property
    def addr(self):
        return f"10.213.{self.cluster.subnet}.{10 + self.index}"

    @property
    def home(self):
        """This host's private home on the shared disk (its /root), or None."""
        return os.path.join(self.cluster.dir, "home", self.name) if self.cluster.homes else None

    def wrap(self, argv):
        """argv run on this host: its netns (with /etc/netns hosts), hostname, private /tmp (and home)."""
        home = f" && mount --bind {self.home} /root" if self.home else ""
        inner = f"hostname {self.name} && mount -t tmpfs tmpfs /tmp{home} && exec \"$@\""
        return ["ip", "netns", "exec", self.ns, "unshare", "--uts", "--mount", "--propagation", "private",
                "sh", "-c", inner, "sh", *argv]

    def popen(self, argv, **kw):
        p = subprocess.Popen(self.wrap(argv), start_new_session=True, **kw)
        self.cluster.procs.append(p)
        return p

    def run(self, argv, timeout=30, **kw):
        return subprocess.run(self.wrap(argv), capture_output=True, text=True, timeout=timeout, **kw)

    def hold_port(self, port):
        """A listener on this host's address and `port` (another job's store, say), until the
        cluster ends; returns once it listens."""
        p = self.popen(["/usr/bin/python3", "-c", _HOLD_PORT, self.addr, str(port)], stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "held", f"could not hold port {port} on {self.name}"
        return p

    def ns_pids(self):
        r = _run("ip", "netns", "pids", self.ns, check=False)
        return [int(x) for x in r.stdout.split()]


class Cluster:
    """Hosts n1..nN and 'ctl' (the launcher's). Use as a context manager."""

    def __init__(self, nodes=2, homes=False):
        self.tag = f"d{os.getpid() % 1000}{random.randrange(100)}"
        self.subnet = random.randrange(1, 254)
        self.bridge = f"b{self.tag}"[:15]
        self.hosts = [Host(self, i + 1, f"n{i + 1}") for i in range(nodes)]
        self.ctl = Host(self, 0, "ctl")
        self.homes = homes
        self.procs = []
        self.agents = {}
        self.sshd = {}
        # Shared files (token, job files, worker scripts, results): outside /tmp, which is private per host.
        self.dir = tempfile.mkdtemp(prefix="ddp-multinode-", dir="/var/tmp")
        os.chmod(self.dir, 0o755)
        # The binaries are "installed" in the shared folder: the build folder may sit under /tmp,
        # which every simulated host replaces with its own.
        self.bin = os.path.join(self.dir, "bin")
        os.makedirs(self.bin)
        require_built()
        for b in BUILT:
            shutil.copy2(os.path.join(BIN, b), self.bin)
        if homes:
            for h in [self.ctl] + self.hosts:
                os.makedirs(os.path.join(h.home, ".ssh"), mode=0o700)
        self.token = os.path.join(self.dir, "token")
        self._write_token(self.token, os.urandom(32).hex())
        self._made = []

    def _write_token(self, path, secret):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secret + "\n")

    def write_token(self, name, secret=None):
        path = os.path.join(self.dir, name)
        self._write_token(path, secret or os.urandom(32).hex())
        return path

    def __enter__(self):
        try:
            self._setup()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc):
        self.teardown()

    def _setup(self):
        # Another run (another test file, another developer) may hold this /24: take the next free one.
        for _ in range(50):
            if _run("ip", "route", "add", "blackhole", f"10.213.{self.subnet}.0/24", check=False).returncode == 0:
                break
            self.subnet = random.randrange(1, 254)
        else:
            raise RuntimeError("no free 10.213.X.0/24 for a simulated cluster")
        self._made.append(("route", f"10.213.{self.subnet}.0/24"))
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        self._made.append(("link", self.bridge))
        _run("ip", "link", "set", self.bridge, "up")
        hosts_file = "127.0.0.1 localhost\n" + "".join(f"{h.addr} {h.name}\n" for h in [self.ctl] + self.hosts)
        for h in [self.ctl] + self.hosts:
            _run("ip", "netns", "add", h.ns)
            self._made.append(("netns", h.ns))
            etc = f"/etc/netns/{h.ns}"
            os.makedirs(etc, exist_ok=True)
            self._made.append(("etc", etc))
            with open(os.path.join(etc, "hosts"), "w") as f:
                f.write(hosts_file)
            with open(os.path.join(etc, "hostname"), "w") as f:
                f.write(h.name + "\n")
            _run("ip", "link", "add", h.veth, "type", "veth", "peer", "name", "eth0", "netns", h.ns)
            self._made.append(("link", h.veth))
            _run("ip", "link", "set", h.veth, "master", self.bridge)
            _run("ip", "link", "set", h.veth, "up")
            _run("ip", "-n", h.ns, "addr", "add", f"{h.addr}/24", "dev", "eth0")
            _run("ip", "-n", h.ns, "link", "set", "eth0", "up")
            _run("ip", "-n", h.ns, "link", "set", "lo", "up")

    def teardown(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for kind, name in reversed(self._made):
            if kind == "netns":
                # Whatever still runs inside a namespace we made (a leaked worker) goes with it.
                for pid in _run("ip", "netns", "pids", name, check=False).stdout.split():
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                _run("ip", "netns", "del", name, check=False)
            elif kind == "link":
                _run("ip", "link", "del", name, check=False)
            elif kind == "route":
                _run("ip", "route", "del", "blackhole", name, check=False)
            elif kind == "etc":
                shutil.rmtree(name, ignore_errors=True)
        self._made.clear()
        shutil.rmtree(self.dir, ignore_errors=True)

    # ---- agents and the launcher ----

    def start_agent(self, host, token=None, extra=(), env=None, hide=()):
        """hide: folders covered by an empty tmpfs in this host's mount namespace (a node without
        some library)."""
        log = open(os.path.join(self.dir, f"agent-{host.name}.log"), "ab")
        prefix = ["env", *(f"{k}={v}" for k, v in env.items())] if env else []
        if hide:
            mounts = " && ".join(f"mount -t tmpfs tmpfs '{d}'" for d in hide)
            prefix = ["sh", "-c", f'{mounts} && exec "$@"', "sh", *prefix]
        p = host.popen([*prefix, os.path.join(self.bin, "ddp-agentd"), "--listen", f"{host.addr}:{AGENT_PORT}",
                        "--token-file", token or self.token, "--log-dir", "/tmp/ddp-logs",
                        "--heartbeat-timeout", "3", *extra],
                       stdout=log, stderr=subprocess.STDOUT)
        self.agents[host.name] = p
        self.wait_listening(host)
        return p

    def wait_listening(self, host, timeout=10, port=AGENT_PORT):
        deadline = time.time() + timeout
        while time.time() < deadline:
            r = _run("ip", "netns", "exec", host.ns, "ss", "-ltnH", f"sport = :{port}", check=False)
            if r.stdout.strip():
                return
            time.sleep(0.05)
        raise AssertionError(f"nothing listens on {host.name}:{port} after {timeout} s:\n" + self.agent_log(host))

    def agent_log(self, host):
        try:
            with open(os.path.join(self.dir, f"agent-{host.name}.log"), errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    # ---- sshd (homes=True) ----

    def ssh_setup(self):
        """The launcher's user key (in ctl's ~/.ssh), authorized on every host."""
        key = os.path.join(self.ctl.home, ".ssh", "id_ed25519")
        if not os.path.exists(key):
            _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "ddptest", "-f", key)
        pub = open(key + ".pub").read()
        for h in self.hosts:
            with open(os.path.join(h.home, ".ssh", "authorized_keys"), "w") as f:
                f.write(pub)

    def start_sshd(self, host, port=22, agent_on_path=True, sftp=True):
        """A key-only sshd on host:port. agent_on_path: ~/.ssh/environment puts the run's bin folder
        (our ddp-agentd) on the PATH of its sessions; else the node has no agent. sftp=False: no
        'Subsystem sftp' line, as hardened images ship."""
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation folder
        d = os.path.join(self.dir, f"sshd-{host.name}")
        os.makedirs(d, exist_ok=True)
        hostkey = os.path.join(d, "ssh_host_ed25519_key")
        if not os.path.exists(hostkey):
            _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", hostkey)
        conf = os.path.join(d, "sshd_config")
        with open(conf, "w") as f:
            f.write(f"Port {port}\nListenAddress {host.addr}\nHostKey {hostkey}\nPidFile none\n"
                    "PasswordAuthentication no\nKbdInteractiveAuthentication no\nPubkeyAuthentication yes\n"
                    "PermitRootLogin prohibit-password\nUsePAM no\nStrictModes no\nPermitUserEnvironment yes\n"
                    + ("Subsystem sftp internal-sftp\n" if sftp else "") + "LogLevel VERBOSE\n")
        env = os.path.join(host.home, ".ssh", "environment")
        if agent_on_path:
            with open(env, "w") as f:
                f.write(f"PATH={self.bin}:/usr/local/bin:/usr/bin:/bin\n")
        elif os.path.exists(env):
            os.unlink(env)
        log = open(os.path.join(self.dir, f"sshd-{host.name}.log"), "ab")
        p = host.popen(["/usr/sbin/sshd", "-D", "-e", "-f", conf], stdout=log, stderr=subprocess.STDOUT)
        self.sshd[host.name] = p
        self.wait_listening(host, port=port)
        return p

    def host_key(self, host):
        """(public key line, 'SHA256:...' fingerprint) of host's sshd."""
        pub = os.path.join(self.dir, f"sshd-{host.name}", "ssh_host_ed25519_key.pub")
        fp = _run("ssh-keygen", "-l", "-E", "sha256", "-f", pub).stdout.split()[1]
        return open(pub).read().split()[:2], fp

    def trust(self, hosts, ports=None):
        """ctl's known_hosts: the keys of these hosts' sshd, under the names --nodes uses."""
        with open(os.path.join(self.ctl.home, ".ssh", "known_hosts"), "w") as f:
            for h in hosts:
                (kind, b64), _ = self.host_key(h)
                port = (ports or {}).get(h.name, 22)
                name = h.name if port == 22 else f"[{h.name}]:{port}"
                f.write(f"{name} {kind} {b64}\n")

    def launch_ssh(self, job_file, *args, hosts=None):
        """ddpctl launch --ssh from the launcher's namespace, nodes by host name."""
        argv = [os.path.join(self.bin, "ddpctl"), "launch", "--ssh", "--nodes",
                ",".join(h.name for h in (hosts or self.hosts)), *args, job_file]
        return self.ctl.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=self.dir)

    def nodes_arg(self, hosts=None):
        return ",".join(h.addr for h in (hosts or self.hosts))

    def launch(self, job_file, *args, token=None, hosts=None):
        """Starts ddpctl launch in the launcher's namespace; returns the Popen (text pipes)."""
        argv = [os.path.join(self.bin, "ddpctl"), "launch", "--nodes", self.nodes_arg(hosts),
                "--token-file", token or self.token, *args, job_file]
        return self.ctl.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=self.dir)

    def write(self, name, text):
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, 0o755)
        return path


# ---- what an eavesdropper on a host's link sees (TLS tests) ----

# Records every frame on eth0 until the stop file appears (bounded), as a node-side tap would.
SNIFFER = r'''
import os, socket, sys, time
out, stop = sys.argv[1], sys.argv[2]
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
s.bind(("eth0", 0))
s.settimeout(0.2)
open(out + ".ready", "w").close()
deadline = time.time() + 120
with open(out, "wb") as f:
    while not os.path.exists(stop) and time.time() < deadline:
        try:
            f.write(s.recv(65535))
        except socket.timeout:
            pass
'''


def captured(c, host, run):
    """Runs run() while host's eth0 is captured; returns (run's result, the captured bytes)."""
    out = os.path.join(c.dir, f"capture-{host.name}-{time.monotonic_ns()}")
    stop = out + ".stop"
    sniffer = c.write("sniffer.py", SNIFFER)
    p = subprocess.Popen(["ip", "netns", "exec", host.ns, "/usr/bin/python3", sniffer, out, stop])
    c.procs.append(p)
    deadline = time.time() + 20
    while not os.path.exists(out + ".ready") and time.time() < deadline:
        time.sleep(0.05)
    assert os.path.exists(out + ".ready"), "the capture did not start"
    try:
        result = run()
    finally:
        open(stop, "w").close()
        p.wait(timeout=30)
    with open(out, "rb") as f:
        return result, f.read()
