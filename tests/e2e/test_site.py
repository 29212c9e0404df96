"""site.yml on real hosts: three fresh nspawn hosts (node1 storage, node2 and node3 workers) with the SSH mesh
on, pip installing from the staged wheelhouse that site.yml copies from the controller (dglkit_wheelhouse_src),
then the storage host as a worker too, bad inventories, a worker taken out of the inventory and a host
that is down.

The tests run in file order on one cluster: the later ones reshape it.
"""
from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from jobhelpers import as_job_user, flat, mesh_ssh
from tests.cluster import staging

if TYPE_CHECKING:
    from conftest import Cluster, PlaybookRun

REPO = Path(__file__).resolve().parents[2]
PINS = dict(re.findall(r"(?m)^(dgl|torch)==(\S+) ", staging.NODE_LOCK.read_text()))
WORKSPACE = "/srv/dglkit"
USER, UID = "dglkit", 30050  # the job account and its default ids
# The wheels tests/cluster/staging.py downloaded, on the controller: site.yml copies them to the workspace.
WHEELHOUSE_SRC = Path("/var/cache/dglkit/wheelhouse")
MESH_KEY = ".ssh/dglkit_ed25519"


# Where site.yml writes on a host; empty output means a fresh host.
WRITTEN = (f"ls -A {WORKSPACE}; ls -d /etc/ssh/dglkit_known_hosts /etc/ssh/ssh_config.d/dglkit.conf /etc/dglkit "
           f"/var/lib/dglkit /opt/dglkit 2>/dev/null; getent passwd {USER}; true")


@pytest.fixture(scope="module")
def fresh_check(cluster: Cluster) -> tuple[PlaybookRun, dict[str, str]]:
    """site.yml --check on the fresh cluster (SSH mesh on, wheels from the controller), and what each host then
    holds where site.yml writes."""
    (cluster.inventory / "group_vars/all/mesh.yml").write_text("dglkit_ssh_mesh: true\n")
    # Instead of the wheelhouse bound into the hosts (group_vars/all/testcluster.yml; this file is read after it).
    (cluster.inventory / "group_vars/all/wheelhouse.yml").write_text(
        f"dglkit_wheelhouse_src: {WHEELHOUSE_SRC}\ndglkit_wheelhouse_dir: {WORKSPACE}/wheelhouse\n")
    run = cluster.playbook("site.yml", "--check")
    return run, {host: cluster.ssh(host, WRITTEN).stdout for host in cluster.hosts()}


@pytest.fixture(scope="module")
def runs(cluster: Cluster, fresh_check: tuple[PlaybookRun, dict[str, str]]) -> dict[str, PlaybookRun]:
    """On the fresh cluster with the SSH mesh on: --check, the real run, a second run, --check again."""
    runs = {"fresh-check": fresh_check[0]}
    # The venv pip builds here seeds the later modules' clusters and the VM lab, which wait for it.
    with staging.seed_lock(cluster.venv_seed()):
        runs.update({name: cluster.playbook("site.yml", *args) for name, args in
                     [("first", []), ("second", []), ("set-up-check", ["--check"])]})
        cluster.keep_venv()
    return runs


@contextmanager
def hosts_file(cluster: Cluster, content: str) -> Iterator[None]:
    """The cluster's inventory with another hosts.yml for a while (its group_vars stay)."""
    path = cluster.inventory / "hosts.yml"
    original = path.read_text()
    path.write_text(content)
    try:
        yield
    finally:
        path.write_text(original)


def mtimes(cluster: Cluster, host: str, paths: list[str]) -> str:
    return cluster.ssh(host, "stat -c '%n %Y' " + " ".join(paths)).stdout


def test_check_mode_on_fresh_hosts_reports_the_changes_and_makes_none(
        cluster: Cluster, fresh_check: tuple[PlaybookRun, dict[str, str]]) -> None:
    run, written = fresh_check
    assert sorted(run.recap) == sorted([*cluster.hosts(), "localhost"])
    assert run.failed_hosts() == []
    assert run.changed_hosts() == sorted(cluster.hosts()), run.recap
    assert written == {host: "" for host in cluster.hosts()}


def test_first_run_sets_up_every_host(cluster: Cluster, runs: dict[str, PlaybookRun]) -> None:
    assert runs["first"].failed_hosts() == []
    assert runs["first"].changed_hosts() == sorted(cluster.hosts())


def test_second_run_and_check_mode_change_nothing(runs: dict[str, PlaybookRun]) -> None:
    for name in ("second", "set-up-check"):
        assert runs[name].failed_hosts() == [], name
        assert runs[name].changed_hosts() == [], (name, runs[name].recap)


def task_statuses(output: str, task: str) -> dict[str, set[str]]:
    """Every status one task reported per host (loop items included): {"node1": {"ok", "changed"}, ...}."""
    _, _, section = output.partition(f"TASK [{task}] ")
    section = re.split(r"\n(?:TASK|PLAY|RUNNING HANDLER) \[", section)[0]
    statuses: dict[str, set[str]] = {}
    for status, host in re.findall(r"(?m)^(ok|changed|skipping|failed|fatal): \[([^\]]+)\]", section):
        statuses.setdefault(host, set()).add(status)
    return statuses


def test_the_wheelhouse_from_the_controller_is_copied_once_and_pip_installs_from_it(
        cluster: Cluster, runs: dict[str, PlaybookRun]) -> None:
    copy, copy_stage = "python_env : Copy the wheels, one line per wheel", "python_env : Copy the wheels and record them"
    # The storage host (which builds the shared venv) writes the workspace; a re-run finds the record of the same
    # wheels there and copies nothing.
    assert task_statuses(runs["first"].output, copy) == {"node1": {"changed"}}
    assert task_statuses(runs["second"].output, copy_stage) == {"node1": {"skipping"}}
    assert f"TASK [{copy}]" not in runs["second"].output
    wheels = {path.name: path.stat().st_size for path in WHEELHOUSE_SRC.glob("*.whl")}
    # A line per wheel as it arrives, with its place in the count and its size.
    torch = next(name for name in wheels if name.startswith("torch-"))
    files = len([path for path in WHEELHOUSE_SRC.rglob("*") if path.is_file()])
    arrived = re.findall(rf"(?m)^changed: \[node1\] => \(item=(\d+)/{files} (\S+), ([\d.]+) MB\)$", runs["first"].output)
    assert sorted(int(index) for index, _, _ in arrived) == list(range(1, files + 1)), runs["first"].output[-3000:]
    assert (torch, f"{wheels[torch] / 2**20:.1f}") in {(name, size) for _, name, size in arrived}, arrived
    assert {path.name: path.stat().st_size for path in (cluster.workspace / "wheelhouse").glob("*.whl")} == wheels
    # pip ran under `dglkit follow`: a line per poll of what it had read or installed of the lock's packages.
    assert re.search(r"(?m)^\d\d:\d\d:\d\d pip: (collect|install), \d+/\d+ packages, \d+ s, peak \d+ MB$",
                     runs["first"].output), runs["first"].output[-3000:]
    # pip had no other source: the hosts have no route out, and the wheelhouse bound into them is not configured.
    pip = cluster.ssh("node1", f"{WORKSPACE}/venv/bin/pip list --format=freeze").stdout
    assert f"torch=={PINS['torch']}" in pip and f"dgl=={PINS['dgl']}" in pip, pip


def test_a_re_run_skips_the_slow_steps_and_redoes_those_whose_records_went_stale(
        cluster: Cluster, runs: dict[str, PlaybookRun]) -> None:
    slow = ["dgl_app : Unpack the app into the workspace", "python_env : Install the pinned node packages",
            "python_env : Import dgl and torch"]
    # Skipped, or not even included: a host whose records are current does not evaluate the steps that write.
    for task in slow:
        statuses = task_statuses(runs["second"].output, task)
        assert all(s == {"skipping"} for s in statuses.values()), (task, statuses)
    cluster.ssh("node1", f"echo stale > {WORKSPACE}/app/.fingerprint && rm {WORKSPACE}/app/dglkit/watch.py"
                         f" && echo stale > {WORKSPACE}/venv/dglkit-requirements/installed.txt")
    cluster.ssh("node2", "rm /var/lib/dglkit/python_env.verified")
    run = cluster.playbook("site.yml")
    assert task_statuses(run.output, slow[0]) == {"node1": {"changed"}}
    # pip finds every pinned package installed: it runs, changes nothing, and the record is rewritten.
    assert task_statuses(run.output, slow[1]) == {"node1": {"ok"}}
    assert task_statuses(run.output, slow[2]) == {"node2": {"ok"}}
    assert (cluster.workspace / "app/dglkit/watch.py").read_text() == (REPO / "app/dglkit/watch.py").read_text()
    # The copy compiled every module of the app: the job account, which cannot write there, has nothing left to
    # compile (compileall would try to write a missing or stale module's bytecode, and fail).
    compiled = cluster.ssh("node2", as_job_user(f"{WORKSPACE}/venv/bin/python -m compileall -q {WORKSPACE}/app"),
                           check=False)
    assert compiled.returncode == 0 and compiled.stdout == "", compiled.stdout[-3000:]
    assert cluster.playbook("site.yml").changed_hosts() == []


# Run by the node venv's python: the distributions installed in the venv (not the app on its .pth path) and the
# host's values for the lock's environment markers.
VENV_CONTENTS = """
import importlib.metadata, json, sysconfig
from packaging.markers import default_environment
paths = sorted({sysconfig.get_path("purelib"), sysconfig.get_path("platlib")})
print(json.dumps({"installed": {d.metadata["Name"]: d.version for d in importlib.metadata.distributions(path=paths)},
                  "environment": default_environment()}))
"""


def venv_and_lock(cluster: Cluster, host: str) -> tuple[dict[str, str], dict[str, str]]:
    """The node venv's packages as the job account on `host` finds them, and the lock's packages for that host (its
    markers evaluated there), both {name: version}; venv's own pip and setuptools are left out."""
    script = base64.b64encode(VENV_CONTENTS.encode()).decode()
    found = json.loads(cluster.ssh(host, as_job_user(f"echo {script} | base64 -d | {WORKSPACE}/venv/bin/python -")).stdout)
    installed = {canonicalize_name(name): version for name, version in found["installed"].items()}
    locked = {}
    for requirement, _ in staging.read_lock():
        req = Requirement(requirement)
        if req.marker is None or req.marker.evaluate(found["environment"]):
            locked[canonicalize_name(req.name)] = str(next(iter(req.specifier)).version)
    return {name: version for name, version in installed.items() if name not in ("pip", "setuptools")}, locked


def test_the_node_venv_holds_exactly_the_lock(cluster: Cluster, runs: dict[str, PlaybookRun]) -> None:
    installed, locked = venv_and_lock(cluster, "node2")
    assert installed == locked
    assert {"scikit-learn", "nvidia-cudnn-cu12", "triton", "ogb"} <= set(installed) and "outdated" not in installed


def test_site_brings_a_drifted_venv_back_to_the_lock(cluster: Cluster, runs: dict[str, PlaybookRun]) -> None:
    # A package the lock lacks added, a locked one removed, and the record of the installed pin set stale (as after
    # a kit upgrade that changed the lock).
    pip = f"{WORKSPACE}/venv/bin/pip"
    cluster.ssh("node1", f"{pip} install -q --no-index --find-links {WORKSPACE}/wheelhouse tabulate"
                         f" && {pip} uninstall -q -y scikit-learn"
                         f" && echo stale > {WORKSPACE}/venv/dglkit-requirements/installed.txt")
    installed, locked = venv_and_lock(cluster, "node2")
    assert set(installed) ^ set(locked) == {"tabulate", "scikit-learn"}
    run = cluster.playbook("site.yml")
    assert task_statuses(run.output, "python_env : Remove the packages the lock does not have") == {"node1": {"changed"}}
    installed, locked = venv_and_lock(cluster, "node2")
    assert installed == locked
    assert cluster.playbook("site.yml").changed_hosts() == []


def test_the_job_account_has_the_same_ids_everywhere_and_writes_only_job_data(
        cluster: Cluster, runs: dict[str, PlaybookRun]) -> None:
    for host in cluster.hosts():
        assert cluster.ssh(host, f"id {USER}").stdout.strip() == f"uid={UID}({USER}) gid={UID}({USER}) groups={UID}({USER})"
        attempts = " ".join(f"{WORKSPACE}/{path}" for path in
                            ("jobs/w", "datasets/w", "partitions/w", "venv/w", "venv/bin/w", "app/w", "app/dglkit/w", "w"))
        # touch each path as the account; print which ones it could create, then remove them as root.
        out = cluster.ssh(host, f"for p in {attempts}; do runuser -u {USER} -- touch $p 2>/dev/null && echo $p; done;"
                                f" rm -f {attempts}").stdout.split()
        assert out == [f"{WORKSPACE}/{d}/w" for d in ("jobs", "datasets", "partitions")], (host, out)
    owners = {path: (cluster.workspace / path).stat() for path in ("jobs", "datasets", "partitions", "venv", "app")}
    assert {p: (s.st_uid, s.st_gid) for p, s in owners.items()} == {
        "jobs": (UID, UID), "datasets": (UID, UID), "partitions": (UID, UID), "venv": (0, 0), "app": (0, 0)}


def test_account_ids_taken_on_a_host_are_refused_before_any_change(cluster: Cluster,
                                                                    runs: dict[str, PlaybookRun]) -> None:
    # The account exists everywhere with the default ids; asking for others is an error on every host.
    run = cluster.playbook("site.yml", "-e", f"dglkit_user_uid={UID + 1}", "-e", f"dglkit_user_gid={UID + 1}", check=False)
    assert run.returncode != 0
    assert f"account {USER} exists with uid {UID} and gid {UID}, but the kit needs uid {UID + 1}" in run.flat()
    assert run.changed_hosts() == [], run.recap
    # Another account holds the uid and gid on one host: that host is named, nothing changes anywhere.
    cluster.ssh("node3", f"groupadd -g {UID + 7} squatter && useradd -u {UID + 7} -g squatter squatter")
    try:
        run = cluster.playbook("site.yml", "-e", "dglkit_user=dgltwo", "-e", f"dglkit_user_uid={UID + 7}",
                               "-e", f"dglkit_user_gid={UID + 7}", check=False)
    finally:
        cluster.ssh("node3", "userdel squatter")
    assert run.returncode != 0
    assert (f"node3: uid {UID + 7} belongs to the account squatter: set dglkit_user_uid to a uid that is free on every"
            f" node; gid {UID + 7} belongs to the group squatter") in run.flat(), run.output[-3000:]
    assert run.changed_hosts() == [], run.recap
    for host in cluster.hosts():
        assert cluster.ssh(host, "getent passwd dgltwo", check=False).returncode == 2, host


def test_the_job_account_sshes_node_to_node_with_strict_host_key_checking(cluster: Cluster,
                                                                          runs: dict[str, PlaybookRun]) -> None:
    targets = [name for host in cluster.hosts().items() for name in host]
    for host in cluster.hosts():
        # No DNS on the test network: names work through the kit's ssh_config, addresses directly.
        out = cluster.ssh(host, "; ".join(mesh_ssh(t) for t in targets)).stdout.split()
        assert out == [name for name in cluster.hosts() for _ in range(2)], (host, out)
    # Every node has a key of its own, authorized from the cluster's addresses only, for commands only.
    keys = {host: cluster.ssh(host, f"ssh-keygen -l -f ~{USER}/{MESH_KEY}").stdout.split()[1] for host in cluster.hosts()}
    assert len(set(keys.values())) == len(keys), keys
    addresses = ",".join(sorted(cluster.hosts().values()))
    authorized = cluster.ssh("node2", f"stat -c %a ~{USER}/.ssh/authorized_keys; "
                                      f"grep -v '^#' ~{USER}/.ssh/authorized_keys").stdout
    mode, *lines = authorized.splitlines()
    assert mode == "600" and len(lines) == 3, authorized
    assert all(line.startswith(f'restrict,from="{addresses}" ssh-ed25519 ') for line in lines), lines
    # root gets no mesh: Ansible's account stays Ansible's.
    root = cluster.ssh("node2", "ssh -o BatchMode=yes -o StrictHostKeyChecking=yes node3 true", check=False)
    assert root.returncode == 255 and "Permission denied" in root.stderr, root.stderr


def test_a_mesh_key_is_useless_outside_the_cluster(cluster: Cluster, runs: dict[str, PlaybookRun], tmp_path: Path) -> None:
    key = tmp_path / "stolen"
    key.write_text(cluster.ssh("node2", f"cat ~{USER}/{MESH_KEY}").stdout)
    key.chmod(0o600)
    ssh = (f"ssh -i {key} -o IdentitiesOnly=yes -o BatchMode=yes -o StrictHostKeyChecking=yes "
           f"-o UserKnownHostsFile={cluster.dir / 'ssh/known_hosts'} -o ConnectTimeout=10")
    for host, address in cluster.hosts().items():
        proc = cluster.outsider(f"{ssh} {USER}@{address} hostname")
        # sshd answers (the outsider is on the network) but refuses the key from its address. The methods it
        # still offers after publickey depend on the host's sshd_config (Debian's default adds password).
        assert proc.returncode == 255 and "Permission denied (publickey" in proc.stderr, (host, proc.stderr)


def test_ip_config_matches_the_inventory(cluster: Cluster, runs: dict[str, PlaybookRun]) -> None:
    workers = cluster.groups()["workers"]
    assert (cluster.workspace / "ip_config.txt").read_text().splitlines() == \
        [f"{address} 30050" for address in workers.values()]


def test_dgl_torch_and_the_app_import_at_the_pinned_versions_everywhere(cluster: Cluster,
                                                                        runs: dict[str, PlaybookRun]) -> None:
    script = "import dgl, torch, dglkit; print(dgl.__version__, torch.__version__.split('+')[0], dglkit.__file__)"
    for host in cluster.hosts():
        out = cluster.ssh(host, f'DGLBACKEND=pytorch {WORKSPACE}/venv/bin/python -c "{script}"').stdout.split()
        assert out == [PINS["dgl"], PINS["torch"], f"{WORKSPACE}/app/dglkit/__init__.py"], host


def test_a_bad_inventory_fails_before_any_host_is_changed(cluster: Cluster, runs: dict[str, PlaybookRun]) -> None:
    hosts = yaml.safe_load((cluster.inventory / "hosts.yml").read_text())
    workers = hosts["all"]["children"]["cluster"]["children"]["workers"]["hosts"]
    workers["node3"]["dglkit_cluster_address"] = workers["node2"]["ansible_host"]
    watched = [f"{WORKSPACE}/ip_config.txt", "/etc/ssh/dglkit_known_hosts", "/etc/ssh/ssh_config.d/dglkit.conf"]
    before = {host: mtimes(cluster, host, watched) for host in cluster.hosts()}
    with hosts_file(cluster, yaml.safe_dump(hosts)):
        run = cluster.playbook("site.yml", check=False)
    assert run.returncode != 0
    assert list(run.recap) == ["localhost"]
    assert f"node2 and node3 share the cluster address {workers['node2']['ansible_host']}" in run.output
    assert {host: mtimes(cluster, host, watched) for host in cluster.hosts()} == before
    # An address none of node3's interfaces has: refused from its facts, before any host changes.
    workers["node3"]["dglkit_cluster_address"] = "10.99.0.5"
    with hosts_file(cluster, yaml.safe_dump(hosts)):
        run = cluster.playbook("site.yml", check=False)
    assert run.returncode != 0
    assert re.search(r"node3: cluster address 10\.99\.0\.5 is not an address of this host \(it has [^)]*"
                     + re.escape(workers["node3"]["ansible_host"]), flat(run.output)), run.output[-3000:]
    assert all(counts["changed"] == 0 for counts in run.recap.values()), run.recap
    assert {host: mtimes(cluster, host, watched) for host in cluster.hosts()} == before


def test_storage_host_as_a_worker(cluster: Cluster, runs: dict[str, PlaybookRun]) -> None:
    cluster.up(3, storage_is_worker=True)
    assert list(cluster.groups()["workers"]) == ["node1", "node2", "node3"]
    run = cluster.playbook("site.yml")
    # Only the workspace's ip_config.txt, written on the storage host, has to change.
    assert run.changed_hosts() == ["node1"]
    assert (cluster.workspace / "ip_config.txt").read_text().splitlines() == \
        [f"{address} 30050" for address in cluster.hosts().values()]
    assert cluster.playbook("site.yml").changed_hosts() == []


def test_a_worker_taken_out_of_the_inventory_can_no_longer_log_in(cluster: Cluster,
                                                                   runs: dict[str, PlaybookRun]) -> None:
    assert cluster.ssh("node3", mesh_ssh("node2")).stdout.strip() == "node2"
    hosts = yaml.safe_load((cluster.inventory / "hosts.yml").read_text())
    del hosts["all"]["children"]["cluster"]["children"]["workers"]["hosts"]["node3"]
    with hosts_file(cluster, yaml.safe_dump(hosts)):
        cluster.playbook("site.yml")
    for target in ("node1", "node2"):
        proc = cluster.ssh("node3", mesh_ssh(target), check=False)
        assert proc.returncode == 255 and "Permission denied" in proc.stderr, (target, proc.stderr)
    # --limit cannot shrink the mesh: the run stops before the mesh changes, naming the hosts left out.
    run = cluster.playbook("site.yml", "--limit", "localhost,node1,node2", check=False)
    assert run.returncode != 0
    assert "The SSH mesh spans the whole cluster, but node3 is not in this run" in flat(run.output), run.output[-3000:]
    assert cluster.ssh("node3", mesh_ssh("node2"), check=False).returncode == 255
    cluster.playbook("site.yml")
    assert cluster.ssh("node3", mesh_ssh("node2")).stdout.strip() == "node2"


def test_a_host_that_is_down_stops_the_run_with_its_name(cluster: Cluster, runs: dict[str, PlaybookRun]) -> None:
    with_node3 = (cluster.inventory / "hosts.yml").read_text()
    cluster.remove("node3")
    with hosts_file(cluster, with_node3):
        run = cluster.playbook("site.yml", check=False)
    assert run.returncode != 0
    assert run.recap["node3"]["unreachable"] == 1
    # How SSH words it depends on whether Ansible's persistent connection to node3 was still open.
    reasons = "No route to host|timed out|refused|not responding|Connection reset|Connection closed|Broken pipe"
    assert re.search(rf"fatal: \[node3\]: UNREACHABLE!.*\n(.*\n)*?.*({reasons})", run.output), run.output[-4000:]
    assert all(run.recap[host]["changed"] == 0 for host in ("node1", "node2"))
