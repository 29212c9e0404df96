"""playbooks/remove_node.yml on real hosts: node1 storage, node2 and node3 workers, the SSH mesh on, node-to-node
traffic on a second network. node3 leaves.

A job that runs refuses the removal (and leaves its unit on the workers once stopped); --check changes nothing;
the removal leaves no trust between node3 and the others in either direction, no kit unit, table or account
access on node3, and the others' mesh, firewall and ip_config.txt without it; a second run changes nothing; with
node3 deleted from the inventory, site.yml changes nothing and a job trains on node2 alone; listed again, node3
comes back with site.yml. The workspace is the test cluster's own shared directory (`dglkit_shared_fs: existing`):
the NFS export and mount parts are not exercised here (the kit tier checks the export list).

The tests run in file order on the jobs cluster (conftest.jobs_cluster), after test_mpi_partition's; the last
brings node3 back for test_home_tampering.
"""
from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import yaml

from jobhelpers import (
    JOBS_SERVER_PORT,
    as_job_user,
    flat,
    ip_config_of_workers,
    mesh_ssh,
    run_folder,
    start_train,
    stop_background,
    train,
)

if TYPE_CHECKING:
    from conftest import Cluster

LEAVER = "node3"
REMOVE = ["playbooks/remove_node.yml", "-e", f"dglkit_remove_nodes={LEAVER}"]
MESH_KEY = "/home/dglkit/.ssh/dglkit_ed25519"
# node3's mesh key as someone who had node3 would keep it, in root's home (the removal leaves root alone).
KEPT_KEY = "/root/kept-mesh-key"
JOB = ["-e", "dgl_job_synthetic_nodes=20000", "-e", "dgl_job_batch_size=100", "-e", "dgl_job_poll_seconds=5",
       "-e", "dgl_job_max_restarts=0"]
# What the removal changes on a host, for the --check comparison.
KIT_STATE = ("cat /home/dglkit/.ssh/authorized_keys /etc/ssh/dglkit_known_hosts /etc/ssh/ssh_config.d/dglkit.conf; "
             "ls -A /home/dglkit/.ssh /etc/dglkit; nft list set inet dglkit cluster; getent passwd dglkit; "
             "systemctl is-enabled dglkit-firewall dglkit-job; ls /etc/systemd/system/dglkit-job.service; true")


@pytest.fixture(scope="module")
def site(jobs_cluster: Cluster) -> Cluster:
    return jobs_cluster


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(autouse=True)
def stop_background_jobs(site: Cluster) -> Iterator[None]:
    yield
    stop_background(site)


def key_ssh(key: str, target: str) -> str:
    """ssh as the job account to target's address with one key alone, whatever host key it shows: whether target
    accepts the key, and nothing else, decides."""
    return (f"ssh -i {key} -o IdentitiesOnly=yes -o BatchMode=yes -o StrictHostKeyChecking=no "
            f"-o UserKnownHostsFile=/dev/null -o ConnectTimeout=10 dglkit@{target} hostname")


def kit_state(cluster: Cluster) -> dict[str, str]:
    return {host: cluster.ssh(host, KIT_STATE + " 2>&1").stdout for host in cluster.hosts()} | {
        "ip_config": (cluster.workspace / "ip_config.txt").read_text()}


def test_a_running_job_is_named_and_nothing_is_removed(site: Cluster, runs: Path) -> None:
    proc = start_train(site, runs, *JOB, "-e", "dgl_job_epochs=1000", "-e", "dgl_job_id=rn-busy")
    deadline = time.time() + 600
    while site.ssh(LEAVER, "systemctl is-active dglkit-job", check=False).stdout.strip() != "active":
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[0][-4000:]
        time.sleep(2)
    before = kit_state(site)
    run = site.playbook(*REMOVE, check=False)
    assert run.returncode != 0
    assert (f"{LEAVER}: dglkit job rn-busy is active (dglkit-job.service): wait for it to end or stop it "
            f"(playbooks/stop.yml) before removing {LEAVER}") in run.flat(), run.output[-3000:]
    assert run.changed_hosts() == [], run.recap
    assert kit_state(site) == before
    stop_background(site)
    # Stopped, the job's unit stays on the workers (disabled) until remove_node.yml takes it off.
    assert site.ssh(LEAVER, "systemctl is-enabled dglkit-job", check=False).stdout.strip() == "disabled"


def test_check_mode_reports_the_removal_and_changes_nothing(site: Cluster) -> None:
    before = kit_state(site)
    run = site.playbook(*REMOVE, "--check")
    assert {"node1", "node2", LEAVER} <= set(run.changed_hosts()), run.recap
    assert f"{LEAVER} would leave the cluster: delete {LEAVER} from the inventory now" in run.flat()
    assert kit_state(site) == before


def test_the_leaving_host_and_the_others_no_longer_trust_each_other(site: Cluster) -> None:
    # The mesh and the firewall know the hosts by their cluster addresses; known_hosts has their inventory ones too.
    addresses, inventory_addresses = site.cluster_addresses(), site.hosts()
    site.ssh(LEAVER, f"install -m 600 {MESH_KEY} {KEPT_KEY}")
    # Before: the mesh works both ways with these commands.
    assert site.ssh("node2", as_job_user(key_ssh(MESH_KEY, addresses[LEAVER]))).stdout.strip() == LEAVER
    assert site.ssh(LEAVER, key_ssh(KEPT_KEY, addresses["node2"])).stdout.strip() == "node2"

    run = site.playbook(*REMOVE)
    assert f"{LEAVER} left the cluster: delete {LEAVER} from the inventory now" in run.flat()

    # The others' keys are refused on node3, and node3's key (kept by whoever had node3) on the others.
    for host in ("node1", "node2"):
        for proc in (site.ssh(host, as_job_user(key_ssh(MESH_KEY, addresses[LEAVER])), check=False),
                     site.ssh(LEAVER, key_ssh(KEPT_KEY, addresses[host]), check=False)):
            assert proc.returncode == 255 and "Permission denied" in proc.stderr, (host, proc.stderr)
    # node3: no job unit, no kit table, unit or rules, no mesh files; the account is locked and its files stay.
    assert site.ssh(LEAVER, "systemctl show -P LoadState dglkit-job dglkit-firewall").stdout.split() == ["not-found"] * 2
    assert site.ssh(LEAVER, "nft list table inet dglkit", check=False).returncode != 0
    gone = "/etc/dglkit/firewall.nft /etc/ssh/dglkit_known_hosts /etc/ssh/ssh_config.d/dglkit.conf /home/dglkit/.ssh"
    assert site.ssh(LEAVER, f"ls -d {gone} 2>/dev/null; true").stdout == ""
    assert ".ansible" in site.ssh(LEAVER, "ls -A /home/dglkit").stdout.split()
    account = flat(site.ssh(LEAVER, "getent passwd dglkit; chage -l dglkit").stdout)
    assert ":/home/dglkit:/usr/sbin/nologin" in account and "Account expires : Jan 02, 1970" in account, account
    # The others: the mesh, the firewall and ip_config.txt without node3.
    for host in ("node1", "node2"):
        authorized = site.ssh(host, "grep -v '^#' /home/dglkit/.ssh/authorized_keys").stdout.splitlines()
        stay = ",".join(sorted([addresses["node1"], addresses["node2"]]))
        assert [line.split()[-1] for line in authorized] == ["node1", "node2"], authorized
        assert all(line.startswith(f'restrict,from="{stay}" ') for line in authorized), authorized
        known = site.ssh(host, "cat /etc/ssh/dglkit_known_hosts /etc/ssh/ssh_config.d/dglkit.conf").stdout
        names = set(re.split(r"[\s,]+", known))
        assert not {LEAVER, addresses[LEAVER], inventory_addresses[LEAVER]} & names, known
        elements = site.ssh(host, "nft list set inet dglkit cluster").stdout
        assert addresses[LEAVER] not in elements and addresses["node2"] in elements, elements
        other = "node2" if host == "node1" else "node1"
        assert site.ssh(host, mesh_ssh(other)).stdout.strip() == other
    assert (site.workspace / "ip_config.txt").read_text().splitlines() == [f"{addresses['node2']} {JOBS_SERVER_PORT}"]


def test_a_second_removal_changes_nothing(site: Cluster) -> None:
    run = site.playbook(*REMOVE)
    assert run.changed_hosts() == [], run.recap


def test_out_of_the_inventory_site_changes_nothing_and_a_job_trains_on_the_rest(site: Cluster, runs: Path) -> None:
    hosts = yaml.safe_load((site.inventory / "hosts.yml").read_text())
    del hosts["all"]["children"]["cluster"]["children"]["workers"]["hosts"][LEAVER]
    (site.inventory / "hosts.yml").write_text(yaml.safe_dump(hosts))
    assert site.playbook("site.yml").changed_hosts() == []
    run = train(site, runs, *JOB, "-e", "dgl_job_epochs=2", "-e", "dgl_job_id=rn-rest")
    folder = run_folder(run.output)
    assert sorted(path.name for path in (folder / "nodes").iterdir()) == ["node2"]
    assert (folder / "result.json").is_file()


def test_the_host_comes_back_with_site_yml(site: Cluster) -> None:
    site.up(3)  # the test cluster's inventory as it was, node3 in it
    site.playbook("site.yml")
    for host, target in (("node2", LEAVER), (LEAVER, "node2")):
        assert site.ssh(host, mesh_ssh(target)).stdout.strip() == target
    assert (site.workspace / "ip_config.txt").read_text().splitlines() == ip_config_of_workers(site)
