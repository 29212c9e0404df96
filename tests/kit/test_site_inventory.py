"""site.yml without test hosts: inventory and platform checks, ip_config.txt and exports rendering.

Real ansible-playbook runs of site.yml against inventories whose hosts are local connections with loopback
addresses, in a network namespace of their own whose loopback has those addresses (the platform check compares
every cluster address with the host's interfaces) and with an /etc/hosts of their own (a name for an address).
`--tags validate` runs only the checks; `--tags ip_config` also renders ip_config.txt into a
temporary workspace; `--tags exports --check --diff` shows the NFS exports the storage host would get.
The runs are independent, so one fixture starts them all at once and the tests read their results.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
LOCAL = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
# root_squash, and root on a client squashed to the job account, never to root.
EXPORT_OPTIONS = "(rw,sync,no_subtree_check,root_squash,anonuid=30050,anongid=30050)"
# The addresses the namespace's loopback has: the test hosts' (127.0.0.1N) and one given by name below.
FIREWALL_ADDRESSES = {f"node{n}": {"dglkit_cluster_address": f"10.77.250.{10 + n}"} for n in (1, 2, 3)}
OWN_ADDRESSES = ([f"127.0.0.{10 + n}" for n in range(1, 10)] + ["127.0.5.2"]
                 + [v["dglkit_cluster_address"] for v in FIREWALL_ADDRESSES.values()])
NAMES = "127.0.9.9 elsewhere.kit.test\n"
# The workspaces of the runs below, each in a directory of its own.
WORK = Path("/var/lib/dglkit-kit-tests")
# $0: a directory of files to bind over /etc's (hosts always; passwd and group for the account checks). A /run
# of its own: site.yml takes its lock there on the storage host, which is this machine for every run at once.
NETNS = ('for f in "$0"/*; do mount --bind "$f" "/etc/${f##*/}"; done; mount -t sysfs sysfs /sys; '
         'mount -t tmpfs tmpfs /run; ip link set lo up; '
         + "".join(f"ip addr add {a}/8 dev lo; " for a in OWN_ADDRESSES) + 'exec "$@"')
# A second account and group holding the job account's ids (useradd -o -u 30050 clash), after the job account.
CLASH = {"passwd": "dglkit:x:30050:30050::/home/dglkit:/bin/sh\nclash:x:30050:30051::/home/clash:/bin/sh\n",
         "group": "dglkit:x:30050:\nclash:x:30051:\nclashers:x:30050:\n"}


@dataclass
class Run:
    returncode: int
    failures: list[str]  # "host: message" of every failed or unreachable task (whitespace collapsed)
    stats: dict[str, dict[str, int]]
    diffs: list[str]  # rendered files that --diff shows
    workspace: Path
    results: dict[str, dict[str, dict]]  # task name -> host -> its result


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


def site(inventory: Path, *args: str, etc: dict[str, str] | None = None, playbook: str = "site.yml") -> Run:
    """PLAYBOOK ARGS in a network and mount namespace of its own; etc: lines added to its /etc files."""
    env = {**os.environ, "ANSIBLE_STDOUT_CALLBACK": "json", "ANSIBLE_NOCOLOR": "1"}
    binds = inventory.parent / "etc"
    binds.mkdir(exist_ok=True)
    for name, lines in {"hosts": NAMES, **(etc or {})}.items():
        (binds / name).write_text(Path("/etc", name).read_text() + lines)
    proc = subprocess.run(["unshare", "--net", "--mount", "--map-root-user", "sh", "-ec", NETNS, binds,
                           BIN / "ansible-playbook", "-i", inventory, playbook, *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    report = json.loads(proc.stdout)
    failures, diffs, results = [], [], {}
    for task in (task for play in report["plays"] for task in play["tasks"]):
        results.setdefault(task["task"]["name"], {}).update(task["hosts"])
        for host, result in task["hosts"].items():
            # A loop's own message only says that items failed; the items say what.
            for item in result.get("results") or [result]:
                if item.get("failed") or item.get("unreachable"):
                    failures.append(f"{host}: " + " ".join(str(item.get("msg", "")).split()))
            diffs += [diff["after"] for diff in result.get("diff", []) if "after" in diff]
    return Run(proc.returncode, failures, report["stats"], diffs, inventory.parent / "ws", results)


# Playbooks whose later plays need what the inventory checks publish on localhost.
LIMITED = ["site.yml", "playbooks/train.yml", "playbooks/preflight.yml"]
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
                    "dglkit_venv_dir '/usr/local' is inside /usr, a system directory"),
    # Below a system directory as well as the directory itself; / by its own rule.
    "etc-workspace": (["node1"], ["node2"], {}, {"dglkit_workspace": "/etc/ssh"},
                      "dglkit_workspace '/etc/ssh' is inside /etc, a system directory: use a directory of its own"),
    "usr-venv": (["node1"], ["node2"], {}, {"dglkit_venv_dir": "/usr/lib/x"},
                 "dglkit_venv_dir '/usr/lib/x' is inside /usr, a system directory"),
    "boot-wheelhouse": (["node1"], ["node2"], {}, {"dglkit_wheelhouse_dir": "/boot/wheels"},
                        "dglkit_wheelhouse_dir '/boot/wheels' is inside /boot, a system directory"),
    "root-workspace": (["node1"], ["node2"], {}, {"dglkit_workspace": "/"},
                       "dglkit_workspace '/' is the root directory: use a directory of its own"),
    "kernel-wheelhouse": (["node1"], ["node2"], {}, {"dglkit_wheelhouse_dir": "/proc/wheels"},
                          "dglkit_wheelhouse_dir '/proc/wheels' is on a kernel or runtime filesystem (/proc)"),
    "missing-wheelhouse-src": (["node1"], ["node2"], {}, {"dglkit_wheelhouse_src": "/nonexistent/wheels"},
                               "dglkit_wheelhouse_src '/nonexistent/wheels' is not a directory of wheels (*.whl) on "
                               "the controller"),
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
# playbooks/remove_node.yml on node1 (storage), node2 and node3 (workers): refused before any host is contacted.
# id -> (extra arguments, expected message)
BAD_REMOVALS = {
    "remove-nothing": ([], "Name the hosts to remove: -e dglkit_remove_nodes=node3"),
    "remove-unknown": (["-e", "dglkit_remove_nodes=node3,node9"],
                       "dglkit_remove_nodes names node9, not in the inventory's cluster group"),
    "remove-storage": (["-e", "dglkit_remove_nodes=node1"],
                       "node1 is the storage host: it holds the workspace every node uses"),
    "remove-every-worker": (["-e", '{"dglkit_remove_nodes": ["node2", "node3"]}'],
                            "Removing node2, node3 leaves no worker: keep at least one"),
}
# Cluster addresses that resolve but are not the host's own: refused by the platform check. id -> (hostvars, message)
BAD_ADDRESSES = {
    "not-on-host": ({"node3": {"dglkit_cluster_address": "10.99.0.5"}},
                    "node3: cluster address 10.99.0.5 is not an address of this host (it has 10.77.250.11,"),
    "name-not-on-host": ({"node2": {"dglkit_cluster_address": "elsewhere.kit.test"}},
                         "node2: cluster address 127.0.9.9 (elsewhere.kit.test) is not an address of this host"),
}


def ip_config_runs(root: Path, inventories: list[tuple[list[str], list[str], dict]]) -> list[Run]:
    """--tags ip_config for each (storage, workers, hostvars) in turn, in one workspace: a resize. The hosts
    share this machine's filesystem, so the workspace is an "existing" shared one (an NFS client would refuse
    to mount over the ip_config.txt of the run before)."""
    runs = []
    for storage, workers, hostvars in inventories:
        runs.append(site(make_inventory(root, storage, workers, hostvars, dglkit_shared_fs="existing"),
                         "--tags", "ip_config"))
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


def leaving_run(root: Path) -> list[Run]:
    """site.yml with node3 leaving (as remove_node.yml runs it): the NFS exports, the firewall set and ip_config.txt
    of the hosts that stay, shown by --check --diff."""
    inventory = make_inventory(root, ["node1"], ["node2", "node3"], dglkit_shared_fs="nfs")
    return [site(inventory, "--tags", "exports,firewall_rules,ip_config", "--check", "--diff", "--limit", "localhost,node1",
                 "-e", "dglkit_remove_nodes=node3", "-e", f"nfs_server_exports_file={root / 'exports.d/dglkit.exports'}")]


@pytest.fixture(scope="module")
def runs() -> Iterator[dict[str, list[Run]]]:
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
        "leaving": leaving_run,
        # The storage host's rules (NFS included), for cluster addresses that the attack test below uses.
        "firewall": lambda root: [site(make_inventory(root, ["node1"], ["node2", "node3"], FIREWALL_ADDRESSES,
                                                      dglkit_shared_fs="nfs"),
                                       "--tags", "firewall_rules", "--check", "--diff", "--limit", "localhost,node1")],
    }
    # The mount task in check mode (no fstab written, nothing mounted), with options that try to allow
    # setuid files and devices on the export.
    jobs["mount-options"] = lambda root: [site(make_inventory(
        root, ["node1"], ["node2", "node3"], dglkit_shared_fs="nfs", nfs_client_mount_options="rw,suid,hard,dev,vers=4.2"),
        "--tags", "nfs_mount", "--check")]
    # Checks only: this is the controller's own root, which a missed clash must not change.
    jobs["uid-clash"] = lambda root: [site(make_inventory(root, ["node1"], ["node2"]), "--tags", "validate", etc=CLASH)]
    for playbook in LIMITED:
        jobs[f"limit-{playbook}"] = lambda root, p=playbook: [site(make_inventory(root, ["node1"], ["node2"]),
                                                                   "--limit", "node1,node2", playbook=p)]
    for case, (storage, workers, hostvars, settings, _) in BAD_INVENTORIES.items():
        jobs[case] = (lambda root, s=storage, w=workers, h=hostvars, o=settings:
                      [site(make_inventory(root, s, w, h, **o))])
    for case, (args, _) in BAD_REMOVALS.items():
        jobs[case] = lambda root, a=args: [site(make_inventory(root, ["node1"], ["node2", "node3"]), *a,
                                                playbook="playbooks/remove_node.yml")]
    for case, (hostvars, _) in BAD_ADDRESSES.items():
        jobs[case] = lambda root, h=hostvars: [site(make_inventory(root, ["node1"], ["node2", "node3"], h))]
    for case, (facts, _) in BAD_PLATFORMS.items():
        jobs[case] = lambda root, f=facts: [site(make_inventory(root, ["node1"], ["node2"]),
                                                 "--limit", "localhost,node2", "-e", json.dumps(f))]
    # Not under /tmp (pytest's base): the inventory check refuses a workspace where every account can create files.
    WORK.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="site-", dir=WORK))
    try:
        with ThreadPoolExecutor(max_workers=4) as pool:
            futures = {case: pool.submit(job, base / case) for case, job in jobs.items()}
            yield {case: future.result() for case, future in futures.items()}
    finally:
        shutil.rmtree(base)


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


@pytest.mark.parametrize("case", BAD_ADDRESSES)
def test_a_cluster_address_that_is_not_the_hosts_own_fails_before_any_change(runs: dict[str, list[Run]],
                                                                             case: str) -> None:
    [run] = runs[case]  # the whole site.yml
    assert run.returncode != 0
    assert run.failures and BAD_ADDRESSES[case][-1] in run.failures[0], run.failures
    assert set(run.stats) == {"localhost", "node1", "node2", "node3"}
    assert all(counts["changed"] == 0 for counts in run.stats.values()), run.stats
    assert not (run.workspace / "ip_config.txt").exists()


def test_another_account_or_group_holding_the_job_accounts_ids_is_refused_on_every_host(
        runs: dict[str, list[Run]]) -> None:
    [run] = runs["uid-clash"]
    assert run.returncode != 0
    assert sorted(run.failures) == [f"{host}: {host}: uid 30050 belongs to the account clash: set dglkit_user_uid to a uid that "
                                    "is free on every node; gid 30050 belongs to the group clashers: set dglkit_user_gid "
                                    "to a gid that is free on every node" for host in ("node1", "node2")], run.failures
    assert all(counts["changed"] == 0 for counts in run.stats.values())


@pytest.mark.parametrize("playbook", LIMITED)
def test_a_limit_without_localhost_says_to_add_it(runs: dict[str, list[Run]], playbook: str) -> None:
    [run] = runs[f"limit-{playbook}"]
    assert run.returncode != 0
    assert run.failures[0] == ("node1: --limit node1,node2 leaves out localhost, where the kit checks the inventory and "
                               "resolves the cluster addresses before it contacts any host: add it, "
                               "--limit 'localhost,node1,node2'"), run.failures
    assert all(counts["changed"] == 0 for counts in run.stats.values())


def test_nfs_clients_mount_with_nosuid_and_nodev_whatever_the_inventory_gives(runs: dict[str, list[Run]]) -> None:
    [run] = runs["mount-options"]
    assert run.returncode == 0 and run.failures == [], run.failures
    mounts = run.results["nfs_client : Mount the workspace now and at boot"]
    # The clients; node1 serves the export.
    assert {host: result["opts"] for host, result in mounts.items() if not result.get("skipped")} == {
        host: "rw,hard,vers=4.2,nosuid,nodev" for host in ("node2", "node3")}


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


@pytest.mark.parametrize("case", BAD_REMOVALS)
def test_a_bad_removal_request_fails_before_any_host_is_contacted(runs: dict[str, list[Run]], case: str) -> None:
    [run] = runs[case]
    assert run.returncode != 0
    assert run.failures and all(f.startswith("localhost: ") for f in run.failures), run.failures
    assert BAD_REMOVALS[case][-1] in run.failures[0], run.failures
    assert set(run.stats) == {"localhost"}


def test_a_leaving_host_is_out_of_the_exports_the_firewall_and_ip_config(runs: dict[str, list[Run]]) -> None:
    [run] = runs["leaving"]
    assert run.returncode == 0 and run.failures == [], run.failures
    assert "node3" not in run.stats, run.stats
    lines = [line.strip() for diff in run.diffs for line in diff.splitlines() if line and not line.startswith("#")]
    assert f"{run.workspace} " + " ".join(f"127.0.0.{n}{EXPORT_OPTIONS}" for n in (11, 12)) in lines, lines
    assert "elements = { 127.0.0.11, 127.0.0.12 }" in lines, lines
    assert "127.0.0.12 30050" in lines and "127.0.0.13 30050" not in lines, lines


# Listens on every port given; prints "ready" once it does.
LISTEN = """
import socket, sys, time
socks = []
for port in sys.argv[1:]:
    sock = socket.socket()
    sock.bind(("0.0.0.0", int(port)))
    sock.listen()
    socks.append(sock)
print("ready", flush=True)
time.sleep(120)
"""
# Connects from a source address to ports of a target; prints {port: "open" | "refused" | "timeout"}.
CONNECT = """
import json, socket, sys
source, target, ports = sys.argv[1], sys.argv[2], sys.argv[3:]
def connect(port):
    try:
        socket.create_connection((target, int(port)), timeout=2, source_address=(source, 0)).close()
        return "open"
    except ConnectionRefusedError:
        return "refused"
    except OSError:
        return "timeout"
print(json.dumps({port: connect(port) for port in ports}))
"""


@pytest.fixture
def netns_pair() -> Iterator[tuple[str, str]]:
    """Two throwaway network namespaces joined by a veth: node1's (10.77.250.11) and a peer's that has a
    cluster node's address (10.77.250.12) and an outsider's (10.77.250.99). No uplink."""
    node, peer = f"dglkit-kit{os.getpid()}-node1", f"dglkit-kit{os.getpid()}-peer"
    setup = [["ip", "netns", "add", node], ["ip", "netns", "add", peer],
             ["ip", "-n", node, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", peer],
             ["ip", "-n", node, "addr", "add", "10.77.250.11/24", "dev", "eth0"],
             ["ip", "-n", peer, "addr", "add", "10.77.250.12/24", "dev", "eth0"],
             ["ip", "-n", peer, "addr", "add", "10.77.250.99/24", "dev", "eth0"]]
    setup += [["ip", "-n", ns, "link", "set", dev, "up"] for ns in (node, peer) for dev in ("lo", "eth0")]
    try:
        for cmd in setup:
            subprocess.run(cmd, check=True, capture_output=True)
        yield node, peer
    finally:
        for ns in (node, peer):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@pytest.mark.skipif(not shutil.which("nft") or os.geteuid() != 0, reason="needs root and nft (apt-get install nftables)")
def test_firewall_rules_let_only_cluster_addresses_reach_the_kits_ports(runs: dict[str, list[Run]], tmp_path: Path,
                                                                       netns_pair: tuple[str, str]) -> None:
    [run] = runs["firewall"]
    assert run.returncode == 0 and run.failures == [] and len(run.diffs) == 1, run.failures
    rules = tmp_path / "firewall.nft"
    rules.write_text(run.diffs[0])
    assert "elements = { 10.77.250.11, 10.77.250.12, 10.77.250.13 }" in run.diffs[0]
    node, peer = netns_pair
    # Loaded twice: the second load must replace the table, not fail or add to it.
    proc = subprocess.run(["ip", "netns", "exec", node, "sh", "-ec",
                           f"nft -f {rules}; nft -f {rules}; nft list table inet dglkit"],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("tcp dport { 111, 2049, 29500, 30050, 32768-60999 }") == 2, proc.stdout
    # DGL server, rendezvous, NFS, rpcbind, a port from the ephemeral range, and one the kit leaves alone.
    ports = ["30050", "29500", "2049", "111", "40000", "5000"]
    listener = subprocess.Popen(["ip", "netns", "exec", node, sys.executable, "-c", LISTEN, *ports],
                                stdout=subprocess.PIPE, text=True)
    try:
        assert listener.stdout.readline().strip() == "ready"
        seen = {source: json.loads(subprocess.run(["ip", "netns", "exec", peer, sys.executable, "-c", CONNECT, source,
                                                   "10.77.250.11", *ports], capture_output=True, text=True,
                                                  timeout=60, check=True).stdout)
                for source in ("10.77.250.12", "10.77.250.99")}
    finally:
        listener.kill()
        listener.wait()
    assert seen["10.77.250.12"] == {port: "open" for port in ports}
    assert seen["10.77.250.99"] == {**{port: "timeout" for port in ports[:-1]}, "5000": "open"}
