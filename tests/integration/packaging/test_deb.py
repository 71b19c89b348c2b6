"""The .deb packages: built by scripts/package, inspected with dpkg-deb, and installed with
`apt-get install ./x.deb` into a fresh Debian 12 chroot (debootstrap, cached as a tarball under
the build folder so reruns skip it), where the commands run and `systemd-analyze verify` checks
the installed unit. Needs root, debootstrap and Debian's mirror (scripts/setup installs
debootstrap; the mirror is reachable here and in CI). The chroot's mounts live in a private
mount namespace, so nothing is left mounted."""
import fcntl
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from ddptest import BINARY_DIR, SOURCE_DIR

MIRROR = "http://deb.debian.org/debian"
CACHE = BINARY_DIR / "debootstrap" / "bookworm-minbase-systemd.tar"

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="debootstrap and chroot need root"),
    pytest.mark.skipif(shutil.which("debootstrap") is None, reason="debootstrap is not installed (scripts/setup)"),
]


def run(*argv, **kw):
    return subprocess.run(argv, capture_output=True, text=True, **kw)


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    """The two .deb files, copied out of build/packages/ into this test's own folder. Under
    `ctest -j` test_systemd_nspawn builds them at the same time: scripts/package empties
    build/packages/ and CPack's staging folder, so the build and the copy hold a lock."""
    mine = tmp_path_factory.mktemp("debs")
    (BINARY_DIR / "debootstrap").mkdir(parents=True, exist_ok=True)
    with open(BINARY_DIR / "debootstrap" / "package.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        r = run(str(SOURCE_DIR / "scripts" / "package"), env=dict(os.environ, BUILD_DIR=str(BINARY_DIR)), timeout=900)
        assert r.returncode == 0, r.stdout + r.stderr
        for p in (BINARY_DIR / "packages").glob("*.deb"):
            shutil.copy2(p, mine / p.name)
    debs = {p.name.split("_")[0]: p for p in mine.glob("*.deb")}
    assert set(debs) == {"ddpctl", "ddp-agentd"}, debs
    return debs


def field(deb, name):
    return run("dpkg-deb", "-f", str(deb), name).stdout.strip()


def contents(deb):
    return {line.split()[-1].lstrip(".") for line in run("dpkg-deb", "-c", str(deb)).stdout.splitlines()}


def test_packages_have_their_files_and_shlibdeps_depends(packages):
    ctl, agent = packages["ddpctl"], packages["ddp-agentd"]
    assert {"/usr/bin/ddpctl", "/usr/bin/ddp-ncclid", "/usr/share/man/man1/ddpctl.1.gz",
            "/usr/share/bash-completion/completions/ddpctl", "/usr/bin/ddp-coordinator",
            "/usr/lib/systemd/system/ddp-coordinator.service", "/usr/share/man/man8/ddp-coordinator.8.gz"} <= contents(ctl)
    assert {"/usr/bin/ddp-agentd", "/usr/lib/systemd/system/ddp-agentd.service", "/etc/ddpctl/agent.yaml",
            "/usr/share/man/man8/ddp-agentd.8.gz"} <= contents(agent)
    for deb in (ctl, agent):
        assert field(deb, "Version") == "0.1.0" and field(deb, "Architecture") == "amd64"
        assert "-dev" not in field(deb, "Depends")
        # fmt and spdlog are header-only everywhere.
        assert "libspdlog" not in field(deb, "Depends") and "libfmt" not in field(deb, "Depends")
    # dpkg-shlibdeps names the runtime packages of what the binaries link: the ddpctl package's
    # shared libraries (ddpctl has libstdc++ and yaml-cpp inside it; ddp-coordinator links both
    # shared, ddp-ncclid libstdc++); the agent (the binary SSH mode uploads) links OpenSSL, yaml-cpp and libstdc++
    # statically, so glibc and libsystemd0 are all it needs.
    for lib in ("libc6 (>=", "libstdc++6", "libssl3", "libyaml-cpp0.7", "libssh-4"):
        assert lib in field(ctl, "Depends"), field(ctl, "Depends")
    agent_depends = {d.split()[0] for d in field(agent, "Depends").split(", ")}
    assert agent_depends <= {"libc6", "libsystemd0", "adduser", "systemd"}, agent_depends
    # Both daemons speak sd_notify: the agent, and the standing coordinator in the ddpctl package.
    assert "libsystemd0" in field(agent, "Depends") and "libsystemd0" in field(ctl, "Depends")
    control = run("dpkg-deb", "-I", str(agent), "conffiles").stdout
    assert control.split() == ["/etc/ddpctl/agent.yaml"]


def chroot_tarball():
    """Debian 12 minbase plus systemd (for systemd-analyze) and apt lists, made once."""
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    with open(CACHE.parent / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if CACHE.exists():
            return CACHE
        work = CACHE.parent / "root.tmp"
        shutil.rmtree(work, ignore_errors=True)
        r = run("debootstrap", "--variant=minbase", "--include=systemd", "bookworm", str(work), MIRROR, timeout=1500)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        with tarfile.open(str(CACHE) + ".tmp", "w") as t:
            t.add(work, arcname=".")
        os.replace(str(CACHE) + ".tmp", CACHE)
        shutil.rmtree(work)
        return CACHE


def in_chroot(root: Path, script: str, timeout=900):
    """Runs `sh -c script` chrooted into root, with /proc mounted in a private mount namespace."""
    return run("unshare", "--mount", "--propagation", "private", "sh", "-c",
               f'mount -t proc proc "{root}/proc" && exec chroot "{root}" /bin/sh -c "$0"', script, timeout=timeout)


@pytest.fixture(scope="module")
def installed(packages, tmp_path_factory):
    root = tmp_path_factory.mktemp("chroot") / "root"
    root.mkdir()
    with tarfile.open(chroot_tarball()) as t:
        t.extractall(root, numeric_owner=True)
    shutil.copy("/etc/resolv.conf", root / "etc" / "resolv.conf")
    for deb in packages.values():
        shutil.copy(deb, root / "tmp" / deb.name)
    debs = " ".join(f"/tmp/{d.name}" for d in packages.values())
    r = in_chroot(root, "apt-get update -qq && DEBIAN_FRONTEND=noninteractive "
                        f"apt-get install -y -qq --no-install-recommends {debs}")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_the_agent_binary_ssh_mode_uploads_runs_on_a_bare_debian_12(tmp_path):
    """ddpctl --ssh uploads build/bin/ddp-agentd to nodes that may have only Debian's base
    system. It links nothing beyond glibc and libsystemd0 (which apt itself depends on, so every
    Debian has it), and it runs in a fresh chroot where none of our packages or their
    dependencies are installed."""
    agent = BINARY_DIR / "bin" / "ddp-agentd"
    r = run("readelf", "-d", str(agent))
    assert r.returncode == 0, r.stderr
    needed = set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", r.stdout))
    assert needed <= {"libc.so.6", "libm.so.6", "ld-linux-x86-64.so.2", "libsystemd.so.0"}, needed
    root = tmp_path / "root"
    root.mkdir()
    with tarfile.open(chroot_tarball()) as t:
        t.extractall(root, numeric_owner=True)
    shutil.copy(agent, root / "tmp" / "ddp-agentd")
    r = in_chroot(root, "/tmp/ddp-agentd --version && dpkg-query -W libssl3 libfmt9 libspdlog1.10 libstdc++6; true")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("ddp-agentd "), r.stdout + r.stderr
    # The chroot really lacks what the agent used to need.
    assert "libspdlog1.10" in r.stderr and "libfmt9" in r.stderr, r.stdout + r.stderr
    shutil.rmtree(root, ignore_errors=True)


def test_installed_commands_run_in_a_fresh_debian_12(installed):
    r = in_chroot(installed, "ddpctl --version && ddp-agentd --version && ddp-agentd --help && ddp-coordinator --version")
    assert r.returncode == 0, r.stderr
    assert "ddpctl 0.1.0" in r.stdout and "ddp-agentd 0.1.0" in r.stdout and "--config" in r.stdout
    assert "ddp-coordinator 0.1.0" in r.stdout
    r = in_chroot(installed, "bash -c '. /usr/share/bash-completion/completions/ddpctl && "
                             "COMP_WORDS=(ddpctl la); COMP_CWORD=1; _ddpctl; echo ${COMPREPLY[*]}'")
    assert r.stdout.strip() == "launch", r.stdout + r.stderr
    r = in_chroot(installed, "dpkg-query -W -f='${Status} ${Conffiles}\\n' ddp-agentd")
    assert "install ok installed" in r.stdout and "/etc/ddpctl/agent.yaml" in r.stdout, r.stdout
    # The installed agent reads the shipped config (the default path) and gets as far as the
    # token, which only an admin can provide.
    r = in_chroot(installed, "ddp-agentd --token-file /etc/ddpctl/missing-token")
    assert r.returncode == 2 and "missing-token" in r.stderr and "agent.yaml" not in r.stderr, r.stderr


def test_systemd_analyze_verify_accepts_the_installed_units(installed):
    # verify exits 0 even for a unit it complains about, so its output is what counts; a broken
    # copy shows that it does complain here.
    unit = "/usr/lib/systemd/system/ddp-agentd.service"
    for u in (unit, "/usr/lib/systemd/system/ddp-coordinator.service"):
        r = in_chroot(installed, f"systemd-analyze verify --man=no {u}")
        assert r.returncode == 0 and r.stdout + r.stderr == "", u + ": " + r.stdout + r.stderr
    r = in_chroot(installed, f"sed 's/^KillMode=mixed/KillMode=bogus/' {unit} > /tmp/broken.service && "
                             "systemd-analyze verify --man=no /tmp/broken.service")
    assert "kill mode" in (r.stdout + r.stderr).lower(), r.stdout + r.stderr


def test_removing_the_agent_package_leaves_its_conffile_until_purge(installed):
    r = in_chroot(installed, "apt-get remove -y -qq ddp-agentd && test ! -e /usr/bin/ddp-agentd && "
                             "test -e /etc/ddpctl/agent.yaml && apt-get purge -y -qq ddp-agentd && "
                             "test ! -e /etc/ddpctl/agent.yaml")
    assert r.returncode == 0, r.stdout + r.stderr
