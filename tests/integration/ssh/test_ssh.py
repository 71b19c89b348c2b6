"""SSH mode (issue 6): ddpctl launch --ssh across simulated hosts, each running a key-only sshd
with a private home and /tmp (simcluster.py, homes=True); the launcher's namespace drops every
inbound connection, as a laptop behind NAT would. No ddp-agentd daemon and no token file: ddpctl
logs in, starts `ddp-agentd --oneshot --stdio` and speaks the protocol inside the SSH channel.

Every wait is bounded; the cluster fixture tears down what it made (pids, namespaces).

Time budget: 2 minutes for the whole file on 2 cores (measured 89-107 s with other builds
running); the upload without SFTP (a node whose sshd has no `Subsystem sftp`, issue 26) is one
of its tests.
"""
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "multinode"))
import simcluster  # noqa: E402
from simcluster import captured, contracts, finish, wait_for_contracts  # noqa: E402

SKIP = simcluster.netns_unavailable()
if SKIP is None and not os.access("/usr/sbin/sshd", os.X_OK):
    SKIP = "sshd is not installed (Debian: openssh-server)"
pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")

PY = "/usr/bin/python3"

WORKER = r'''
import json, os, socket, sys, time
keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "MASTER_ADDR",
        "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE", "GLOO_SOCKET_IFNAME", "DDP_NODE"]
env = {k: os.environ.get(k) for k in keys}
env["hostname"] = socket.gethostname()
env["pid"] = os.getpid()
env["ppid"] = os.getppid()
print("CONTRACT " + json.dumps(env), flush=True)
if sys.argv[1:] == ["store"]:
    # The store on node rank 0's agent, reached over the nodes' own network.
    from torch.distributed import TCPStore
    import datetime
    s = TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False, timeout=datetime.timedelta(seconds=30))
    s.set("rank" + env["RANK"], env["hostname"])
    s.wait(["rank" + str(r) for r in range(int(env["WORLD_SIZE"]))])
    print("STORE ok", flush=True)
elif sys.argv[1:] == ["sleep"]:
    time.sleep(120)
'''

NAT_RULES = """table inet ddptest {
  chain input {
    type filter hook input priority 0; policy accept;
    iifname "lo" accept
    ct state established,related accept
    counter drop
  }
}
"""


@pytest.fixture
def cluster():
    with simcluster.Cluster(nodes=3, homes=True) as c:
        c.ssh_setup()
        yield c


def behind_nat(c):
    """The launcher's namespace refuses every inbound connection; returns a reader of the drop counter."""
    subprocess.run(["ip", "netns", "exec", c.ctl.ns, "nft", "-f", "-"], input=NAT_RULES, text=True, check=True,
                   capture_output=True, timeout=30)

    def dropped():
        r = subprocess.run(["ip", "netns", "exec", c.ctl.ns, "nft", "list", "table", "inet", "ddptest"],
                           capture_output=True, text=True, check=True, timeout=30)
        return int(re.search(r"counter packets (\d+)", r.stdout).group(1))
    return dropped


def job(c, name, command, nproc=1, extra=""):
    return simcluster.job_file(c, name, command, nproc, "logs: {dir: /tmp/ddp-logs}\n" + extra)


def leftovers(c, host):
    """Processes in host's namespace other than its sshd listener."""
    return [pid for pid in host.ns_pids() if pid != c.sshd[host.name].pid]


def wait_nothing_left(c, hosts, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        left = {h.name: leftovers(c, h) for h in hosts}
        if not any(left.values()):
            return {}
        time.sleep(0.1)
    return {name: [(pid, _cmdline(pid)) for pid in pids] for name, pids in left.items() if pids}


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def test_three_nodes_over_ssh_from_behind_nat_with_an_upload(cluster):
    c = cluster
    n1, n2, n3 = c.hosts
    # n1 and n2 have our ddp-agentd on their PATH; n3 has none, and its sshd listens on 2222,
    # which only the launcher's ~/.ssh/config says.
    c.start_sshd(n1)
    c.start_sshd(n2)
    c.start_sshd(n3, port=2222, agent_on_path=False)
    with open(os.path.join(c.ctl.home, ".ssh", "config"), "w") as f:
        f.write("Host n3\n  Port 2222\n  User root\n")
    c.trust(c.hosts, ports={"n3": 2222})
    dropped = behind_nat(c)
    worker = c.write("worker.py", WORKER)

    rc, out, err = finish(c.launch_ssh(job(c, "ssh3", [PY, worker, "store"], nproc=2), "--result-json",
                                       os.path.join(c.dir, "r.json")), timeout=120)
    assert rc == 0, out + err
    by_rank = contracts(out)
    assert sorted(by_rank) == list(range(6)), out + err
    for rank, (node, env) in by_rank.items():
        host = c.hosts[rank // 2]
        assert node == host.name
        assert env["hostname"] == host.name
        assert env["RANK"] == str(rank) and env["LOCAL_RANK"] == str(rank % 2)
        assert env["WORLD_SIZE"] == "6" and env["LOCAL_WORLD_SIZE"] == "2"
        assert env["GROUP_RANK"] == str(rank // 2) and env["GROUP_WORLD_SIZE"] == "3"
        # MASTER_ADDR is n1's address on the nodes' network, as n1's sshd saw itself reached.
        assert env["MASTER_ADDR"] == n1.addr and env["MASTER_PORT"] == "29500"
        assert env["GLOO_SOCKET_IFNAME"] == "eth0"
    assert out.count("STORE ok") == 6, out
    assert json.load(open(os.path.join(c.dir, "r.json")))["status"] == "succeeded"
    assert dropped() == 0, "something tried to connect to the launcher"

    # n3 got our agent in its own cache, by hash, 0700; n1 and n2 used theirs.
    sha = hashlib.sha256(open(os.path.join(c.bin, "ddp-agentd"), "rb").read()).hexdigest()
    cached = os.path.join(n3.home, ".cache", "ddpctl", sha, "ddp-agentd")
    assert os.path.exists(cached), err
    assert hashlib.sha256(open(cached, "rb").read()).hexdigest() == sha
    assert os.stat(cached).st_mode & 0o777 == 0o700
    assert os.stat(os.path.dirname(cached)).st_mode & 0o777 == 0o700
    assert "n3: no ddp-agentd on its PATH; uploading ours" in err, err
    for h in (n1, n2):
        assert not os.path.exists(os.path.join(h.home, ".cache", "ddpctl", sha))
    assert wait_nothing_left(c, c.hosts) == {}

    # A second run finds the cached copy and uploads nothing.
    inode = os.stat(cached).st_ino
    rc, out, err = finish(c.launch_ssh(job(c, "again", [PY, worker]), "--nproc-per-node", "1"), timeout=90)
    assert rc == 0, out + err
    assert sorted(contracts(out)) == [0, 1, 2]
    assert "uploading" not in err and os.stat(cached).st_ino == inode
    assert dropped() == 0


def test_user_at_host_in_nodes_wins_over_the_ssh_config(cluster):
    c = cluster
    n1, n2, _ = c.hosts
    c.start_sshd(n1)
    c.start_sshd(n2)
    # The config names a user that exists nowhere; "root@" in --nodes must win, as with `ssh root@n1`.
    with open(os.path.join(c.ctl.home, ".ssh", "config"), "w") as f:
        f.write("Host n1 n2\n  User nosuchuser\n")
    c.trust([n1, n2])
    worker = c.write("worker.py", WORKER)
    argv = [os.path.join(c.bin, "ddpctl"), "launch", "--ssh", "--nodes", "root@n1,root@n2",
            job(c, "as-root", [PY, worker])]
    rc, out, err = finish(c.ctl.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=c.dir))
    assert rc == 0, out + err
    by_rank = contracts(out)
    # Nodes are named by host, whoever logs in.
    assert {r: node for r, (node, _) in by_rank.items()} == {0: "n1", 1: "n2"}, out
    assert wait_nothing_left(c, [n1, n2]) == {}

    # Without it, the config's user is tried and refused, and the launch says which node.
    argv[argv.index("root@n1,root@n2")] = "n1,root@n2"
    rc, out, err = finish(c.ctl.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=c.dir))
    assert rc == 2, out + err
    assert "n1" in err and "nosuchuser" in err, err
    assert wait_nothing_left(c, [n1, n2]) == {}


def test_kill_9_of_ddpctl_leaves_nothing_on_any_node(cluster):
    c = cluster
    hosts = c.hosts[:2]
    for h in hosts:
        c.start_sshd(h)
    c.trust(hosts)
    behind_nat(c)
    worker = c.write("worker.py", WORKER)
    p = c.launch_ssh(job(c, "kill9", [PY, worker, "sleep"], nproc=2), hosts=hosts)
    seen = wait_for_contracts(p, 4)
    agents = {env["ppid"] for _, env in seen.values()}
    assert len(agents) == 2, "each node's workers have its one-shot agent as parent"
    os.kill(p.pid, signal.SIGKILL)
    p.wait(timeout=30)
    # The SSH connection dies with ddpctl: each agent reads EOF on stdin, stops its workers
    # (SIGTERM; they exit at once) and exits; sshd's session processes end with the connection.
    assert wait_nothing_left(c, hosts, timeout=20) == {}


def test_unknown_host_key_is_refused_with_its_fingerprint_then_accepted_on_request(cluster):
    c = cluster
    n1 = c.hosts[0]
    c.start_sshd(n1)
    worker = c.write("worker.py", WORKER)
    jf = job(c, "hostkey", [PY, worker])
    _, fingerprint = c.host_key(n1)

    rc, out, err = finish(c.launch_ssh(jf, hosts=[n1]), timeout=60)
    assert rc == 2, err
    assert f"n1: unknown host key ssh-ed25519 {fingerprint}" in err, err
    assert "--ssh-accept-new" in err and "ssh-keyscan n1" in err, err
    assert "CONTRACT" not in out
    assert wait_nothing_left(c, [n1]) == {}

    rc, out, err = finish(c.launch_ssh(jf, "--ssh-accept-new", hosts=[n1]), timeout=60)
    assert rc == 0, err
    assert sorted(contracts(out)) == [0]
    known = open(os.path.join(c.ctl.home, ".ssh", "known_hosts")).read()
    assert (c.host_key(n1)[0][1]) in known

    # Another key for n1 than the one now known: refused, --ssh-accept-new or not.
    with open(os.path.join(c.ctl.home, ".ssh", "known_hosts"), "w") as f:
        other = os.path.join(c.dir, "other_key")
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", other], check=True, timeout=30)
        f.write("n1 " + " ".join(open(other + ".pub").read().split()[:2]) + "\n")
    rc, out, err = finish(c.launch_ssh(jf, "--ssh-accept-new", hosts=[n1]), timeout=60)
    assert rc == 2, err
    assert f"n1: HOST KEY CHANGED: it now offers ssh-ed25519 {fingerprint}" in err and "ssh-keygen -f" in err, err
    assert "CONTRACT" not in out


def test_host_that_never_speaks_ssh_times_out_and_the_started_node_is_stopped(cluster):
    c = cluster
    n1, n2 = c.hosts[:2]
    c.start_sshd(n1)
    c.trust([n1])
    # n2 accepts TCP on port 22 and never says a word.
    silent = n2.popen([PY, "-c", "import socket, time\n"
                       f"s = socket.create_server(('{n2.addr}', 22))\n"
                       "conns = []\n"
                       "while True: conns.append(s.accept())\n"])
    c.sshd[n2.name] = silent
    c.wait_listening(n2, port=22)
    worker = c.write("worker.py", WORKER)
    started = time.monotonic()
    rc, out, err = finish(c.launch_ssh(job(c, "silent", [PY, worker, "sleep"]), "--ssh-timeout", "3",
                                       hosts=[n1, n2]), timeout=60)
    took = time.monotonic() - started
    assert rc == 2, err
    assert "n2 (ssh): no SSH answer within 3000 ms" in err, err
    assert "stopping the nodes that did start" in err, err
    assert took < 40, f"took {took:.0f} s"
    assert "CONTRACT" not in out
    assert wait_nothing_left(c, [n1]) == {}


def test_host_without_sshd_is_refused_with_what_to_check(cluster):
    c = cluster
    n1, n2 = c.hosts[:2]
    c.start_sshd(n1)
    c.trust([n1])
    # Nothing listens on n2's port 22: the connection is refused, at once.
    worker = c.write("worker.py", WORKER)
    rc, out, err = finish(c.launch_ssh(job(c, "nosshd", [PY, worker, "sleep"]), hosts=[n1, n2]), timeout=60)
    assert rc == 2, err
    assert "n2 (ssh): cannot log in:" in err and "Connection refused" in err, err
    assert "no sshd listening on n2? check that `ssh n2` works" in err, err
    assert "CONTRACT" not in out
    assert wait_nothing_left(c, [n1]) == {}


def test_proxyjump_from_ssh_config_reaches_a_node_the_launcher_cannot(cluster):
    c = cluster
    n1, n2 = c.hosts[:2]
    for h in (n1, n2):
        c.start_sshd(h)
    c.trust([n1, n2])
    with open(os.path.join(c.ctl.home, ".ssh", "config"), "w") as f:
        f.write("Host n2\n  ProxyJump n1\n")
    # The launcher cannot reach n2 itself: only through n1 (libssh runs `ssh -W` for ProxyJump).
    rules = f"table inet ddpjump {{\n chain out {{\n  type filter hook output priority 0; policy accept;\n" \
            f"  ip daddr {n2.addr} counter drop\n }}\n}}\n"
    subprocess.run(["ip", "netns", "exec", c.ctl.ns, "nft", "-f", "-"], input=rules, text=True, check=True,
                   capture_output=True, timeout=30)
    worker = c.write("worker.py", WORKER)
    rc, out, err = finish(c.launch_ssh(job(c, "jump", [PY, worker, "store"]), hosts=[n1, n2]), timeout=90)
    assert rc == 0, out + err
    by_rank = contracts(out)
    assert by_rank[1][1]["hostname"] == "n2"
    # n2's address is the one its sshd was reached at through the jump (its $SSH_CONNECTION),
    # which the store's allow-list on n1 accepted.
    assert all(env["MASTER_ADDR"] == n1.addr for _, env in by_rank.values())
    assert out.count("STORE ok") == 2, out
    assert wait_nothing_left(c, [n1, n2]) == {}


def test_agent_that_cannot_start_fails_the_launch_naming_its_node(cluster):
    c = cluster
    n1, n2 = c.hosts[:2]
    c.start_sshd(n1)
    c.start_sshd(n2)
    c.trust([n1, n2])
    # n2's PATH has a ddp-agentd of our version that dies at once (as a binary missing a library would).
    fake = os.path.join(c.dir, "fakebin")
    os.makedirs(fake)
    with open(os.path.join(fake, "ddp-agentd"), "w") as f:
        f.write("#!/bin/sh\n[ \"$1\" = --version ] && { echo 'ddp-agentd 0.1.0'; exit 0; }\n"
                "echo 'ddp-agentd: error while loading shared libraries: libfake.so.1' >&2\nexit 127\n")
    os.chmod(os.path.join(fake, "ddp-agentd"), 0o755)
    with open(os.path.join(n2.home, ".ssh", "environment"), "w") as f:
        f.write(f"PATH={fake}:/usr/bin:/bin\n")
    worker = c.write("worker.py", WORKER)
    rc, out, err = finish(c.launch_ssh(job(c, "broken", [PY, worker, "sleep"]), hosts=[n1, n2]), timeout=60)
    assert rc == 2, err
    assert "n2| ddp-agentd: error while loading shared libraries: libfake.so.1" in err, err
    assert "n2 (ssh): the agent ended before joining" in err, err
    assert "CONTRACT" not in out
    assert wait_nothing_left(c, [n1, n2]) == {}


DROPPING_PROXY = r'''
import socket, sys, threading
# Closes the first DROP connections at once, as sshd does past MaxStartups, then forwards to sshd.
listen, target, drop = sys.argv[1], sys.argv[2], int(sys.argv[3])
srv = socket.create_server((listen, 2200))
def pipe(a, b):
    try:
        while (data := a.recv(65536)):
            b.sendall(data)
    except OSError:
        pass
    finally:
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
seen = 0
while True:
    c, _ = srv.accept()
    seen += 1
    if seen <= drop:
        print(f"dropped connection {seen}", flush=True)
        c.close()
        continue
    up = socket.create_connection((target, 22))
    threading.Thread(target=pipe, args=(c, up), daemon=True).start()
    threading.Thread(target=pipe, args=(up, c), daemon=True).start()
'''


def test_connections_dropped_before_login_are_retried_and_said_so(cluster):
    c = cluster
    n1 = c.hosts[0]
    c.start_sshd(n1)
    c.trust([n1], ports={"n1": 2200})
    proxy = n1.popen([PY, "-c", DROPPING_PROXY, n1.addr, n1.addr, "2"], stdout=subprocess.PIPE, text=True)
    c.sshd["proxy"] = proxy
    c.wait_listening(n1, port=2200)
    worker = c.write("worker.py", WORKER)
    jf = job(c, "retry", [PY, worker])
    argv = [os.path.join(c.bin, "ddpctl"), "launch", "--ssh", "--nodes", "n1:2200", jf]
    rc, out, err = finish(c.ctl.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=c.dir),
                          timeout=60)
    assert rc == 0, err
    assert sorted(contracts(out)) == [0]
    retries = re.findall(r"n1 \(ssh n1:2200\): connection dropped before login .*; retrying in \d+ ms \(attempt (\d)",
                         err)
    assert retries == ["2", "3"], err


def test_launcher_link_down_stops_every_node_by_heartbeat(cluster):
    c = cluster
    hosts = c.hosts[:2]
    for h in hosts:
        c.start_sshd(h)
    c.trust(hosts)
    worker = c.write("worker.py", WORKER)
    p = c.launch_ssh(job(c, "linkdown", [PY, worker, "sleep"], nproc=2), hosts=hosts)
    wait_for_contracts(p, 4)
    # No FIN and no EOF reach the nodes: only the agents' heartbeat timeout (6 s) can tell.
    subprocess.run(["ip", "link", "set", c.ctl.veth, "down"], check=True, timeout=30)
    deadline = time.time() + 30
    left = {}
    while time.time() < deadline:
        # sshd's session processes wait for TCP to give up; everything of ours must be gone.
        left = {h.name: [(pid, _cmdline(pid)) for pid in leftovers(c, h) if not _cmdline(pid).startswith("sshd")]
                for h in hosts}
        if not any(left.values()):
            break
        time.sleep(0.2)
    assert not any(left.values()), left


def launch_ssh_debug(c, job_file, *args, hosts):
    """launch_ssh with ddpctl's debug log (where it says how each agent reached it)."""
    argv = ["env", "DDP_LOG_LEVEL=debug", os.path.join(c.bin, "ddpctl"), "launch", "--ssh", "--nodes",
            ",".join(h.name for h in hosts), *args, job_file]
    return c.ctl.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=c.dir)


def test_advertise_addr_makes_the_agents_connect_back_over_tcp(cluster):
    c = cluster
    hosts = c.hosts[:2]
    for h in hosts:
        c.start_sshd(h)
    c.trust(hosts)
    worker = c.write("worker.py", WORKER)
    # Given: this address and port. Found: the launcher's address on its route to each node, any port.
    for advertise, port in ((f"{c.ctl.addr}:29555", "29555"), ("auto", None)):
        rc, out, err = finish(launch_ssh_debug(c, job(c, "back", [PY, worker, "store"], nproc=2), "--advertise-addr",
                                               advertise, hosts=hosts), timeout=120)
        assert rc == 0, out + err
        assert sorted(contracts(out)) == [0, 1, 2, 3] and out.count("STORE ok") == 4, out + err
        for h in hosts:
            assert f"{h.name}: its agent connected back from {h.addr}" in err, err
            started = re.search(rf"--oneshot --stdio --name {h.name} --connect {re.escape(c.ctl.addr)}:(\d+)", err)
            assert started, err
            if port:
                assert started.group(1) == port
        assert wait_nothing_left(c, hosts) == {}


def test_advertise_addr_with_tls_hides_the_connect_back_link(cluster):
    """--advertise-addr puts the job on a TCP link outside SSH; --tls encrypts it (the agent tells the
    ClientHello from a hello, as on its port). Captured on n1's interface: the marker (in the
    command line and the output) crosses in clear without --tls, the control; nowhere with it."""
    c = cluster
    n1 = c.hosts[0]
    c.start_sshd(n1)
    c.trust([n1])
    worker = c.write("worker-echo.py", "import sys\nprint('ECHO ' + sys.argv[1], flush=True)\n")
    marker = "marker-" + os.urandom(8).hex()
    spec = job(c, "backtls", [PY, worker, marker])
    advertise = f"{c.ctl.addr}:29556"
    (rc, out, err), wire = captured(c, n1, lambda: finish(c.launch_ssh(spec, "--advertise-addr", advertise, hosts=[n1]),
                                                          timeout=120))
    assert rc == 0, out + err
    assert marker.encode() in wire, "the capture saw no plaintext job: it would prove nothing below"
    (rc, out, err), wire = captured(c, n1, lambda: finish(c.launch_ssh(spec, "--advertise-addr", advertise, "--tls",
                                                                       hosts=[n1]), timeout=120))
    assert rc == 0, out + err
    assert f"ECHO {marker}" in out, out + err
    assert len(wire) > 2000, "nothing captured"
    assert marker.encode() not in wire
    # Without --advertise-addr the link is the SSH channel: --tls is refused as pointless.
    rc, out, err = finish(c.launch_ssh(spec, "--tls", hosts=[n1]), timeout=60)
    assert rc == 2 and "SSH already encrypts" in err, err


def test_advertise_addr_behind_nat_fails_naming_the_node_and_leaves_nothing(cluster):
    c = cluster
    hosts = c.hosts[:2]
    for h in hosts:
        c.start_sshd(h)
    c.trust(hosts)
    dropped = behind_nat(c)
    worker = c.write("worker.py", WORKER)
    started = time.time()
    rc, out, err = finish(c.launch_ssh(job(c, "nat", [PY, worker]), "--advertise-addr", "auto", hosts=hosts), timeout=90)
    assert rc == 2, out + err
    assert re.search(r"n[12] \(ssh\): .*connect(ing)? back to 10\.213\.\d+\.10:\d+", err), err
    assert time.time() - started < 60
    assert dropped() > 0
    assert wait_nothing_left(c, hosts) == {}


def test_node_without_sftp_gets_the_agent_through_an_exec_channel(cluster):
    """Issue 26: a hardened sshd without 'Subsystem sftp' still gets our agent (before: the launch
    failed with 'SFTP is not available'), checked by its hash as an SFTP upload is."""
    c = cluster
    n1, n2 = c.hosts[:2]
    c.start_sshd(n1)
    c.start_sshd(n2, agent_on_path=False, sftp=False)
    c.trust([n1, n2])
    worker = c.write("worker.py", WORKER)
    rc, out, err = finish(c.launch_ssh(job(c, "nosftp", [PY, worker]), hosts=[n1, n2]), timeout=120)
    assert rc == 0, out + err
    assert sorted(contracts(out)) == [0, 1], out + err
    assert "n2: its sshd has no SFTP subsystem; sent the agent through a plain exec channel" in err, err
    sha = hashlib.sha256(open(os.path.join(c.bin, "ddp-agentd"), "rb").read()).hexdigest()
    cached = os.path.join(n2.home, ".cache", "ddpctl", sha, "ddp-agentd")
    assert hashlib.sha256(open(cached, "rb").read()).hexdigest() == sha
    assert os.stat(cached).st_mode & 0o777 == 0o700
    assert not os.path.exists(os.path.join(n2.home, ".cache", "ddpctl", sha, ".ddp-agentd.part"))
    assert wait_nothing_left(c, [n1, n2]) == {}
