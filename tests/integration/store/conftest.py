"""Fixtures for the store's integration tests: `ddpctl store serve` on a free loopback port."""
import os
import pathlib
import re
import signal
import subprocess
import time

import pytest

BINARY_DIR = pathlib.Path(os.environ.get("DDP_BINARY_DIR", pathlib.Path(__file__).resolve().parents[3] / "build"))
DDPCTL = BINARY_DIR / "bin" / "ddpctl"


class StoreProcess:
    def __init__(self, tmp_path, *extra):
        self.log_path = tmp_path / "store.log"
        self.log = open(self.log_path, "w")
        # debug: the tests read the per-client lines (a waiter that went away, ...), which are
        # below info so that a launch's failure output stays short
        self.proc = subprocess.Popen([str(DDPCTL), "store", "serve", "--listen", "127.0.0.1:0", *extra],
                                     stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     env=dict(os.environ, DDP_LOG_LEVEL="debug"))
        line = self.proc.stdout.readline().strip()
        assert line.startswith("listening on 127.0.0.1:"), f"unexpected first line {line!r}"
        self.host = "127.0.0.1"
        self.port = int(line.rsplit(":", 1)[1])

    def log_text(self):
        self.log.flush()
        return self.log_path.read_text()

    def wait_for_log(self, needle, timeout=10.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log_text()
            if needle in text:
                return text
            time.sleep(0.05)
        raise AssertionError(f"{needle!r} not in the store log:\n{self.log_text()}")

    def wait_for_waiter(self, key, timeout=10.0):
        """Waits until the store's wait report (SIGUSR1) names a client waiting on `key` (PyTorch's
        clients put a '/' before their keys)."""
        wanted = re.compile(r"waiting on `/*" + re.escape(key.lstrip("/")) + "`")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            start = len(self.log_text())
            self.proc.send_signal(signal.SIGUSR1)
            report_by = time.monotonic() + 2
            while time.monotonic() < report_by:
                new = self.log_text()[start:]
                if "store: " in new and ("nobody is waiting" in new or new.endswith("\n")):
                    break
                time.sleep(0.02)
            if wanted.search(new):
                return new
        raise AssertionError(f"no client waiting on {key!r} within {timeout} s:\n{self.log_text()}")

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


# Every test against both ways of serving: on the command's own thread and on two I/O threads.
# The clients are Debian's PyTorch 1.13: the store is told so (--protocol, as a launch tells it the
# probed release), so that it reads their WATCH_KEY (7) and DELETE_KEY (8) as 1.13's.
@pytest.fixture(params=["0", "2"], ids=["one_loop", "threads2"])
def store(request, tmp_path):
    s = StoreProcess(tmp_path, "--threads", request.param, "--protocol", "1.13")
    yield s
    assert s.alive(), "the store died during the test:\n" + s.log_text()
    assert s.stop() == 0
