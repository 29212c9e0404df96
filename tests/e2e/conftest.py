"""Fixtures for the multi-host end-to-end tests: nspawn test clusters, ansible-playbook runs, commands on hosts.

Clusters come from tests/cluster/testcluster.py and are taken down when their test module ends;
set DGLKIT_KEEP_CLUSTERS=1 to keep them for debugging (`testcluster.py status` lists them, and
`ssh -F /var/lib/dglkit-testcluster/<name>/ssh/config node1` gets you in).
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
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from jobhelpers import CLEAN, LEFTOVERS, with_names

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "cluster"))
import staging  # noqa: E402  (tests/cluster is no package)

TESTCLUSTER = REPO / "tests" / "cluster" / "testcluster.py"
STATE = Path("/var/lib/dglkit-testcluster")
KEEP = os.environ.get("DGLKIT_KEEP_CLUSTERS") == "1"
# Prepended to every cluster name, so that two checkouts can run the e2e tier at once on one machine.
PREFIX = os.environ.get("DGLKIT_CLUSTER_PREFIX", "")
# The controller tools of the environment pytest runs in (.venv/bin).
BIN = Path(sys.executable).parent
# Where the venv seeds were built, as the hosts see it: the workspace's venv.
SEED_PATH = "/srv/dglkit/venv"
RECAP_RE = re.compile(r"^(\S+)\s+:\s+((?:\w+=\d+\s*)+)$", re.M)


# Per test, its share of module fixtures included (a cluster and site.yml take minutes under load).
E2E_TIMEOUT = 1200


# test_builtin_tasks, test_own_programs and test_train share the training cluster (train_cluster); the order of
# the modules (test_site.py first, test_train.py last) is tests/conftest.py's.
NODE3_NAME = "node3.cluster.test"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.e2e)
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(E2E_TIMEOUT))


def testcluster(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, str(TESTCLUSTER), *args], capture_output=True, text=True)
    if check and proc.returncode:
        pytest.fail(f"testcluster.py {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc


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


def ansible_playbook(inventory: Path, playbook: str, *args: str, check: bool = True,
                     timeout: float = 1200, etc_hosts: Path | None = None) -> PlaybookRun:
    """ansible-playbook from the repo root (its ansible.cfg applies); `check` fails the test on a non-zero exit."""
    cmd = with_names([str(BIN / "ansible-playbook"), "-i", str(inventory), playbook, *args], etc_hosts)
    env = {**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    output = proc.stdout + proc.stderr
    run = PlaybookRun(cmd, proc.returncode, output, parse_recap(proc.stdout))
    if check and proc.returncode:
        pytest.fail(f"{' '.join(cmd)} exited {proc.returncode}:\n{output[-6000:]}")
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

    def shutdown(self, host: str) -> None:
        """Take a host down as a power-off after an orderly shutdown would: it keeps its disk, address and host keys."""
        testcluster("shutdown", "--name", self.name, "--host", host)

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

    def playbook(self, playbook: str, *args: str, check: bool = True, timeout: float = 1200) -> PlaybookRun:
        return ansible_playbook(self.inventory, playbook, *args, check=check, timeout=timeout,
                                etc_hosts=self.etc_hosts)

    def outsider(self, command: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """A shell command in the cluster's outsider namespace: on the cluster network, in no inventory."""
        return subprocess.run(["ip", "netns", "exec", f"dglkit-{self.name}-out", "sh", "-c", command],
                              capture_output=True, text=True, timeout=timeout)

    @property
    def outsider_ip(self) -> str:
        return f"10.77.{self.state()['subnet']}.250"

    def start_playbook(self, playbook: str, *args: str) -> subprocess.Popen:
        """ansible-playbook in the background, in a session of its own (so that a test can SIGKILL it and every
        process it forked with os.killpg); stdout and stderr in one pipe."""
        cmd = with_names([str(BIN / "ansible-playbook"), "-i", str(self.inventory), playbook, *args], self.etc_hosts)
        # It must take the Ctrl-C a test sends even where pytest runs with SIGINT ignored (a background job of a
        # script), which exec would pass on.
        return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True,
                                env={**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0"},
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
                              env={**os.environ, "ANSIBLE_NOCOLOR": "1"}, capture_output=True, text=True,
                              timeout=timeout)

    def leftovers(self, host: str) -> dict:
        """What a job left on a host, {} when nothing: dglkit processes, listening DGL/rendezvous ports,
        /dev/shm files, an active job unit."""
        script = base64.b64encode(LEFTOVERS.encode()).decode()
        found = json.loads(self.ssh(host, f"python3 -c 'import base64; exec(base64.b64decode(\"{script}\"))'").stdout)
        # The job unit is a unit file: after a failure systemd shows it failed (for the admin), with nothing in it.
        if found["unit"] == "failed":
            found["unit"] = CLEAN["unit"]
        return {key: value for key, value in found.items() if value != CLEAN[key]}

    def ssh(self, host: str, command: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        """Run a shell command on a host as root, with the SSH settings Ansible uses (verified host keys)."""
        # Its own stdin: ssh makes its stdin non-blocking, and one killed at the timeout would leave ours so.
        proc = subprocess.run(["ssh", "-F", str(self.dir / "ssh/config"), host, command],
                              capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=timeout)
        if check and proc.returncode:
            pytest.fail(f"{host}: `{command}` exited {proc.returncode}:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
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


@pytest.fixture(scope="module")
def cluster_factory() -> Iterator[Callable[..., Cluster]]:
    """make(name, hosts, storage_is_worker=False, cluster_network=False, node_dir="") starts a cluster that lives
    until the module ends; cluster_network: node-to-node traffic on a second network (dglkit_cluster_address);
    node_dir: a directory of each host's own at this path, where stand_up puts per-node venvs."""
    if os.geteuid() != 0:
        pytest.skip("test clusters need root")
    made: list[Cluster] = []

    def make(name: str, hosts: int, storage_is_worker: bool = False, cluster_network: bool = False,
             node_dir: str = "") -> Cluster:
        cluster = Cluster((PREFIX + name)[:24].rstrip("-"))
        cluster.up(hosts, storage_is_worker, cluster_network, node_dir)
        made.append(cluster)
        return cluster

    yield make
    if not KEEP:
        for cluster in made:
            cluster.down()


@pytest.fixture(scope="session")
def train_cluster() -> Iterator[Cluster]:
    """One 3-host cluster (node1 storage, node2 and node3 workers) for the training modules, stood up once with
    site.yml; node3's cluster address is a host name that resolves on the controller alone (site.yml resolves
    it once, and every playbook uses that address). Each test leaves every host clean for the next."""
    if os.geteuid() != 0:
        pytest.skip("test clusters need root")
    cluster = Cluster((PREFIX + "train")[:24].rstrip("-"))
    cluster.up(3, False, False)
    try:
        cluster.name_address(NODE3_NAME, cluster.hosts()["node3"])
        (cluster.inventory / "host_vars").mkdir(exist_ok=True)
        (cluster.inventory / "host_vars/node3.yml").write_text(f"dglkit_cluster_address: {NODE3_NAME}\n")
        cluster.stand_up()
        yield cluster
    finally:
        if not KEEP:
            cluster.down()


@pytest.fixture(scope="session")
def train_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run folder of every job on train_cluster."""
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest, cluster_factory: Callable[..., Cluster]) -> Cluster:
    """Three hosts for the test module: node1 storage, node2 and node3 workers."""
    name = request.module.__name__.rpartition(".")[2].removeprefix("test_").replace("_", "-")[:24]
    return cluster_factory(name, 3)


@pytest.fixture(scope="session")
def testcluster_cli() -> Callable[..., subprocess.CompletedProcess]:
    """testcluster.py itself: cli("up", "--name", ..., check=False)."""
    return testcluster
