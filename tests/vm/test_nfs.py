"""The kit on real kernels with `dglkit_shared_fs: nfs`, the default: site.yml, then a small job.

The storage VM (node1, also a worker) gets nfs_server, node2 nfs_client, and both the job account, firewall and
app from the staged apt repository, as a user's `ansible-playbook -i <inventory> site.yml` runs them; the venv is
already on node1's workspace disk (tests/vm/conftest.py). What `make test` runs of this tier checks what needs a
real kernel (the export, the mount, root_squash, the reboot, the firewall in front of the NFS ports): its site.yml
skips the SSH mesh and the Python environment (`--skip-tags`), whose torch import alone takes minutes under TCG.
The `vm_long` tests (`make test-vm`) run the whole site.yml, twice, and a job. Two VMs rather than three: each
emulated CPU then has a core of its own. The tests run in order on one set of VMs; the job runs last, after the
client's reboot.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.vm import vmlab

pytestmark = pytest.mark.vm

REPO = Path(__file__).resolve().parents[2]
# The shared-workspace stage alone, for the runs after the first.
SHARED_FS = ("--tags", "shared_fs")
# What the NFS tests need: every stage but the SSH mesh and the Python environment (the vm_long tests run the whole).
NFS_STAGES = ("--skip-tags", "ssh_mesh,python_env")
WORKSPACE = vmlab.WORKSPACE
STORAGE, CLIENT = "node1", "node2"
ACCOUNT, ACCOUNT_UID = "dglkit", 30050  # the job account and its default ids
RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)
# Small enough for emulated CPUs: a 2,000-node graph, one server and one trainer per worker, eight epochs of about
# 8 s each under TCG (the start, a torch import per process, takes minutes); validation accuracy climbed 0.16, 0.22,
# 0.27 in the first three.
TINY_JOB = ["-e", "dgl_job_synthetic_nodes=2000", "-e", "dgl_job_synthetic_feat_dim=16", "-e", "dgl_job_epochs=8",
            "-e", "dgl_job_batch_size=50", "-e", "dgl_job_lr=0.05", "-e", "dgl_job_hidden=16",
            "-e", "dgl_job_poll_seconds=10"]


def playbook(inventory: Path, name: str, log: Path, *args: str, check: bool = True) -> tuple[dict[str, int], str]:
    """Runs a playbook (output with task times in `log`); returns changed tasks per host and the output. `check`
    requires success; else failure."""
    cmd = [Path(sys.executable).with_name("ansible-playbook"), "-i", inventory, name, *args]
    env = dict(os.environ, ANSIBLE_CALLBACKS_ENABLED="ansible.posix.profile_tasks", ANSIBLE_NOCOLOR="1")
    with open(log, "w") as out:
        proc = subprocess.run([str(c) for c in cmd], cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=out,
                              stderr=subprocess.STDOUT, timeout=2400)
    output = log.read_text()
    recap = {m.group(1): int(m.group(3)) for m in RECAP.finditer(output)}
    assert set(recap) >= {STORAGE, CLIENT}, output[-2000:]
    if check:
        assert proc.returncode == 0, f"{name} failed (whole output in {log}):\n{output[-4000:]}"
    else:
        assert proc.returncode != 0, f"{name} succeeded (whole output in {log})"
    return recap, output


def site(inventory: Path, log: Path, *args: str, check: bool = True) -> tuple[dict[str, int], str]:
    recap, output = playbook(inventory, "site.yml", log, *args, check=check)
    if check:
        assert "TASK [nfs_server :" in output, "site.yml ran no NFS role: tag its workspace stage shared_fs"
    return recap, output


def exported_to(lab: dict) -> set[str]:
    """The addresses the storage VM's kernel exports the workspace to (exportfs -s: "<dir> <client>(opts)...")."""
    out = vmlab.ssh(STORAGE, "exportfs -s").stdout
    return {client.split("(")[0] for line in out.splitlines() if line.split()[:1] == [WORKSPACE]
            for client in line.split()[1:]}


@pytest.fixture(scope="module")
def first_run(inventory: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, int]:
    """site.yml on fresh VMs, without the stages the NFS tests do not need (NFS_STAGES)."""
    recap, output = site(inventory, tmp_path_factory.mktemp("site") / "first-run.log", *NFS_STAGES)
    assert "TASK [firewall :" in output and "TASK [dgl_app :" in output, "site.yml skipped more than NFS_STAGES"
    return recap


@pytest.fixture(scope="module")
def whole_run(inventory: Path, first_run: dict, tmp_path_factory: pytest.TempPathFactory) -> dict[str, int]:
    """The whole site.yml, as a user runs it (after first_run: the stages it skipped)."""
    recap, output = site(inventory, tmp_path_factory.mktemp("site") / "whole-run.log")
    assert "TASK [python_env :" in output and "TASK [ssh_mesh :" in output, output[-2000:]
    return recap


def test_first_run_sets_up_every_host(first_run: dict[str, int]) -> None:
    assert all(first_run[host] > 0 for host in (STORAGE, CLIENT)), first_run


def test_export_is_restricted_to_the_cluster_hosts(lab: dict, first_run: dict) -> None:
    assert exported_to(lab) == {vm["ip"] for vm in lab["hosts"].values()}


def test_clients_mount_the_workspace_persistently(lab: dict, first_run: dict) -> None:
    source = f"{lab['hosts'][STORAGE]['ip']}:{WORKSPACE}"
    mounted = vmlab.ssh(CLIENT, f"findmnt -n -o SOURCE,FSTYPE {WORKSPACE}").stdout.split()
    assert mounted == [source, "nfs4"]
    in_fstab = vmlab.ssh(CLIENT, f"findmnt --fstab -n -o SOURCE,FSTYPE {WORKSPACE}").stdout.split()
    assert in_fstab == [source, "nfs"]
    for where in ("", "--fstab"):
        options = vmlab.ssh(CLIENT, f"findmnt {where} -n -o OPTIONS {WORKSPACE}").stdout.strip().split(",")
        assert {"nosuid", "nodev"} <= set(options), (where, options)


def test_root_on_a_client_is_not_root_on_the_export(lab: dict, first_run: dict) -> None:
    # A setuid-root program on the export, which a client must not honour.
    vmlab.ssh(STORAGE, f"cp /usr/bin/id {WORKSPACE}/suid-id && chmod 4755 {WORKSPACE}/suid-id")
    before = vmlab.ssh(STORAGE, f"cat {WORKSPACE}/venv/pyvenv.cfg {WORKSPACE}/app/dglkit/__init__.py").stdout
    try:
        # The job account's directory: squashed root writes as that account (the workspace root is root's).
        made = f"{WORKSPACE}/jobs/made-by-root-on-{CLIENT}"
        vmlab.ssh(CLIENT, f"touch {made}")
        # root_squash: root's new file belongs to the job account, and root cannot give it back to root.
        assert vmlab.ssh(STORAGE, f"stat -c %u:%g {made}").stdout.strip() == f"{ACCOUNT_UID}:{ACCOUNT_UID}"
        assert vmlab.ssh(CLIENT, f"chown 0:0 {made}", check=False).returncode != 0
        # The venv and the app that site.yml wrote on the storage host: every node runs them.
        for command in (f"touch {WORKSPACE}/venv/bin/evil", f"touch {WORKSPACE}/app/evil.py",
                        f"echo evil >> {WORKSPACE}/venv/pyvenv.cfg", f"echo evil >> {WORKSPACE}/app/dglkit/__init__.py"):
            denied = vmlab.ssh(CLIENT, command, check=False)
            assert denied.returncode != 0 and "Permission denied" in denied.stderr, (command, denied.stderr)
        # nosuid: the setuid bit gives the job account nothing on a client.
        euid = vmlab.ssh(CLIENT, f"runuser -u {ACCOUNT} -- {WORKSPACE}/suid-id -u").stdout.strip()
        assert euid == str(ACCOUNT_UID), euid
        assert vmlab.ssh(STORAGE, f"cat {WORKSPACE}/venv/pyvenv.cfg {WORKSPACE}/app/dglkit/__init__.py").stdout == before
    finally:
        vmlab.ssh(STORAGE, f"rm -f {WORKSPACE}/suid-id {WORKSPACE}/jobs/made-by-root-on-*")


def test_a_non_empty_mount_point_is_refused_before_any_change(inventory: Path, first_run: dict, tmp_path: Path) -> None:
    other = "/srv/other"
    vmlab.ssh(CLIENT, f"mkdir -p {other} && touch {other}/keep")
    try:
        recap, output = site(inventory, tmp_path / "non-empty.log", *SHARED_FS, "-e", f"dglkit_workspace={other}",
                             check=False)
        flat = " ".join(output.split())
        assert f"{CLIENT}: {other} is not empty (1 entries, e.g. {other}/keep)" in flat, output[-3000:]
        assert all(changed == 0 for changed in recap.values()), recap
        assert vmlab.ssh(STORAGE, f"test -e {other}", check=False).returncode == 1
    finally:
        vmlab.ssh(CLIENT, f"rm -rf {other}")


def test_a_file_written_on_either_side_is_seen_on_the_other(lab: dict, first_run: dict) -> None:
    for writer, reader in ((CLIENT, STORAGE), (STORAGE, CLIENT)):
        token = uuid.uuid4().hex
        # Root on the client is the job account on the export: it writes where the account may.
        path = f"{WORKSPACE}/jobs/vmtest-{writer}-{token}"
        vmlab.ssh(writer, f"echo {token} > {path}")
        try:
            assert vmlab.ssh(reader, f"cat {path}").stdout.strip() == token, f"{reader} reading {writer}'s file"
        finally:
            # Root on the storage host writes as root: left behind, it fails the job test's ownership check.
            vmlab.ssh(STORAGE, f"rm -f {path}", check=False)


def test_a_host_outside_the_cluster_reaches_no_nfs_port_and_is_refused_by_the_export_list(lab: dict, first_run: dict) -> None:
    """A second address on a client, in a network namespace of its own, that neither the firewall nor the export
    list names: the firewall drops its connection, and with the firewall out of the way the export list refuses it."""
    outsider = f"{vmlab.SUBNET}.250"
    assert outsider not in exported_to(lab)
    server = lab["hosts"][STORAGE]["ip"]
    mount = (f"ip netns exec outsider timeout 60 mount -t nfs -o soft,timeo=50,retrans=1,retry=0 "
             f"{server}:{WORKSPACE} /mnt/outsider")
    vmlab.ssh(CLIENT, "ip link add outsider link eth0 type macvlan mode bridge && ip netns add outsider && "
                    "ip link set outsider netns outsider && mkdir -p /mnt/outsider && "
                    f"ip -n outsider addr add {outsider}/24 dev outsider && ip -n outsider link set outsider up")
    try:
        # The server is reachable from there: a refusal below is the firewall or the export list, not the network.
        vmlab.ssh(CLIENT, f"ip netns exec outsider ping -c1 -W5 {server}")
        dropped = vmlab.ssh(CLIENT, mount, check=False)
        assert dropped.returncode != 0 and "access denied" not in dropped.stderr, dropped.stderr
        # Let the outsider through the kit's firewall for a moment: the export list alone must refuse it.
        vmlab.ssh(STORAGE, f"nft insert rule inet dglkit input ip saddr {outsider} accept")
        refused = vmlab.ssh(CLIENT, mount, check=False)
        assert refused.returncode != 0 and "access denied by server" in refused.stderr, refused.stderr
    finally:
        vmlab.ssh(STORAGE, "systemctl restart dglkit-firewall", check=False)  # the rules as site.yml wrote them
        vmlab.ssh(CLIENT, "ip netns delete outsider; rmdir /mnt/outsider", check=False)


@pytest.mark.vm_long  # 6 minutes under TCG; e2e/test_site.py runs the same check on nspawn hosts in CI
def test_second_run_changes_nothing(inventory: Path, whole_run: dict, tmp_path: Path) -> None:
    recap, _ = site(inventory, tmp_path / "second-run.log")
    assert all(changed == 0 for changed in recap.values()), recap


def test_the_mount_comes_back_after_a_client_reboot(lab: dict, first_run: dict) -> None:
    boot_id = vmlab.ssh(CLIENT, "cat /proc/sys/kernel/random/boot_id").stdout
    vmlab.ssh(CLIENT, "systemctl reboot", check=False)
    deadline = time.monotonic() + 420
    while True:
        try:
            again = vmlab.ssh(CLIENT, "cat /proc/sys/kernel/random/boot_id", check=False, timeout=20)
        except subprocess.TimeoutExpired:
            again = None
        if again and again.returncode == 0 and again.stdout != boot_id:
            break
        assert time.monotonic() < deadline, f"{CLIENT} did not come back from its reboot within 420 s"
        time.sleep(3)
    # sshd comes up before the end of boot: wait for systemd to finish it (from fstab) rather than race it.
    vmlab.ssh(CLIENT, "systemctl is-system-running --wait", check=False)
    token = uuid.uuid4().hex
    vmlab.ssh(STORAGE, f"echo {token} > {WORKSPACE}/vmtest-after-reboot")
    assert vmlab.ssh(CLIENT, f"findmnt -n -o FSTYPE {WORKSPACE}").stdout.strip() == "nfs4"
    assert vmlab.ssh(CLIENT, f"cat {WORKSPACE}/vmtest-after-reboot").stdout.strip() == token


@pytest.mark.vm_long  # 20 minutes under TCG: every torch import takes a minute or more
def test_a_job_trains_over_the_root_squashed_export(inventory: Path, whole_run: dict, tmp_path: Path) -> None:
    """train.yml as a user runs it: prepare and partition on the storage VM, then a server and a trainer on each VM,
    the client's reading the venv, the app and the partitions over NFS, as the job account."""
    runs = tmp_path / "runs"
    _, output = playbook(inventory, "playbooks/train.yml", tmp_path / "train.log", "-e", f"dgl_job_run_dir={runs}",
                         *TINY_JOB)
    flat = " ".join(output.split())
    assert re.search(r"succeeded: epoch 8/8 [^\]]*\[node1 succeeded, node2 succeeded\]", flat), output[-4000:]
    folder = Path(re.search(r"run folder: (/[^\s']+)", flat).group(1))
    result = json.loads((folder / "result.json").read_text())
    assert result["num_trainers"] == 2 and result["val_acc"] > 0.3, result  # chance: 0.1
    for node in (STORAGE, CLIENT):
        assert json.loads((folder / "nodes" / node / "status.json").read_text())["state"] == "succeeded", node
    # Everything the job wrote on the export, from either VM, is the job account's.
    owners = vmlab.ssh(STORAGE, f"find {WORKSPACE}/datasets {WORKSPACE}/partitions {WORKSPACE}/jobs "
                                f"-printf '%u %p %TT\\n'").stdout.splitlines()
    foreign = [line for line in owners if not line.startswith(f"{ACCOUNT} ")]
    assert owners and not foreign, "not the job account's (owner, path, mtime):\n" + "\n".join(foreign)
    for host in (STORAGE, CLIENT):
        left = vmlab.ssh(host, f"pgrep -a -u {ACCOUNT}; ls -A /dev/shm", check=False).stdout.strip()
        assert left == "", (host, left)
