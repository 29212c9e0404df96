"""Cached inputs for offline test hosts: a Debian root, a local apt repository and a wheelhouse.

Everything lands under /var/cache/dglkit/ and is rebuilt only when its recipe changes: each artefact
lives in (or is stamped with) a hash of what it was built from. The nspawn harness (testcluster.py)
and a qemu image builder can share `build_root` with their own package lists.
"""
from __future__ import annotations

import fcntl
import glob
import hashlib
import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CACHE = Path("/var/cache/dglkit")
REPO_ROOT = Path(__file__).resolve().parents[2]
STAGED_PACKAGES = Path(__file__).with_name("staged-packages.txt")
NODE_LOCK = REPO_ROOT / "app" / "requirements" / "node.lock"
TEST_PROGRAM_REQUIREMENTS = REPO_ROOT / "tests" / "programs" / "train_dist" / "requirements.txt"
SUITE = "bookworm"

# What a plain cloud/server image has.
HOST_PACKAGES = ["systemd", "systemd-sysv", "dbus", "openssh-server", "python3", "python3-apt",
                 "iproute2", "procps", "sudo", "iputils-ping", "less"]

# Run in the new root. Hosts are offline and each gets its own identity at first boot.
HOST_FINISH = """
set -e
: > etc/apt/sources.list
rm -f etc/apt/sources.list.d/*
rm -rf var/lib/apt/lists/* var/cache/apt/*.bin var/cache/apt/archives/*.deb
rm -f etc/ssh/ssh_host_*
: > etc/machine-id
rm -f var/lib/dbus/machine-id
: > etc/resolv.conf
: > etc/hostname
"""


def log(msg: str) -> None:
    print(f"[stage] {msg}", file=sys.stderr, flush=True)


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, **kw)


def recipe_hash(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:12]


def debian_mirror() -> str:
    """The machine's own Debian mirror, read from its apt sources."""
    texts = [Path(p).read_text() for p in
             sorted(glob.glob("/etc/apt/sources.list.d/*.sources")) + ["/etc/apt/sources.list"]
             + sorted(glob.glob("/etc/apt/sources.list.d/*.list")) if Path(p).exists()]
    for text in texts:
        # deb822 stanzas ("URIs: ... Suites: bookworm ...") and one-line "deb URI bookworm main".
        for stanza in text.split("\n\n"):
            uris = re.search(r"^URIs:\s*(\S+)", stanza, re.M)
            suites = re.search(r"^Suites:\s*(.*)$", stanza, re.M)
            if uris and suites and SUITE in suites.group(1).split() and uris.group(1).rstrip("/").endswith("/debian"):
                return uris.group(1)
        for m in re.finditer(rf"^deb\s+(?:\[[^\]]*\]\s+)?(\S+/debian)/?\s+{SUITE}\s", text, re.M):
            return m.group(1)
    sys.exit(f"error: no Debian {SUITE} mirror in /etc/apt/sources.list(.d); add one (deb.debian.org/debian works)")


def build_root(flavour: str, packages: list[str], finish: str) -> Path:
    """A debootstrap --variant=minbase root at CACHE/rootfs/<flavour>-<hash>, built once."""
    dest = CACHE / "rootfs" / f"{flavour}-{recipe_hash(SUITE, 'minbase', packages, finish)}"
    if dest.is_dir():
        return dest
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    log(f"debootstrap {flavour} root -> {dest}")
    start = time.monotonic()
    run(["debootstrap", "--variant=minbase", f"--include={','.join(packages)}", SUITE, str(tmp), debian_mirror()],
        stdout=subprocess.DEVNULL)
    run(["sh", "-c", finish], cwd=tmp)
    tmp.rename(dest)
    log(f"root built in {time.monotonic() - start:.0f} s")
    mounts = Path("/proc/self/mountinfo").read_text()
    for old in dest.parent.glob(f"{flavour}-*"):
        # Roots of an older recipe go, unless a running host still has one as its overlay's lower dir.
        if re.fullmatch(rf"{flavour}-[0-9a-f]{{12}}", old.name) and old != dest and f"lowerdir={old}" not in mounts:
            shutil.rmtree(old)
    return dest


def host_root() -> Path:
    return build_root("host", HOST_PACKAGES, HOST_FINISH)


def staged_packages() -> list[str]:
    lines = (line.split("#")[0].strip() for line in STAGED_PACKAGES.read_text().splitlines())
    return sorted({line for line in lines if line})


def build_aptrepo(root: Path) -> Path:
    """A flat apt repository with the staged packages plus whatever of their dependencies `root` lacks."""
    dest = CACHE / "aptrepo"
    packages = staged_packages()
    stamp = recipe_hash(root.name, packages)
    if (dest / ".stamp").is_file() and (dest / ".stamp").read_text() == stamp:
        return dest
    log(f"resolving {len(packages)} staged packages against {root.name}")
    tmp = CACHE / "aptrepo.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "upper").mkdir(parents=True)
    (tmp / "work").mkdir()
    (tmp / "merged").mkdir()
    debs = tmp / "debs"
    debs.mkdir()
    # apt resolves inside a throwaway overlay of the root, in a private mount namespace that takes
    # every mount with it when it ends, so a crash leaves no mounts behind.
    script = f"""
set -e
mount -t overlay overlay -o lowerdir={root},upperdir={tmp}/upper,workdir={tmp}/work {tmp}/merged
cd {tmp}/merged
mount -t proc proc proc
cp /etc/resolv.conf etc/resolv.conf
echo "deb {debian_mirror()} {SUITE} main" > etc/apt/sources.list
chroot . apt-get -qq update
chroot . env DEBIAN_FRONTEND=noninteractive apt-get -qq -y --download-only install {' '.join(packages)}
cp var/cache/apt/archives/*.deb {debs}/
"""
    run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script])
    run(["sh", "-c", "dpkg-scanpackages --multiversion . /dev/null > Packages && gzip -9kf Packages"],
        cwd=debs, stderr=subprocess.DEVNULL)
    (debs / ".stamp").write_text(stamp)
    shutil.rmtree(dest, ignore_errors=True)
    debs.rename(dest)
    shutil.rmtree(tmp)
    log(f"apt repository: {len(list(dest.glob('*.deb')))} packages in {dest}")
    return dest


def build_wheelhouse() -> Path:
    """The locked node environment as wheels, plus the extra requirement of the test program (which the node
    environment lacks); skipped when this recipe's record is there and every wheel it lists. pip only adds files:
    checkouts with other locks share the directory, each with its own record."""
    dest = CACHE / "wheelhouse"
    stamp = recipe_hash(NODE_LOCK.read_text(), TEST_PROGRAM_REQUIREMENTS.read_text())
    stamp_file = dest / f".stamp-{stamp}.json"
    if stamp_file.is_file() and all((dest / w).is_file() for w in json.loads(stamp_file.read_text())):
        return dest
    if sys.version_info[:2] != (3, 11):
        sys.exit("error: the wheelhouse is for the hosts' Python 3.11: run stage with a Python 3.11 interpreter")
    log(f"pip download into {dest}")
    dest.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "download", "-q", "-d", str(dest)]
    # --no-deps: the lock is the whole environment (ogb without the dependency it must not have).
    run(pip + ["--require-hashes", "--no-deps", "-r", str(NODE_LOCK)])
    run(pip + ["-r", str(TEST_PROGRAM_REQUIREMENTS)])
    wheels = sorted(p.name for p in dest.iterdir() if not p.name.startswith("."))
    stamp_file.write_text(json.dumps(wheels))
    return dest


def read_lock(path: Path = NODE_LOCK) -> list[tuple[str, list[str]]]:
    """A requirements file in pip's hash-checking format as (requirement, options) per entry: continuation lines
    joined, comments dropped; the options are the `--` words after the requirement (`--hash=sha256:...`)."""
    entries = []
    for line in re.sub(r"\\\n", " ", path.read_text()).splitlines():
        line = re.sub(r"(^|\s)#.*", "", line).strip()
        if line:
            requirement, *options = re.split(r"\s+(?=--)", line)
            entries.append((requirement, options))
    return entries


def venv_seed(host_python: str) -> Path:
    """Where a venv that site.yml built from the current lock on hosts of `host_python` (`python3 -V`) is kept,
    so that later test hosts start from it (tests/e2e/conftest.py keeps it, the VM tier mounts it)."""
    return CACHE / "venv-seed" / hashlib.sha256(f"{host_python}\n{NODE_LOCK.read_text()}".encode()).hexdigest()[:16]


@contextmanager
def seed_lock(seed: Path) -> Iterator[None]:
    """Held while a venv seed is built, or awaited: `make test` runs the tiers on two pytest-xdist workers, and a
    cluster or the VM lab that needs the seed waits for the worker whose site.yml is building it."""
    seed.parent.mkdir(parents=True, exist_ok=True)
    with open(seed.with_name(seed.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def stage() -> dict[str, Path]:
    root = host_root()
    return {"root": root, "aptrepo": build_aptrepo(root), "wheelhouse": build_wheelhouse()}
