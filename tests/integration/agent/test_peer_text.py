"""What a stranger writes reaches the daemons' logs and the user's terminal clean.

Anyone who can reach an agent's or a standing coordinator's port (no key needed) can send an
'error' frame first, or a hello with any key id, and a fake agent can answer `ddpctl doctor
--nodes` with an 'error' frame; the JSON reader takes \\u001b, \\u0007, \\r and \\n. Those used to
be logged and printed as sent: a terminal retitled and cleared, a forged 'ddpctl error' line.
Now every control character shows as '?', on the line it came in.

The daemons and the fake agent run on loopback, started by the test."""
import json
import socket
import struct
import subprocess
import threading

import pytest

from ddptest import BINARY_DIR, DDPCTL, free_port, wait_for, wait_listening, write_token

AGENTD = str(BINARY_DIR / "bin" / "ddp-agentd")
COORDINATOR = str(BINARY_DIR / "bin" / "ddp-coordinator")
HOSTILE = "\x1b]0;PWNED\x07\x1b[2J\nddpctl error [coordinator] forged line\r"
SHOWN = "?]0;PWNED??[2J?ddpctl error [coordinator] forged line?"


def frame(message: dict) -> bytes:
    body = json.dumps(message).encode()  # control characters as \u001b, \n, \r
    return struct.pack(">I", len(body)) + body


def read_frame(s: socket.socket) -> dict:
    def exactly(n):
        data = b""
        while len(data) < n:
            chunk = s.recv(n - len(data))
            assert chunk, "the peer closed before a whole frame"
            data += chunk
        return data
    (n,) = struct.unpack(">I", exactly(4))
    return json.loads(exactly(n))


def assert_clean(text: str):
    for c in "\x1b\x07\r":
        assert c not in text, repr(text)
    forged = [line for line in text.splitlines() if line.startswith("ddpctl error [coordinator] forged")]
    assert not forged, text


@pytest.mark.parametrize("kind", ["agent", "coordinator"])
def test_a_strangers_words_are_logged_clean(tmp_path, kind):
    token = write_token(tmp_path / "token")
    port = free_port()
    binary, role = (AGENTD, "coordinator") if kind == "agent" else (COORDINATOR, "ctl")
    log = tmp_path / f"{kind}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([binary, "--listen", f"127.0.0.1:{port}", "--token-file", str(token), "--log-dir",
                                 str(tmp_path / "logs")], stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_listening(port, proc, log)
        # An 'error' frame as the first frame, with no key.
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(frame({"type": "error", "v": 3, "code": "x", "message": HOSTILE, "hint": HOSTILE}))
            assert s.recv(1) == b""  # dropped
        # A hello naming a key id with escapes: the refusal that comes back quotes it clean too.
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(frame({"type": "hello", "v": 7, "versions": [7], "key_id": "\x1b[41mKEY\n", "nonce": "a" * 64,
                             "role": role, "user": "mallory", "name": HOSTILE}))
            refusal = read_frame(s)
        assert refusal["type"] == "error", refusal
        assert refusal["message"] == "unknown key id '?[41mKEY?'", refusal
        wait_for(lambda: "unknown key id '?[41mKEY?'" in log.read_text(), 10, "the refusal in the log")
        wait_for(lambda: SHOWN in log.read_text(), 10, "the stranger's error in the log")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    text = log.read_text()
    assert f"peer refused: x: {SHOWN} ({SHOWN})" in text, text
    assert_clean(text)


def test_a_fake_agents_error_reaches_doctors_user_clean(tmp_path):
    token = write_token(tmp_path / "token")
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.settimeout(60)

    def fake_agent():
        # Every connection doctor makes: its hello read, then an 'error' frame instead of hello_ack.
        try:
            while True:
                conn, _ = listener.accept()
                with conn:
                    read_frame(conn)
                    conn.sendall(frame({"type": "error", "v": 3, "code": "auth", "message": HOSTILE, "hint": HOSTILE}))
        except OSError:
            return  # the listener closed

    t = threading.Thread(target=fake_agent, daemon=True)
    t.start()
    try:
        r = subprocess.run([DDPCTL, "doctor", "--nodes", f"127.0.0.1:{port}", "--token-file", str(token)],
                           capture_output=True, text=True, timeout=120)
    finally:
        listener.close()
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert f"peer refused: auth: {SHOWN} ({SHOWN})" in out, out
    assert_clean(out)
