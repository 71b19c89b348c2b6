"""How the Release ddpctl is linked, for its start (docs/performance.md, launch start-up): the C++
runtime and yaml-cpp inside it, OpenSSL loaded only when called (common/openssl_lazy.hpp), and
the functions of its everyday commands side by side (apps/ddpctl/startup.order through lld).
These are link options a build change could drop without any other test noticing; the
benchmark (bench/launch/run.py) measures what they buy, and the multi-node tests (TLS, HMAC)
run through the lazily loaded OpenSSL."""
import platform
import re
import subprocess

import pytest

from ddptest import BINARY_DIR, SOURCE_DIR, cmake_cache, launch, write_job

DDPCTL = BINARY_DIR / "bin" / "ddpctl"
ORDER = SOURCE_DIR / "apps" / "ddpctl" / "startup.order"


# Only Release builds without sanitizers link ddpctl so (apps/ddpctl/CMakeLists.txt); scripts/test
# runs these tests on one. The OpenSSL trampolines are x86-64 code, and the order needs ld.lld.
SANITIZED = cmake_cache("DDP_SANITIZE").upper() not in ("", "OFF", "NO", "FALSE", "N", "0")
if cmake_cache("CMAKE_BUILD_TYPE") != "Release" or SANITIZED:
    pytest.skip(f"ddpctl is linked this way only in Release builds without sanitizers, not "
                f"{cmake_cache('CMAKE_BUILD_TYPE') or 'this'} build", allow_module_level=True)
X86_64 = platform.machine() == "x86_64"
LLD = bool(cmake_cache("DDP_LLD")) and not cmake_cache("DDP_LLD").endswith("NOTFOUND")


def run(*argv):
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def test_ddpctl_loads_no_shared_cxx_library():
    needed = set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", run("readelf", "-d", str(DDPCTL))))
    assert "libc.so.6" in needed, needed
    # libm costs 0.3 MiB and its IFUNC resolvers at every start; a new call into it (sqrt, pow)
    # brings it back: write it without libm, or drop "libm." here and say why in performance.md.
    linked = ("libstdc++", "libgcc_s", "libyaml-cpp", "libm.") + (("libssl", "libcrypto") if X86_64 else ())
    assert not {n for n in needed if n.startswith(linked)}, needed
    # And it still runs: the static runtime's own start-up works.
    assert run(str(DDPCTL), "--version").startswith("ddpctl ")


@pytest.mark.skipif(not X86_64, reason="OpenSSL is loaded when first called only on x86-64; elsewhere it is linked")
def test_a_local_launch_loads_no_openssl(tmp_path):
    # The rank reads its launcher's mappings (its parent is ddpctl) while the launch runs.
    job = write_job(tmp_path, "nproc_per_node: 1\ncommand: [/bin/sh, -c, 'cat /proc/$PPID/maps > maps.txt']\n"
                    f"workdir: {tmp_path}\nlogs: {{dir: {tmp_path}/logs}}\n")
    r = launch(job, "-q")
    assert r.returncode == 0, r.stderr
    maps = (tmp_path / "maps.txt").read_text()
    assert "/ddpctl" in maps and "libc.so.6" in maps, maps
    assert "libssl" not in maps and "libcrypto" not in maps, maps


@pytest.mark.skipif(not LLD, reason="ld.lld was not found when this build was configured: it warned and "
                    "linked ddpctl's functions where they fall (scripts/setup installs lld)")
def test_the_start_up_functions_lie_together():
    listed = [line.strip() for line in ORDER.read_text().splitlines() if line.strip() and not line.startswith("#")]
    assert len(listed) > 500, f"{ORDER} lists only {len(listed)} functions"
    where = {}
    for line in run("nm", "-S", "--defined-only", str(DDPCTL)).splitlines():
        p = line.split()
        if len(p) == 4 and p[2] in "tTwW":
            where.setdefault(p[3], []).append((int(p[0], 16), int(p[1], 16)))
    found = [where[n][0] for n in listed if len(where.get(n, [])) == 1]
    assert len(found) >= len(listed) // 2, (
        f"only {len(found)} of the {len(listed)} functions in {ORDER} are still ddpctl's: "
        "run scripts/startup-order to make it anew")
    size = sum(s for _, s in set(found))
    span = max(a + s for a, s in found) - min(a for a, _ in found)
    text = int(run("size", "-A", str(DDPCTL)).split("\n.text ")[1].split()[0])
    # Laid out together, they span little more than their own size (1.2x when made); scattered,
    # as a link without the order gives, they span most of the text (4.5x).
    assert span < 1.5 * size, f"the listed functions ({size} bytes) span {span} of {text} bytes of text"
