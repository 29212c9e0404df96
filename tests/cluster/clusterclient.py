"""The one client of the nspawn test clusters (testcluster.py), for the end-to-end tests and the bench scripts:
start, grow and stop a cluster, stand the kit up on it, run playbooks and shell commands on its hosts, and look
at its inventory, workspace and processes from this machine.

A failed command raises ClusterError with the command and the end of its output: a test fails with it, a bench
script stops with it. Cluster names get DGLKIT_CLUSTER_PREFIX in front (`named`), so that two checkouts can run
clusters at once on one machine.
"""
from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import yaml

from tests.cluster import staging

REPO = Path(__file__).resolve().parents[2]
TESTCLUSTER = REPO / "tests" / "cluster" / "testcluster.py"
STATE = Path("/var/lib/dglkit-testcluster")
PREFIX = os.environ.get("DGLKIT_CLUSTER_PREFIX", "")
# The controller tools of the environment this runs in (.venv/bin).
BIN = Path(sys.executable).parent
WS = "/srv/dglkit"
# Where the venv seeds were built, as the hosts see it: the workspace's venv.
SEED_PATH = f"{WS}/venv"
RECAP_RE = re.compile(r"^(\S+)\s+:\s+((?:\w+=\d+\s*)+)$", re.M)

# One host-side look for what a job left (Cluster.leftovers): processes, listening DGL/rendezvous ports,
# /dev/shm files, the job unit.
LEFTOVERS = r"""
import json, os, subprocess
procs = []
for pid in filter(str.isdigit, os.listdir('/proc')):
    try:
        cmd = open('/proc/%s/cmdline' % pid, 'rb').read().replace(b'\0', b' ').decode()
    except OSError:
        continue
    if 'dglkit' in cmd and pid != str(os.getpid()):
        procs.append(cmd[:120])
ports = set()
for table in ('/proc/net/tcp', '/proc/net/tcp6'):
    for line in open(table).read().splitlines()[1:]:
        fields = line.split()
        if fields[3] == '0A':
            ports.add(int(fields[1].rsplit(':', 1)[1], 16))
unit = subprocess.run(['systemctl', 'is-active', 'dglkit-job'], capture_output=True, text=True).stdout.strip()
# The rendezvous and DGL's servers (any dglkit_server_port a test sets).
dgl = [port for port in ports if port == 29500 or 30000 <= port < 32000]
print(json.dumps({'procs': procs, 'ports': sorted(dgl), 'shm': os.listdir('/dev/shm'), 'unit': unit}))
"""
CLEAN = {"procs": [], "ports": [], "shm": [], "unit": "inactive"}


class ClusterError(Exception):
    """A test-cluster command, playbook or host command that failed."""


def named(name: str) -> Cluster:
    """Cluster `name` of this checkout: with DGLKIT_CLUSTER_PREFIX, cut to testcluster.py's 24 characters."""
    return Cluster((PREFIX + name)[:24].rstrip("-"))


def testcluster(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, str(TESTCLUSTER), *args], capture_output=True, text=True)
    if check and proc.returncode:
        raise ClusterError(f"testcluster.py {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc


def with_names(cmd: list[str], etc_hosts: Path | None) -> list[str]:
    """cmd in a mount namespace of its own that sees etc_hosts as /etc/hosts (inventories can then name cluster
    addresses without touching this machine's /etc/hosts); cmd itself without etc_hosts."""
    if etc_hosts is None:
        return cmd
    return ["unshare", "--mount", "sh", "-ec", 'mount --bind "$0" /etc/hosts; exec "$@"', str(etc_hosts), *cmd]


@dataclass
class PlaybookRun:
    args: list[str]
    returncode: int
    output: str
    # PLAY RECAP per host: {"node1": {"ok": 5, "changed": 0, "unreachable": 0, "failed": 0, ...}}
    recap: dict[str, dict[str, int]] = field(default_factory=dict)

    def changed_hosts(self) -> list[str]:
        return sorted(h for h, counts in self.recap.items() if counts["changed"])

    def failed_hosts(self) -> list[str]:
        return sorted(h for h, c in self.recap.items() if c["failed"] or c["unreachable"])

    def flat(self) -> str:
        """The output with the YAML callback's line wrapping undone."""
        return " ".join(self.output.split())


def parse_recap(output: str) -> dict[str, dict[str, int]]:
    _, _, recap = output.rpartition("PLAY RECAP")
    return {host: {k: int(v) for k, v in (pair.split("=") for pair in counts.split())}
            for host, counts in RECAP_RE.findall(recap)}


def ansible_env(env: dict[str, str] | None = None) -> dict[str, str]:
    return {**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0", **(env or {})}


def ansible_playbook(inventory: Path, playbook: str, *args: str, check: bool = True, timeout: float | None = 1200,
                     etc_hosts: Path | None = None, env: dict[str, str] | None = None, cwd: Path = REPO) -> PlaybookRun:
    """ansible-playbook from the repo root (its ansible.cfg applies; `cwd`: from there instead), with `env` added to
    this environment; `check` raises ClusterError on a non-zero exit."""
    cmd = with_names([str(BIN / "ansible-playbook"), "-i", str(inventory), playbook, *args], etc_hosts)
    proc = subprocess.run(cmd, cwd=cwd, env=ansible_env(env), capture_output=True, text=True, timeout=timeout)
    output = proc.stdout + proc.stderr
    run = PlaybookRun(cmd, proc.returncode, output, parse_recap(proc.stdout))
    if check and proc.returncode:
        raise ClusterError(f"{' '.join(cmd)} exited {proc.returncode}:\n{output[-6000:]}")
    return run


@dataclass
class Cluster:
    name: str
    # Lines added to /etc/hosts for the controller's playbook runs (name_address).
    names: dict[str, str] = field(default_factory=dict)

    @property
    def dir(self) -> Path:
        return STATE / self.name

    @property
    def inventory(self) -> Path:
        return self.dir / "inventory"

    @property
    def workspace(self) -> Path:
        """The controller's view of the workspace every host has at /srv/dglkit."""
        return self.dir / "workspace"

    def state(self) -> dict:
        return json.loads((self.dir / "cluster.json").read_text())

    def groups(self) -> dict[str, dict[str, str]]:
        """The inventory's groups: {"storage": {host: ansible_host}, "workers": {...}}, in inventory order."""
        inventory = yaml.safe_load((self.inventory / "hosts.yml").read_text())
        groups = inventory["all"]["children"]["cluster"]["children"]
        return {g: {h: v["ansible_host"] for h, v in groups[g]["hosts"].items()} for g in groups}

    def workers(self) -> dict[str, str]:
        """Worker -> address, in inventory order (= DGL machine order)."""
        return self.groups()["workers"]

    def cluster_addresses(self) -> dict[str, str]:
        """Every host -> its address on the cluster network (dglkit_cluster_address, else ansible_host)."""
        inventory = yaml.safe_load((self.inventory / "hosts.yml").read_text())
        groups = inventory["all"]["children"]["cluster"]["children"]
        return {h: v.get("dglkit_cluster_address", v["ansible_host"])
                for g in ("storage", "workers") for h, v in groups[g]["hosts"].items()}

    def hosts(self) -> dict[str, str]:
        """Every host -> its address, storage host first."""
        groups = self.groups()
        return {**groups["storage"], **groups["workers"]}

    def up(self, hosts: int, storage_is_worker: bool = False, cluster_network: bool = False,
           node_dir: str = "") -> None:
        """Start the cluster, or grow it to `hosts` hosts (a second network or a node directory, once chosen,
        stays)."""
        testcluster("up", "--name", self.name, "--hosts", str(hosts),
                    *(["--storage-is-worker"] if storage_is_worker else []),
                    *(["--cluster-network"] if cluster_network else []),
                    *(["--node-dir", node_dir] if node_dir else []))

    def remove(self, host: str) -> None:
        testcluster("down", "--name", self.name, "--host", host)

    def cap_memory(self, host: str, memory_mb: int) -> None:
        """Limit a host's memory as a container runtime would (its memory cgroup); 0 lifts the limit."""
        testcluster("cap", "--name", self.name, "--host", host, "--memory-mb", str(memory_mb))

    def down(self) -> None:
        testcluster("down", "--name", self.name)

    def shutdown(self, host: str, cut: bool = False) -> None:
        """Take a host down as a power-off after an orderly shutdown would, or (cut) as a power cut: every
        process stops where it is. It keeps its disk, address and host keys."""
        testcluster("shutdown", "--name", self.name, "--host", host, *(["--cut"] if cut else []))

    def boot(self, host: str) -> None:
        """Boot a host that was shut down; returns once its sshd answers."""
        testcluster("boot", "--name", self.name, "--host", host)

    def name_address(self, name: str, address: str) -> None:
        """Make `name` resolve to `address` for the controller's playbook runs (as a DNS entry would)."""
        self.names[name] = address
        hosts = Path("/etc/hosts").read_text() + "".join(f"{a} {n}\n" for n, a in self.names.items())
        (self.dir / "etc-hosts").write_text(hosts)

    @property
    def etc_hosts(self) -> Path | None:
        return self.dir / "etc-hosts" if self.names else None

    def playbook(self, playbook: str, *args: str, check: bool = True, timeout: float | None = 1200,
                 env: dict[str, str] | None = None, cwd: Path = REPO) -> PlaybookRun:
        return ansible_playbook(self.inventory, playbook, *args, check=check, timeout=timeout,
                                etc_hosts=self.etc_hosts, env=env, cwd=cwd)

    def outsider(self, command: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """A shell command in the cluster's outsider namespace: on the cluster network, in no inventory."""
        return subprocess.run(["ip", "netns", "exec", f"dglkit-{self.name}-out", "sh", "-c", command],
                              capture_output=True, text=True, timeout=timeout)

    @property
    def outsider_ip(self) -> str:
        return f"10.77.{self.state()['subnet']}.250"

    def start_playbook(self, playbook: str, *args: str, cwd: Path = REPO) -> subprocess.Popen:
        """ansible-playbook in the background, in a session of its own (so that a test can SIGKILL it and every
        process it forked with os.killpg); stdout and stderr in one pipe; from `cwd` (default: the repo root)."""
        cmd = with_names([str(BIN / "ansible-playbook"), "-i", str(self.inventory), playbook, *args], self.etc_hosts)
        # It must take the Ctrl-C a test sends even where pytest runs with SIGINT ignored (a background job of a
        # script), which exec would pass on.
        return subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True, env=ansible_env(),
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))

    def stand_up(self, *args: str) -> PlaybookRun:
        """site.yml, starting from the venv that an earlier cluster's site.yml built for the same pins and host
        Python (seconds instead of a 5 GB pip install; tests/e2e/test_site.py runs the real install). A cluster
        with a node directory (`up(node_dir=...)`, for `dglkit_python_env_location: per_node`) gets the venv in
        every host's node directory instead, and none on the workspace."""
        seed, venv = self.venv_seed(), self.workspace / "venv"
        node_dir = self.state().get("node_dir")
        # Without a seed, this run builds it (or waits for the run of another worker that does).
        with nullcontext() if seed.is_dir() else staging.seed_lock(seed):
            for host in self.hosts() if node_dir and seed.is_dir() else []:
                own = self.dir / "hosts" / host / "node-dir" / "venv"
                if not own.exists():
                    copy_venv(seed, own)
                    move_venv(own, SEED_PATH, f"{node_dir}/venv")
            if not node_dir and seed.is_dir() and not venv.exists():
                copy_venv(seed, venv)
            run = self.playbook("site.yml", *args)
            self.keep_venv()
        return run

    def keep_venv(self) -> None:
        """Keep this cluster's venv as the seed for later clusters, once per pin set."""
        seed, venv = self.venv_seed(), self.workspace / "venv"
        if seed.is_dir() or not (venv / "dglkit-requirements" / "installed.txt").is_file():
            return
        partial = seed.with_name(seed.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        copy_venv(venv, partial)
        partial.rename(seed)

    def venv_seed(self) -> Path:
        return staging.venv_seed(self.ssh(next(iter(self.hosts())), "python3 -V").stdout.strip())

    def ansible(self, pattern: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        """An ad-hoc `ansible PATTERN ARGS...` against the cluster's inventory; the caller checks the result."""
        return subprocess.run([str(BIN / "ansible"), "-i", str(self.inventory), pattern, *args], cwd=REPO,
                              env=ansible_env(), capture_output=True, text=True, timeout=timeout)

    def leftovers(self, host: str) -> dict:
        """What a job left on a host, {} when nothing: dglkit processes, listening DGL/rendezvous ports,
        /dev/shm files, an active job unit."""
        script = base64.b64encode(LEFTOVERS.encode()).decode()
        found = json.loads(self.ssh(host, f"python3 -c 'import base64; exec(base64.b64decode(\"{script}\"))'").stdout)
        # The job unit is a unit file: after a failure systemd shows it failed (for the admin), with nothing in it.
        if found["unit"] == "failed":
            found["unit"] = CLEAN["unit"]
        return {key: value for key, value in found.items() if value != CLEAN[key]}

    def job_processes(self) -> dict[str, list[psutil.Process]]:
        """Every Python process on the cluster's hosts, per worker, seen from this machine (a host's processes
        sit in the cgroup /dglkit-<cluster>-<host>/): servers, trainers, samplers, torchrun (plain runs) and the kit's
        launcher, every node at the same instant and without an SSH round trip. The kit starts its servers as
        `python3` on the venv's PATH, the plain contract by the venv's path; nothing else on the test hosts runs
        Python while no playbook runs."""
        pattern = re.compile(rf"/dglkit-{re.escape(self.name)}-(node\d+)/")
        found: dict[str, list[psutil.Process]] = {host: [] for host in self.workers()}
        for proc in psutil.process_iter(["cmdline"]):
            cmdline = proc.info["cmdline"] or []
            if not cmdline or not re.fullmatch(r"python[0-9.]*", Path(cmdline[0]).name):
                continue
            try:
                host = pattern.search(Path(f"/proc/{proc.pid}/cgroup").read_text())
            except OSError:
                continue
            if host and proc.status() != psutil.STATUS_ZOMBIE:
                found.setdefault(host.group(1), []).append(proc)
        return found

    def ssh(self, host: str, command: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        """Run a shell command on a host as root, with the SSH settings Ansible uses (verified host keys)."""
        # Its own stdin: ssh makes its stdin non-blocking, and one killed at the timeout would leave ours so.
        proc = subprocess.run(["ssh", "-F", str(self.dir / "ssh/config"), host, command],
                              capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=timeout)
        if check and proc.returncode:
            raise ClusterError(f"{host}: `{command}` exited {proc.returncode}:\n"
                               f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        return proc


def move_venv(venv: Path, old: str, new: str) -> None:
    """A venv copied from path `old` to `new` (as the hosts see them): its scripts' shebangs and pyvenv.cfg name
    `new`. They are copies (copy_venv), not the seed's files."""
    for path in [venv / "pyvenv.cfg", *(venv / "bin").iterdir()]:
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            path.write_bytes(data.replace(old.encode(), new.encode()))


def copy_venv(src: Path, dest: Path) -> None:
    """lib/ (the installed packages, nearly all of it) as hard links, the rest as copies: the kit rewrites its
    records in dglkit-requirements/ and tests edit them in place, which must not reach the seed."""
    dest.mkdir(parents=True)
    for entry in src.iterdir():
        link = ["-l"] if entry.name == "lib" else []
        subprocess.run(["cp", "-a", *link, str(entry), str(dest / entry.name)], check=True)
