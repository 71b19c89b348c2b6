#!/usr/bin/python3
"""Seeds tests/fuzz/corpus/store/ from the store's wire fixtures (tests/unit/store/fixtures/).

Each connection's sent bytes become one seed, prefixed by a chunking byte (0: whole, 0x13:
3-byte reads over three clients). Run it after adding fixtures; fuzzing adds the rest.
"""
import hashlib
import pathlib
import re
import struct

root = pathlib.Path(__file__).resolve().parents[2]
fixtures = root / "tests/unit/store/fixtures"
out = root / "tests/fuzz/corpus/store"
out.mkdir(parents=True, exist_ok=True)

token = re.compile(r'\s*(s?"(?:\\.|[^"\\])*"|[^\s"]+)')


def parse_tokens(text):
    data = b""
    text = text.strip()
    pos = 0
    while pos < len(text):
        m = token.match(text, pos)
        if not m:
            break
        tok = m.group(1)
        pos = m.end()
        if tok.startswith("#"):
            break
        if tok.startswith('s"') or tok.startswith('"'):
            raw = re.sub(r'\\(.)', r'\1', tok[tok.index('"') + 1:-1]).encode()
            data += (struct.pack("<Q", len(raw)) if tok.startswith("s") else b"") + raw
        elif ":" in tok:
            kind, num = tok.split(":", 1)
            v = int(num, 0)
            data += struct.pack({"u8": "<B", "u32": "<I", "u64": "<Q", "i64": "<q"}[kind], v)
        else:
            data += bytes.fromhex(tok)
    return data


for f in sorted(fixtures.glob("*.txt")):
    sent = {}
    for line in f.read_text().splitlines():
        m = re.match(r"\s*(\d*)>(.*)", line)
        if not m or m.group(2).strip().startswith("close"):
            continue
        sent.setdefault(m.group(1) or "1", b"")
        sent[m.group(1) or "1"] += parse_tokens(m.group(2))
    for conn, data in sent.items():
        for chunking in (0x00, 0x13):
            seed = bytes([chunking]) + data
            name = f"{f.stem}-c{conn}-{chunking:02x}-{hashlib.sha1(seed).hexdigest()[:8]}"
            (out / name).write_bytes(seed)
print(f"wrote {len(list(out.iterdir()))} seeds to {out}")
