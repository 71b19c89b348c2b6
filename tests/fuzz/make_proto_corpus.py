#!/usr/bin/env python3
"""Seeds for proto_session_fuzz (tests/fuzz/corpus/proto/): byte 0 is the mode and read size
(even: raw bytes to an unauthenticated server; odd: message bodies, one per line, sealed after
a completed handshake), then the bytes. See proto_session_fuzz.cpp."""
import json
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "proto")


def frame(body):
    return struct.pack(">I", len(body)) + body


# The version the fuzzer's handshake negotiates (the newest): a body framed as another is dropped
# at the version check, before the schema sees it.
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "proto", "messages.json")) as f:
    V = json.load(f)["versions"]["max"]


def msg(t, **f):
    return json.dumps({"type": t, "v": V, **f}, separators=(",", ":")).encode()


def plain(t, **f):
    """As our encoders write it: keys sorted (the form read_plain_heartbeat reads)."""
    return json.dumps({"type": t, "v": V, **f}, separators=(",", ":"), sort_keys=True).encode()


spec = {"file": "j.yaml", "name": "j", "nnodes_min": 1, "nnodes_max": 1, "nproc": {"kind": "count", "count": 2},
        "command": ["/bin/true"], "shell": False, "env": [], "env_forward": ["PATH"], "max_restarts": 0,
        "restart_backoff_ms": 1000, "log_dir": "/tmp/l", "log_max_bytes": 1 << 20, "store_port": 29500,
        "nccl_unique_id": "auto", "stop_grace_ms": 1000, "forward_env": {"PATH": "/usr/bin"},
        "binding": {"gpu": "auto", "numa": "auto", "nic": "auto"}}
seeds = {
    "raw-hello": (0, frame(msg("hello", versions=[3], key_id="default", nonce="00" * 32, role="coordinator",
                                user="u", name="c"))),
    "raw-hello-split": (2 * 3, frame(msg("hello", versions=[2, 3, 4], key_id="ops", nonce="ab" * 32, role="agent",
                                         user="u"))),
    "raw-auth-first": (0, frame(msg("auth", proof="00" * 32))),
    "raw-oversize": (0, struct.pack(">I", 0x7FFFFFFF) + b"{"),
    "raw-garbage": (0, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
    "raw-not-json": (0, frame(b"\xff\xfe{not json")),
    "session-job": (1, b"\n".join([
        msg("job_offer", t0_us=1, job_id="j", user="u", node="n1", spec=spec),
        msg("assign", job_id="j", run_id="j", user="u", round=1, restart_count=0, max_restarts=0, node_rank=0,
            nnodes=1, rank_base=0, local_world_size=2, world_size=2, master_addr="10.0.0.1", master_port=29500,
            node_addresses=["10.0.0.1"], nccl_ib_hca="=mlx5_0:1"),
        msg("start", job_id="j", round=1),
        msg("stop", job_id="j", round=1, reason="r", grace_ms=100),
        msg("heartbeat", now_us=5)])),
    "session-bad-types": (3 * 2 + 1, b"\n".join([
        msg("assign", job_id=1), msg("join", t0_us=1, rx_us=2, tx_us=3, job_id="j", node="n", nproc=-1), msg("nope"),
        b'{"type":"stop","v":3,"job_id":"j","round":1,"reason":"' + b"x" * 5000 + b'","grace_ms":1}',
        b"[1,2,3]", b'{"type":"heartbeat","v":99}'])),
    "session-heartbeats": (1, b"\n".join([
        plain("heartbeat"), plain("heartbeat", now_us=5), plain("heartbeat", now_us=1, t0_us=-2, rx_us=3),
        plain("heartbeat", now_us=-9223372036854775808, t0_us=9223372036854775807, rx_us=0),
        b'{"now_us":9223372036854775808,"type":"heartbeat","v":%d}' % V,
        b'{"now_us":-0,"type":"heartbeat","v":%d}' % V, b'{"now_us":01,"type":"heartbeat","v":%d}' % V,
        b'{"t0_us":1,"rx_us":2,"type":"heartbeat","v":%d}' % V, msg("heartbeat", now_us=7)])),
}
os.makedirs(OUT, exist_ok=True)
for name, (mode, data) in seeds.items():
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(bytes([mode]) + data)
print(f"{len(seeds)} seeds in {OUT}")
