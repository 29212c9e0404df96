"""site.yml without test hosts: inventory and platform checks, ip_config.txt and exports rendering.

Real ansible-playbook runs of site.yml against inventories whose hosts are local connections with loopback
addresses. `--tags validate` runs only the checks; `--tags ip_config` also renders ip_config.txt into a
temporary workspace; `--tags exports --check --diff` shows the NFS exports the storage host would get.
The runs are independent, so one fixture starts them all at once and the tests read their results.
"""
import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
LOCAL = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
# root_squash, and root on a client squashed to the job account, never to root.
EXPORT_OPTIONS = "(rw,sync,no_subtree_check,root_squash,anonuid=30050,anongid=30050)"


@dataclass
class Run:
    returncode: int
    failures: list[str]  # "host: message" of every failed or unreachable task (whitespace collapsed)
    stats: dict[str, dict[str, int]]
    diffs: list[str]  # rendered files that --diff shows
    workspace: Path


def make_inventory(root: Path, storage: list[str], workers: list[str], hostvars: dict | None = None,
                   extra_groups: dict | None = None, **settings: object) -> Path:
    """root/inventory with nodeN at 127.0.0.(10+N); the workspace is root/ws."""
    hostvars = hostvars or {}

    def entries(names: list[str]) -> dict:
        return {name: {"ansible_host": f"127.0.0.{10 + int(name[4:])}", **hostvars.get(name, {})}
                for name in names}

    inventory = root / "inventory"
    (inventory / "group_vars/all").mkdir(parents=True, exist_ok=True)
    (root / "ws").mkdir(exist_ok=True)
    (inventory / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {
        "cluster": {"vars": LOCAL, "children": {"storage": {"hosts": entries(storage)},
                                                "workers": {"hosts": entries(workers)}}},
        **(extra_groups or {})}}}, sort_keys=False))
    (inventory / "group_vars/all/kit.yml").write_text(yaml.safe_dump({"dglkit_workspace": str(root / "ws"),
                                                                      **settings}))
    return inventory


def site(inventory: Path, *args: str) -> Run:
    env = {**os.environ, "ANSIBLE_STDOUT_CALLBACK": "json", "ANSIBLE_NOCOLOR": "1"}
    proc = subprocess.run([BIN / "ansible-playbook", "-i", inventory, "site.yml", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    report = json.loads(proc.stdout)
    failures, diffs = [], []
    for task in (task for play in report["plays"] for task in play["tasks"]):
        for host, result in task["hosts"].items():
            # A loop's own message only says that items failed; the items say what.
            for item in result.get("results") or [result]:
                if item.get("failed") or item.get("unreachable"):
                    failures.append(f"{host}: " + " ".join(str(item.get("msg", "")).split()))
            diffs += [diff["after"] for diff in result.get("diff", []) if "after" in diff]
    return Run(proc.returncode, failures, report["stats"], diffs, inventory.parent / "ws")


# id -> (storage, workers, hostvars, settings, expected message)
BAD_INVENTORIES = {
    "no-storage": ([], ["node2"], {}, {}, "No host in group storage: list exactly one host under storage"),
    "two-storage": (["node1", "node2"], ["node3"], {}, {},
                    "2 hosts in group storage (node1, node2): list exactly one host"),
    "no-workers": (["node1"], [], {}, {}, "No host in group workers: list one or more hosts under workers"),
    "duplicate-address": (["node1"], ["node2", "node3"], {"node3": {"ansible_host": "127.0.0.12"}}, {},
                          "node2 and node3 share the cluster address 127.0.0.12: "
                          "give every host its own dglkit_cluster_address"),
    "unresolvable": (["node1"], ["node2"], {"node2": {"dglkit_cluster_address": "node2.invalid"}}, {},
                     "node2: cluster address 'node2.invalid' does not resolve to an IPv4 address on the "
                     "controller: fix dglkit_cluster_address (or ansible_host) of node2"),
    "outside-network": (["node1"], ["node2", "node3"], {"node3": {"dglkit_cluster_address": "127.0.1.13"}},
                        {"dglkit_cluster_network": "127.0.0.0/24"},
                        "node3: cluster address 127.0.1.13 is not in dglkit_cluster_network 127.0.0.0/24: "
                        "set dglkit_cluster_address of node3 to its address on that network"),
    "bad-network": (["node1"], ["node2"], {}, {"dglkit_cluster_network": "127.0.0/33"},
                    "dglkit_cluster_network '127.0.0/33' is not a network"),
    "relative-workspace": (["node1"], ["node2"], {}, {"dglkit_workspace": "srv/dglkit"},
                           "dglkit_workspace 'srv/dglkit' is not an absolute path without spaces"),
    "port-range": (["node1"], ["node2"], {}, {"dglkit_server_port": 70000},
                   "dglkit_server_port '70000' is not a port number from 1024 to 65000"),
    "port-not-a-number": (["node1"], ["node2"], {}, {"dglkit_server_port": "30050x"},
                          "dglkit_server_port '30050x' is not a port number"),
    "bad-shared-fs": (["node1"], ["node2"], {}, {"dglkit_shared_fs": "nfs4"},
                      "dglkit_shared_fs must be one of: nfs, existing"),
    "tmp-workspace": (["node1"], ["node2"], {}, {"dglkit_workspace": "/tmp"},
                      "dglkit_workspace '/tmp' is a system directory: use a directory of its own, e.g. /srv/dglkit"),
    "srv-workspace": (["node1"], ["node2"], {}, {"dglkit_workspace": "/srv"},
                      "dglkit_workspace '/srv' is a system directory"),
    "dotdot-workspace": (["node1"], ["node2"], {}, {"dglkit_workspace": "/srv/../etc"},
                         "dglkit_workspace '/srv/../etc' has an empty, '.' or '..' component: write the real path"),
    "system-venv": (["node1"], ["node2"], {}, {"dglkit_venv_dir": "/usr/local"},
                    "dglkit_venv_dir '/usr/local' is a system directory"),
    "kernel-wheelhouse": (["node1"], ["node2"], {}, {"dglkit_wheelhouse_dir": "/proc/wheels"},
                          "dglkit_wheelhouse_dir '/proc/wheels' is on a kernel or runtime filesystem"),
    "root-user": (["node1"], ["node2"], {}, {"dglkit_user": "root"},
                  "dglkit_user 'root' is a system account: jobs run as an unprivileged account of their own"),
    "bad-user": (["node1"], ["node2"], {}, {"dglkit_user": "DGL kit"}, "dglkit_user 'DGL kit' is not a valid account name"),
    "uid-zero": (["node1"], ["node2"], {}, {"dglkit_user_uid": 0},
                 "dglkit_user_uid '0' is not an id from 1000 to 2147483646 (65534 is nobody): set a number that is free"),
    "gid-nobody": (["node1"], ["node2"], {}, {"dglkit_user_gid": 65534}, "dglkit_user_gid '65534' is not an id from 1000"),
}
# The controller is Debian 12 with Python 3.11; other platforms are given as facts through -e, which
# outranks gathered facts. id -> (facts, expected message)
BAD_PLATFORMS = {
    "os": ({"ansible_distribution": "Ubuntu", "ansible_distribution_version": "20.04"},
           "node2: Ubuntu 20.04 is not supported: the kit runs on Debian 12, Ubuntu 22.04 and Ubuntu 24.04."),
    "python": ({"ansible_python": {"version": {"major": 3, "minor": 13}, "executable": "/usr/bin/python3"}},
               "node2: Python 3.13 (/usr/bin/python3) has no wheels in the 'pypi' pin set, which needs "
               "Python 3.10, 3.11, 3.12"),
}


def ip_config_runs(root: Path, inventories: list[tuple[list[str], list[str], dict]]) -> list[Run]:
    """--tags ip_config for each (storage, workers, hostvars) in turn, in one workspace: a resize."""
    runs = []
    for storage, workers, hostvars in inventories:
        runs.append(site(make_inventory(root, storage, workers, hostvars), "--tags", "ip_config"))
        runs[-1].diffs = (root / "ws/ip_config.txt").read_text().splitlines() if runs[-1].returncode == 0 else []
    return runs


def exports_run(root: Path) -> list[Run]:
    """--check --diff shows the exports file without writing it (or reloading the controller's NFS server)."""
    inventory = make_inventory(root, ["node1"], ["node2", "node3"], dglkit_shared_fs="nfs", extra_groups={
        "monitoring": {"hosts": {"node9": {"ansible_host": "127.0.0.19", **LOCAL}}}})
    run = site(inventory, "--tags", "exports", "--check", "--diff",
               "-e", f"nfs_server_exports_file={root / 'exports.d/dglkit.exports'}")
    assert not (root / "exports.d").exists()
    return [run]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Run]]:
    # case -> job(directory of its own) -> runs
    jobs: dict[str, Callable[[Path], list[Run]]] = {
        "good": lambda root: [site(make_inventory(root, ["node1"], ["node2", "node3"],
                                                  dglkit_cluster_network="127.0.0.0/24"), "--tags", "validate")],
        "unreachable": lambda root: [site(make_inventory(root, ["node1"], ["node2"], {"node2": {
            "ansible_connection": "ssh", "ansible_port": 9, "ansible_ssh_common_args": "-o ConnectTimeout=5"}}))],
        "ip-order": lambda root: ip_config_runs(root, [(["node1"], ["node3", "node2"], {})]),
        "ip-resize": lambda root: ip_config_runs(root, [(["node1"], ["node2", "node3", "node4"], {}),
                                                        (["node1"], ["node3", "node4"], {})]),
        "ip-storage-worker": lambda root: ip_config_runs(root, [(["node1"], ["node1", "node2"], {})]),
        "ip-resolved": lambda root: ip_config_runs(root, [(["node1"], ["node2", "node3"], {
            "node2": {"dglkit_cluster_address": "127.0.5.2"}, "node3": {"dglkit_cluster_address": "localhost"}})]),
        "exports": exports_run,
        "firewall": lambda root: [site(make_inventory(root, ["node1"], ["node2", "node3"]), "--tags", "firewall_rules",
                                       "--check", "--diff", "-e", "dglkit_firewall=true", "--limit", "localhost,node2")],
    }
    for case, (storage, workers, hostvars, settings, _) in BAD_INVENTORIES.items():
        jobs[case] = (lambda root, s=storage, w=workers, h=hostvars, o=settings:
                      [site(make_inventory(root, s, w, h, **o))])
    for case, (facts, _) in BAD_PLATFORMS.items():
        jobs[case] = lambda root, f=facts: [site(make_inventory(root, ["node1"], ["node2"]),
                                                 "--limit", "localhost,node2", "-e", json.dumps(f))]
    base = tmp_path_factory.mktemp("site")
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {case: pool.submit(job, base / case) for case, job in jobs.items()}
        return {case: future.result() for case, future in futures.items()}


def test_a_good_inventory_passes(runs: dict[str, list[Run]]) -> None:
    [run] = runs["good"]
    assert run.returncode == 0 and run.failures == [], run.failures


@pytest.mark.parametrize("case", BAD_INVENTORIES)
def test_a_bad_inventory_fails_before_any_host_is_contacted(runs: dict[str, list[Run]], case: str) -> None:
    [run] = runs[case]  # the whole site.yml: nothing after the checks may run
    assert run.returncode != 0
    assert run.failures and all(f.startswith("localhost: ") for f in run.failures), run.failures
    assert BAD_INVENTORIES[case][-1] in run.failures[0], run.failures
    assert set(run.stats) == {"localhost"}


@pytest.mark.parametrize("case", BAD_PLATFORMS)
def test_an_unsupported_platform_fails_before_any_change(runs: dict[str, list[Run]], case: str) -> None:
    [run] = runs[case]
    assert run.returncode != 0
    assert run.failures and BAD_PLATFORMS[case][-1] in run.failures[0], run.failures
    assert all(counts["changed"] == 0 for counts in run.stats.values())


def test_an_unreachable_host_stops_the_run_with_its_name(runs: dict[str, list[Run]]) -> None:
    # node2 is an SSH host on a loopback port where nothing listens; node1 must not be changed either.
    [run] = runs["unreachable"]
    assert run.returncode != 0
    assert [f for f in run.failures if not f.startswith("node2: ")] == [], run.failures
    assert "127.0.0.12" in run.failures[0] and "reached over ssh" in run.failures[0], run.failures
    assert all(counts["changed"] == 0 for counts in run.stats.values())


@pytest.mark.parametrize("case, expected", [
    ("ip-order", [["127.0.0.13 30050", "127.0.0.12 30050"]]),
    ("ip-resize", [["127.0.0.12 30050", "127.0.0.13 30050", "127.0.0.14 30050"],
                   ["127.0.0.13 30050", "127.0.0.14 30050"]]),
    ("ip-storage-worker", [["127.0.0.11 30050", "127.0.0.12 30050"]]),
    # DGL finds its machine by comparing ip_config's IPs with its interfaces: names must become IPs.
    ("ip-resolved", [["127.0.5.2 30050", "127.0.0.1 30050"]]),
])
def test_ip_config_has_one_line_per_worker_in_inventory_order(runs: dict[str, list[Run]], case: str,
                                                              expected: list[list[str]]) -> None:
    assert [run.failures for run in runs[case]] == [[] for _ in expected]
    assert [run.diffs for run in runs[case]] == expected


def test_exports_list_only_the_cluster_hosts(runs: dict[str, list[Run]]) -> None:
    [run] = runs["exports"]
    assert run.returncode == 0 and run.failures == [], run.failures
    assert len(run.diffs) == 1, run.diffs
    export = [line for line in run.diffs[0].splitlines() if line and not line.startswith("#")]
    assert export == [f"{run.workspace} " + " ".join(f"127.0.0.{n}{EXPORT_OPTIONS}" for n in (11, 12, 13))]


@pytest.mark.skipif(not shutil.which("nft") or os.geteuid() != 0, reason="needs root and nft (apt-get install nftables)")
def test_firewall_rules_load_and_reload_in_a_network_namespace(runs: dict[str, list[Run]], tmp_path: Path) -> None:
    # The test hosts lack CAP_NET_ADMIN, so the rules are loaded into a throwaway namespace here, twice: the
    # second load must replace the table, not fail or add to it.
    [run] = runs["firewall"]
    assert run.returncode == 0 and run.failures == [] and len(run.diffs) == 1, run.failures
    rules = tmp_path / "firewall.nft"
    rules.write_text(run.diffs[0])
    assert "elements = { 127.0.0.11, 127.0.0.12, 127.0.0.13 }" in run.diffs[0]
    proc = subprocess.run(["unshare", "--net", "sh", "-ec", f"nft -f {rules}; nft -f {rules}; nft list table inet dglkit"],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("tcp dport { 29500, 30050-30065, 32768-60999 }") == 2, proc.stdout
