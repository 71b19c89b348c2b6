"""Shared helpers for integration tests: where the binaries are, writing job files, running
ddpctl, and checking that processes are really gone."""
import os
import re
import socket
import subprocess
import time
from pathlib import Path

BINARY_DIR = Path(os.environ.get("DDP_BINARY_DIR", Path(__file__).resolve().parents[2] / "build"))
SOURCE_DIR = Path(os.environ.get("DDP_SOURCE_DIR", Path(__file__).resolve().parents[2]))
DDPCTL = str(BINARY_DIR / "bin" / "ddpctl")
PYTHON = "/usr/bin/python3"  # Debian's, with torch; the first python3 on PATH may lack it

# Ended jobs leave records under $XDG_STATE_HOME (lib/control/paths.hpp): the tests' go to a
# folder of their own (in /var/tmp, which simulated hosts share), not to the user's home.
if "XDG_STATE_HOME" not in os.environ:
    import atexit
    import shutil
    import tempfile
    os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="ddp-test-state-", dir="/var/tmp")
    atexit.register(shutil.rmtree, os.environ["XDG_STATE_HOME"], True)
# ddpctl's cache of probed interpreters (lib/pyenv) likewise.
if "XDG_CACHE_HOME" not in os.environ:
    import atexit
    import shutil
    import tempfile
    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="ddp-test-cache-", dir="/var/tmp")
    atexit.register(shutil.rmtree, os.environ["XDG_CACHE_HOME"], True)


def cmake_cache(name: str) -> str:
    """The value the build's CMakeCache.txt holds for `name`, or "" (no cache, or no such entry)."""
    cache = BINARY_DIR / "CMakeCache.txt"
    m = re.search(rf"^{re.escape(name)}:[A-Z]+=(.*)$", cache.read_text(), re.M) if cache.exists() else None
    return m.group(1) if m else ""


def torch_examples_built() -> bool:
    """Whether the build was configured to make the libtorch examples (DDP_WITH_TORCH, on by default):
    then a missing example binary is a failure, not a reason to skip."""
    return cmake_cache("DDP_WITH_TORCH") == "ON"


def venv(tmp: Path, name: str, system_site: bool) -> Path:
    """A virtualenv of Debian's Python in tmp/name, without pip; `system_site`: it sees Debian's
    torch (python3-torch), else it has none."""
    d = tmp / name
    args = [PYTHON, "-m", "venv", "--without-pip", str(d)]
    if system_site:
        args.insert(4, "--system-site-packages")
    subprocess.run(args, check=True, timeout=120)
    return d


# The name an attempt's guardian gives itself: a fork of ddpctl (or of an agent's shepherd), so
# its command line is its launcher's; tests that look for the launcher by command line skip it.
GUARDIAN_COMM = "ddp-guardian"


def proc_argv(pid: int) -> list:
    """The process's command line as words ([] once it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [w.decode(errors="replace") for w in f.read().split(b"\0")[:-1]]
    except OSError:
        return []


def proc_comm(pid: int) -> str:
    """The process's name (/proc/PID/comm; "" once it is gone)."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def write_job(tmp: Path, text: str, name="job.yaml") -> Path:
    p = tmp / name
    p.write_text(text)
    return p


def launch(job: Path, *args, env=None, timeout=120, cwd=None):
    """Runs `ddpctl launch` to the end; returns CompletedProcess (stdout, stderr as text)."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([DDPCTL, "launch", str(job), "--master-port", "0", *args], cwd=cwd or job.parent,
                          env=full_env, capture_output=True, text=True, timeout=timeout)


def start_launch(job: Path, *args, env=None, cwd=None):
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.Popen([DDPCTL, "launch", str(job), "--master-port", "0", *args], cwd=cwd or job.parent,
                            env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def alive(pid: int) -> bool:
    """True if pid exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:  # gone (ENOENT), or going while we read (ESRCH)
        return False


def wait_for(predicate, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def read_pids(directory: Path, pattern="*.pid"):
    return [int(p.read_text().strip()) for p in directory.glob(pattern) if p.read_text().strip()]


def free_port() -> int:
    """A loopback port nothing listens on right now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_run(count: int) -> int:
    """The first of `count` consecutive loopback ports nothing listens on right now, below the
    ephemeral range and below bench/rendezvous's ports (20000 and up)."""
    for base in range(10000, 20000 - count, 97):
        socks = []
        try:
            for p in range(base, base + count):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError(f"no run of {count} free ports")


def write_secret_file(path: Path, text: str, uid=0, gid=0) -> Path:
    """A secret (token) file: created 0600, never readable by others in between, owned by uid:gid."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chown(path, uid, gid)
    return path


def wait_listening(port: int, proc, log=None, timeout=30.0):
    """Until something listens on 127.0.0.1:port; fails at once if proc exits (with its log)."""
    def listening():
        assert proc.poll() is None, Path(log).read_text() if log else proc.communicate()[0]
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0
    wait_for(listening, timeout, f"something to listen on 127.0.0.1:{port}")


def write_token(path: Path) -> Path:
    """A token file with one fresh random secret (key id 'default'), mode 0600."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(os.urandom(32).hex() + "\n")
    return path
