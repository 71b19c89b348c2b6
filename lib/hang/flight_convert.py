# ddpctl's flight-recorder converter: PyTorch's NCCL flight recorder dumps (one pickle per rank)
# in, one compact JSON line per dump out. ddpctl runs it with the job's own Python, as the job's
# user, with a time limit and a bound on what it reads back (lib/hang/flight_gather.cpp): a
# dump is the job's file, and unpickling the job's data as the job's user gives it nothing it did
# not have. It still loads only plain data: any global but the list builders of torch's own
# pickler is refused, so a file that is not a dump cannot run code here either, and torch is
# never imported (seconds, and CUDA).
#
# Usage: python3 -I -S -c "$(cat flight_convert.py)" DIR NAME...   (NAME: nccl-flight-rank-<rank>)
#        python3 -I -S -c "$(cat flight_convert.py)" DIR --all     (every such NAME in DIR)
# Output, one line per NAME, in order:
#   {"file": NAME, "rank": R, "version": "2.10", "groups": {PG: {"desc": D, "ranks": [...]}},
#    "entries": [{"pg", "desc", "seq", "p2p", "op", "in", "out", "in_dtypes", "out_dtypes",
#                 "state", "t"}], "dropped": N}
#   or {"file": NAME, "rank": R, "error": "why"}
# The layout read is PyTorch's FlightRecorder.hpp (dump format versions 1.x and 2.x).
import io
import itertools
import json
import os
import pickle
import re
import stat
import sys

MAX_FILE = 64 << 20        # a 2000-entry dump with stacks is a few MiB
MAX_PER_GROUP = 64         # the newest collectives of each process group
MAX_P2P_PER_GROUP = 32
MAX_TENSORS = 8
MAX_DIMS = 8
MAX_TEXT = 128
MAX_GROUPS = 256
MAX_GROUP_RANKS = 65536
MAX_DUMPS = 4096           # more ranks than one node has
MAX_ENTRIES = 4096         # ddpctl asks for 2000 (contract/flight_recorder.hpp); a longer list is cut first
DUMP_NAME = re.compile(r"nccl-flight-rank-(\d{1,8})")

_LIST_BUILDERS = {("torch.jit._pickle", n) for n in ("build_intlist", "build_doublelist", "build_boollist",
                                                     "build_tensorlist", "build_list")}


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) in _LIST_BUILDERS:
            return list
        raise pickle.UnpicklingError(f"refused global {module}.{name}: not a flight recorder dump")


def _text(v):
    if not isinstance(v, (str, int, float, bool, type(None))):
        v = type(v).__name__  # never str() of a container: a pickle can make it as large as it likes
    return str(v)[:MAX_TEXT]


def _int(v, default=0):
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


def _shapes(v):
    out = []
    if not isinstance(v, (list, tuple)):
        return out
    for t in v[:MAX_TENSORS]:
        if isinstance(t, (list, tuple)):
            out.append([_int(d) for d in t[:MAX_DIMS]])
    return out


def _dtypes(v):
    if not isinstance(v, (list, tuple)):
        return []
    return [_text(d) for d in v[:MAX_TENSORS]]


def _ranks(v):
    if isinstance(v, str):  # "[0, 1, 2]" in 2.x dumps
        v = re.findall(r"-?\d+", v[: MAX_GROUP_RANKS * 8])
    if not isinstance(v, (list, tuple)):
        return []
    return [_int(r, -1) for r in v[:MAX_GROUP_RANKS]]


def _groups(cfg):
    out = {}
    if not isinstance(cfg, dict):
        return out
    for key, info in itertools.islice(cfg.items(), MAX_GROUPS):
        if isinstance(info, dict):
            name = _text(info.get("name", key))
            out[name] = {"desc": _text(info.get("desc", "")), "ranks": _ranks(info.get("ranks", []))}
        else:  # 1.x: {pg uid: [ranks]}
            out[_text(key)] = {"desc": "", "ranks": _ranks(info)}
    return out


def _entry(e):
    pg = e.get("process_group")
    if isinstance(pg, (list, tuple)) and pg:
        name, desc = _text(pg[0]), _text(pg[1]) if len(pg) > 1 else ""
    else:
        name, desc = _text(e.get("pg_id", "")), ""
    p2p = bool(e.get("is_p2p", False))
    seq = _int(e.get("p2p_seq_id" if p2p else "collective_seq_id", 0))
    return {
        "pg": name, "desc": desc, "seq": seq, "p2p": p2p,
        "op": _text(e.get("profiling_name", "")),
        "in": _shapes(e.get("input_sizes")), "out": _shapes(e.get("output_sizes")),
        "in_dtypes": _dtypes(e.get("input_dtypes")), "out_dtypes": _dtypes(e.get("output_dtypes")),
        "state": _text(e.get("state", "")),
        "t": _int(e.get("time_created_ns", 0)),
        "id": _int(e.get("record_id", 0)),
    }


def summarise(data):
    if not isinstance(data, dict) or not isinstance(data.get("entries", []), list):
        raise ValueError("not a flight recorder dump (no 'entries' list)")
    # Cut before anything is built per entry: a pickle's memo makes a list of a million
    # references to one entry out of a few bytes each (the newest are the list's end).
    raw = data.get("entries", [])
    entries = [_entry(e) for e in raw[-MAX_ENTRIES:] if isinstance(e, dict)]
    entries.sort(key=lambda e: e["id"])
    kept, dropped, count = [], 0, {}
    for e in reversed(entries):  # newest first: keep the last of each group
        k = (e["pg"], e["p2p"])
        n = count.get(k, 0)
        if n >= (MAX_P2P_PER_GROUP if e["p2p"] else MAX_PER_GROUP):
            dropped += 1
            continue
        count[k] = n + 1
        kept.append(e)
    kept.reverse()
    for e in kept:
        del e["id"]
    dropped += max(0, len(raw) - MAX_ENTRIES)
    return {"version": _text(data.get("version", "")), "groups": _groups(data.get("pg_config")),
            "entries": kept, "dropped": dropped}


def read_dump(dirfd, name):
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dirfd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        if st.st_size > MAX_FILE:
            raise ValueError(f"{st.st_size} bytes, more than the {MAX_FILE} read")
        with os.fdopen(os.dup(fd), "rb") as f:
            raw = f.read(MAX_FILE + 1)
    finally:
        os.close(fd)
    if raw[:1] in (b"{", b"["):
        return json.loads(raw)
    return _PlainUnpickler(io.BytesIO(raw)).load()


def main(argv):
    if len(argv) < 2:
        print("usage: flight_convert DIR NAME... | DIR --all", file=sys.stderr)
        return 2
    dirfd = os.open(argv[0], os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    names = argv[1:]
    if names == ["--all"]:  # the dumps in DIR, listed here, as the job's user, rather than by root
        found = [n for n in os.listdir(dirfd) if DUMP_NAME.fullmatch(n)]
        names = sorted(found, key=lambda n: int(DUMP_NAME.fullmatch(n).group(1)))[:MAX_DUMPS]
    for name in names:
        m = re.search(r"(\d+)$", name)
        out = {"file": name, "rank": int(m.group(1)) if m else -1}
        try:
            out.update(summarise(read_dump(dirfd, name)))
        except Exception as e:  # every failure is this dump's answer, never the others'
            out["error"] = f"{type(e).__name__}: {_text(str(e))}"  # our own or pickle's message, cut
        sys.stdout.write(json.dumps(out, separators=(",", ":")) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
