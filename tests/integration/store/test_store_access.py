"""The store belongs to the job: totals that stop a client filling it (while others are served),
and, from this host, only the job's user and root, over loopback and over the host's own address.

`ddpctl store serve` is the store a launch embeds; its job user is its own. PyTorch 1.13's
TCPStore client is the client; clients of other uids run through setpriv, and the test of the
host's own address runs in a network namespace this test makes (an interface with an
address of a test-private /24 on a veth pair inside it), so nothing here connects out of it.
"""
import datetime
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest
import torch.distributed as dist

from conftest import DDPCTL, StoreProcess

T = datetime.timedelta
NOBODY = 65534
OTHER = 4242  # a uid with no account: only the kernel's number matters

# A PyTorch client as a process of its own (so it can run as another uid, in a namespace):
# SET then GET; prints SERVED, or the error it got.
CLIENT = textwrap.dedent("""
    import datetime, sys
    import torch.distributed as dist
    try:
        s = dist.TCPStore(sys.argv[1], int(sys.argv[2]), None, False, timeout=datetime.timedelta(seconds=10))
        s.set("who", sys.argv[3])
        assert s.get("who") == sys.argv[3].encode()
    except Exception as e:
        print("ERROR", type(e).__name__, e)
        sys.exit(3)
    print("SERVED")
""")


def need_root():
    if os.geteuid() != 0:
        pytest.skip("needs root to run clients as other uids")
    if not shutil.which("setpriv"):
        pytest.skip("setpriv not found (util-linux)")


def as_user(uid, netns=None):
    cmd = ["ip", "netns", "exec", netns] if netns else []
    if uid != 0:
        cmd += ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
    return cmd


def run_client(host, port, uid, netns=None):
    r = subprocess.run(as_user(uid, netns) + [sys.executable, "-c", CLIENT, host, str(port), f"uid{uid}"],
                       capture_output=True, text=True, timeout=120, env=dict(os.environ, HOME="/tmp"))
    out = r.stdout + r.stderr
    if "SERVED" in r.stdout:
        return "served"
    assert "ERROR" in r.stdout, f"the client failed to run at all:\n{out}"
    return "refused"


def client(store, timeout=10):
    return dist.TCPStore(store.host, store.port, None, False, timeout=T(seconds=timeout))


# ---------------------------------------------------------------------------------------------
# Totals

def test_a_client_storing_past_the_total_is_closed_and_others_are_served(tmp_path):
    s = StoreProcess(tmp_path, "--threads", "2", "--max-size", str(1 << 20))
    try:
        good, greedy = client(s), client(s)
        good.set("/small", "x")
        err = None
        try:
            for i in range(40):  # 40 x 100 KiB: past 1 MiB at the 11th
                greedy.set(f"/big{i}", "x" * (100 << 10))
            greedy.get("/big0")
        except RuntimeError as e:
            err = e
        assert err is not None, "the store took 4 MiB past its total of 1 MiB"
        log = s.wait_for_log("store full")
        line = next(l for l in log.splitlines() if "store full" in l)
        assert "127.0.0.1:" in line and "store.max_size" in line and "1048576" in line, line
        # The store kept serving everyone else, and has room for small writes still.
        assert good.get("/small") == b"x"
        good.set("/after", "y")
        assert client(s).get("/after") == b"y"
        assert s.alive()
    finally:
        assert s.stop() == 0


def test_a_client_making_too_many_keys_is_closed(tmp_path):
    s = StoreProcess(tmp_path, "--threads", "0", "--max-keys", "50")
    try:
        c = client(s)
        with pytest.raises(RuntimeError):
            for i in range(100):
                c.set(f"/k{i}", "v")
            c.get("/k0")
        log = s.wait_for_log("store full")
        assert "store.max_keys" in log and "51 keys" in log
        assert client(s).get("/k0") == b"v"
    finally:
        assert s.stop() == 0


# ---------------------------------------------------------------------------------------------
# From this host: the job's user and root only

def test_another_uid_is_refused_over_loopback(tmp_path):
    need_root()
    s = StoreProcess(tmp_path, "--threads", "2")  # runs as root: its job user is root
    try:
        assert run_client(s.host, s.port, NOBODY) == "refused"
        log = s.wait_for_log("refused a store connection from 127.0.0.1:")
        assert "belongs to uid 65534" in log
        assert run_client(s.host, s.port, 0) == "served"
        assert s.alive()
    finally:
        assert s.stop() == 0


@pytest.fixture
def netns():
    """A network namespace with loopback and an interface holding this host's address."""
    need_root()
    if not shutil.which("ip"):
        pytest.skip("ip not found (iproute2)")
    name = f"ddpstore{os.getpid() % 100000}"
    addr = f"10.214.{random.randint(1, 254)}.1"
    r = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"ip netns add is not permitted here: {r.stderr.strip()}")
    try:
        # A veth pair with both ends inside (no dummy module everywhere; simcluster uses veth).
        for cmd in (["ip", "link", "set", "lo", "up"], ["ip", "link", "add", "v0", "type", "veth", "peer", "name", "v1"],
                    ["ip", "addr", "add", f"{addr}/24", "dev", "v0"], ["ip", "link", "set", "v1", "up"],
                    ["ip", "link", "set", "v0", "up"]):
            subprocess.run(["ip", "netns", "exec", name] + cmd, check=True, capture_output=True, text=True, timeout=30)
        yield name, addr
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def test_another_uid_is_refused_over_the_hosts_own_address(netns, tmp_path):
    """As on node rank 0: its workers reach the store at the node's own address, which is on the
    allow-list as one of the job's nodes. The store here runs as nobody (its job user)."""
    name, addr = netns
    log_path = tmp_path / "store.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(as_user(NOBODY, name) + [str(DDPCTL), "store", "serve", "--listen", "0.0.0.0:0",
                                                         "--allow", addr, "--threads", "2"],
                                stdout=subprocess.PIPE, stderr=log, text=True, env=dict(os.environ, DDP_LOG_LEVEL="debug"))
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith("listening on 0.0.0.0:"), f"unexpected {line!r}:\n{log_path.read_text()}"
        port = int(line.rsplit(":", 1)[1])
        assert run_client(addr, port, OTHER, name) == "refused"
        assert run_client("127.0.0.1", port, OTHER, name) == "refused"
        assert run_client(addr, port, NOBODY, name) == "served"   # the job's user
        assert run_client(addr, port, 0, name) == "served"        # root
        assert run_client("127.0.0.1", port, NOBODY, name) == "served"
        text = log_path.read_text()
        assert f"refused a store connection from {addr}:" in text and "belongs to uid 4242" in text, text
        assert "refused a store connection from 127.0.0.1:" in text, text
        assert proc.poll() is None, text
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_signals_are_handled_from_the_listening_line_on(tmp_path):
    # With I/O threads the store serves clients as soon as it listens; a SIGUSR1 (the wait
    # report) or SIGTERM sent right after the "listening on" line must reach its handlers, not
    # kill it with the default action (which reset every client's connection: PyTorch 1.13's
    # clients then abort their process). Twenty starts, because the old window was short.
    for attempt in range(20):
        log = tmp_path / f"store.{attempt}.log"
        with open(log, "w") as err:
            p = subprocess.Popen([str(DDPCTL), "store", "serve", "--listen", "127.0.0.1:0", "--threads", "2"],
                                 stdout=subprocess.PIPE, stderr=err, text=True)
            assert p.stdout.readline().startswith("listening on 127.0.0.1:")
            p.send_signal(signal.SIGUSR1)
            p.send_signal(signal.SIGTERM)
            assert p.wait(timeout=10) == 0, f"start {attempt}: the store died of a signal it handles:\n{log.read_text()}"
        assert "store stopping on signal 15" in log.read_text()
