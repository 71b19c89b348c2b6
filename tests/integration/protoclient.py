"""A second, independent implementation of the client side of ddpctl's wire protocol (version 3 by
default, which ddpctl still speaks beside 4 to 6; the handshake is the same; version 6's
delegations are signed here too;
lib/proto/session.hpp), for tests that must say on the wire what ddpctl itself never would (a job
id that climbs out of the log directory, say). Written from the construction in session.hpp, not
from the C++ code, so a handshake it completes also checks that description."""
import hashlib
import hmac
import json
import os
import socket
import struct

VERSION = 3


class ProtocolError(Exception):
    pass


def _lp(b: bytes) -> bytes:
    return struct.pack(">I", len(b)) + b


class Client:
    """Dials HOST:PORT as `role` with (key_id, secret) and completes the handshake."""

    def __init__(self, host, port, key_id, secret, role="coordinator", user="mallory", timeout=20, version=VERSION):
        self.version = version
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.buf = b""
        self.secret = secret.encode()
        self.key_id = key_id
        self.role = role
        nonce_c = os.urandom(32)
        hello = json.dumps({"type": "hello", "v": version, "versions": [version], "key_id": key_id,
                            "nonce": nonce_c.hex(), "role": role, "user": user, "name": "protoclient"},
                           separators=(",", ":")).encode()
        self._send_frame(hello)
        ack_body = self._read_frame()
        ack = json.loads(ack_body)
        self.ack = ack  # version 6: a standing coordinator's delegate_key is here
        if ack.get("type") != "hello_ack":
            raise ProtocolError(f"expected hello_ack, got {ack}")
        nonce_s = bytes.fromhex(ack["nonce"])
        transcript = hashlib.sha256(_lp(hello) + _lp(ack_body)).digest()

        def proof(label):
            data = label + b"\0" + nonce_c + nonce_s + _lp(role.encode()) + _lp(key_id.encode()) + transcript
            return hmac.new(self.secret, data, hashlib.sha256).digest()

        ok = json.loads(self._read_frame())  # the server proves first (version 3)
        if ok.get("type") != "auth_ok" or not hmac.compare_digest(bytes.fromhex(ok["proof"]), proof(b"ddpctl server proof")):
            raise ProtocolError(f"the server's proof did not check out: {ok}")
        self._send_frame(json.dumps({"type": "auth", "v": version, "proof": proof(b"ddpctl client proof").hex()},
                                    separators=(",", ":")).encode())
        self.key = hmac.new(self.secret, b"ddpctl session\0" + nonce_c + nonce_s + transcript, hashlib.sha256).digest()
        self.seq_out = self.seq_in = 0

    def _send_frame(self, body: bytes):
        self.sock.sendall(struct.pack(">I", len(body)) + body)

    def _read_frame(self) -> bytes:
        while True:
            if len(self.buf) >= 4:
                n = struct.unpack(">I", self.buf[:4])[0]
                if len(self.buf) >= 4 + n:
                    body, self.buf = self.buf[4:4 + n], self.buf[4 + n:]
                    return body
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError("the peer closed the connection")
            self.buf += chunk

    def send(self, type_, **fields):
        """A sealed message: JSON, then HMAC(session key, 'C' || seq || JSON)."""
        body = json.dumps({"type": type_, "v": self.version, **fields}, separators=(",", ":")).encode()
        tag = hmac.new(self.key, b"C" + struct.pack(">Q", self.seq_out) + body, hashlib.sha256).digest()
        self.seq_out += 1
        self._send_frame(body + tag)

    def receive(self) -> dict:
        """The next sealed message from the server, its MAC checked."""
        frame = self._read_frame()
        body, tag = frame[:-32], frame[-32:]
        want = hmac.new(self.key, b"S" + struct.pack(">Q", self.seq_in) + body, hashlib.sha256).digest()
        if not hmac.compare_digest(tag, want):
            raise ProtocolError(f"frame #{self.seq_in} from the server failed its MAC")
        self.seq_in += 1
        return json.loads(body)

    def close(self):
        self.sock.close()


def payload_digest(spec):
    """SHA-256 (hex) of a job payload as the C++ side writes it (keys sorted, no spaces), without
    log_dir: what a delegation binds (lib/proto/delegation.hpp)."""
    body = {k: v for k, v in spec.items() if k != "log_dir"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()).hexdigest()


def delegation(key_id, secret, user, coordinator_key, job_id, expires_s, spec, nonce=None):
    """A version-6 delegation, signed from the construction in lib/proto/delegation.hpp."""
    nonce = nonce or os.urandom(16).hex()
    digest = payload_digest(spec)
    data = (b"ddpctl delegation v1\0" + _lp(user.encode()) + _lp(key_id.encode()) + _lp(coordinator_key.encode()) +
            _lp(job_id.encode()) + struct.pack(">Q", expires_s) + _lp(nonce.encode()) + _lp(digest.encode()))
    mac = hmac.new(secret.encode(), data, hashlib.sha256).hexdigest()
    return {"user": user, "key_id": key_id, "coordinator_key": coordinator_key, "job_id": job_id,
            "expires_s": expires_s, "nonce": nonce, "spec_sha256": digest, "mac": mac}


def read_token(path):
    """(key_id, secret) of a token file's first key: 'id: secret' lines, or one bare secret."""
    for line in open(path).read().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if ":" in line:
            k, v = line.split(":", 1)
            return k.strip(), v.strip().strip("'\"")
        return "default", line
    raise ValueError(f"{path} holds no key")
