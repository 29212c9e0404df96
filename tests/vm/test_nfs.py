"""The kit's NFS roles on real kernels: site.yml's shared-workspace stage with `dglkit_shared_fs: nfs`.

The storage VM (node1) gets nfs_server, node2 and node3 nfs_client, and all three the job account, from the
staged apt repository, exactly as a user's `ansible-playbook -i <inventory> site.yml` runs them. The tests run in order on one set of VMs.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import vmlab

pytestmark = pytest.mark.vm

REPO = Path(__file__).resolve().parents[2]
# The checks and the shared-workspace stage of site.yml; the later stages (Python environment) are not
# what this tier is for and would take an hour under emulation.
SITE_TAGS = "shared_fs"
WORKSPACE = "/srv/dglkit"
STORAGE, CLIENTS = "node1", ("node2", "node3")
ACCOUNT, ACCOUNT_UID = "dglkit", 30050  # the job account and its default ids
RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


def site(inventory: Path, log: Path, *args: str, check: bool = True) -> tuple[dict[str, int], str]:
    """Runs site.yml's shared-workspace stage (output with task times in `log`); returns changed tasks per host
    and the output. `check` requires success and the NFS roles to have run."""
    cmd = [Path(sys.executable).with_name("ansible-playbook"), "-i", inventory, "site.yml", "--tags", SITE_TAGS, *args]
    env = dict(os.environ, ANSIBLE_CALLBACKS_ENABLED="ansible.posix.profile_tasks", ANSIBLE_NOCOLOR="1")
    with open(log, "w") as out:
        proc = subprocess.run([str(c) for c in cmd], cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=out,
                              stderr=subprocess.STDOUT, timeout=1500)
    output = log.read_text()
    recap = {m.group(1): int(m.group(3)) for m in RECAP.finditer(output)}
    assert set(recap) >= {STORAGE, *CLIENTS}, output[-2000:]
    if check:
        assert proc.returncode == 0, f"site.yml failed (whole output in {log}):\n{output[-4000:]}"
        assert "TASK [nfs_server :" in output, f"site.yml ran no NFS role under --tags {SITE_TAGS}: tag its workspace stage"
    else:
        assert proc.returncode != 0, f"site.yml succeeded (whole output in {log})"
    return recap, output


def exported_to(lab: dict) -> set[str]:
    """The addresses the storage VM's kernel exports the workspace to (exportfs -s: "<dir> <client>(opts)...")."""
    out = vmlab.ssh(STORAGE, "exportfs -s").stdout
    return {client.split("(")[0] for line in out.splitlines() if line.split()[:1] == [WORKSPACE]
            for client in line.split()[1:]}


@pytest.fixture(scope="module")
def first_run(inventory: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, int]:
    return site(inventory, tmp_path_factory.mktemp("site") / "first-run.log")[0]


def test_first_run_sets_up_every_host(first_run: dict[str, int]) -> None:
    assert all(first_run[host] > 0 for host in (STORAGE, *CLIENTS)), first_run


def test_export_is_restricted_to_the_cluster_hosts(lab: dict, first_run: dict) -> None:
    assert exported_to(lab) == {vm["ip"] for vm in lab["hosts"].values()}


def test_clients_mount_the_workspace_persistently(lab: dict, first_run: dict) -> None:
    source = f"{lab['hosts'][STORAGE]['ip']}:{WORKSPACE}"
    for host in CLIENTS:
        mounted = vmlab.ssh(host, f"findmnt -n -o SOURCE,FSTYPE {WORKSPACE}").stdout.split()
        assert mounted == [source, "nfs4"], host
        in_fstab = vmlab.ssh(host, f"findmnt --fstab -n -o SOURCE,FSTYPE {WORKSPACE}").stdout.split()
        assert in_fstab == [source, "nfs"], host
        for where in ("", "--fstab"):
            options = vmlab.ssh(host, f"findmnt {where} -n -o OPTIONS {WORKSPACE}").stdout.strip().split(",")
            assert {"nosuid", "nodev"} <= set(options), (host, where, options)


def test_root_on_a_client_is_not_root_on_the_export(lab: dict, first_run: dict) -> None:
    # Root's parts of the workspace as python_env and dgl_app leave them on the storage host (this tier stops
    # before those stages), and a setuid-root program that a client must not honour.
    vmlab.ssh(STORAGE, f"mkdir -p {WORKSPACE}/venv/bin {WORKSPACE}/app && echo x > {WORKSPACE}/app/mod.py && "
                       f"cp /usr/bin/id {WORKSPACE}/suid-id && chmod 4755 {WORKSPACE}/suid-id")
    try:
        for host in CLIENTS:
            # The job account's directory: squashed root writes as that account (the workspace root is root's).
            made = f"{WORKSPACE}/jobs/made-by-root-on-{host}"
            vmlab.ssh(host, f"touch {made}")
            # root_squash: root's new file belongs to the job account, and root cannot give it back to root.
            assert vmlab.ssh(STORAGE, f"stat -c %u:%g {made}").stdout.strip() == f"{ACCOUNT_UID}:{ACCOUNT_UID}", host
            assert vmlab.ssh(host, f"chown 0:0 {made}", check=False).returncode != 0, host
            for target in (f"{WORKSPACE}/venv/bin/python", f"{WORKSPACE}/app/new.py"):
                denied = vmlab.ssh(host, f"touch {target}", check=False)
                assert denied.returncode != 0 and "Permission denied" in denied.stderr, (host, target, denied.stderr)
            denied = vmlab.ssh(host, f"echo evil >> {WORKSPACE}/app/mod.py", check=False)
            assert denied.returncode != 0 and "Permission denied" in denied.stderr, (host, denied.stderr)
            # nosuid: the setuid bit gives the job account nothing on a client.
            euid = vmlab.ssh(host, f"runuser -u {ACCOUNT} -- {WORKSPACE}/suid-id -u").stdout.strip()
            assert euid == str(ACCOUNT_UID), (host, euid)
        assert vmlab.ssh(STORAGE, f"cat {WORKSPACE}/app/mod.py").stdout == "x\n"
    finally:
        vmlab.ssh(STORAGE, f"rm -rf {WORKSPACE}/venv {WORKSPACE}/app {WORKSPACE}/suid-id {WORKSPACE}/jobs/made-by-root-on-*")


def test_a_non_empty_mount_point_is_refused_before_any_change(inventory: Path, first_run: dict, tmp_path: Path) -> None:
    other = "/srv/other"
    vmlab.ssh(CLIENTS[0], f"mkdir -p {other} && touch {other}/keep")
    try:
        recap, output = site(inventory, tmp_path / "non-empty.log", "-e", f"dglkit_workspace={other}", check=False)
        flat = " ".join(output.split())
        assert f"{CLIENTS[0]}: {other} is not empty (1 entries, e.g. {other}/keep)" in flat, output[-3000:]
        assert all(changed == 0 for changed in recap.values()), recap
        assert vmlab.ssh(STORAGE, f"test -e {other}", check=False).returncode == 1
    finally:
        vmlab.ssh(CLIENTS[0], f"rm -rf {other}")


def test_a_file_written_on_each_client_is_seen_everywhere(lab: dict, first_run: dict) -> None:
    for writer, other in (CLIENTS, CLIENTS[::-1]):
        token = uuid.uuid4().hex
        # Root on a client is the job account on the export: it writes where the account may.
        path = f"{WORKSPACE}/jobs/vmtest-{writer}-{token}"
        vmlab.ssh(writer, f"echo {token} > {path}")
        for reader in (STORAGE, other):
            assert vmlab.ssh(reader, f"cat {path}").stdout.strip() == token, f"{reader} reading {writer}'s file"


def test_a_host_outside_the_export_list_is_refused(lab: dict, first_run: dict) -> None:
    """A second address on a client, in a network namespace of its own, that the export list does not name."""
    outsider = f"{vmlab.SUBNET}.250"
    assert outsider not in exported_to(lab)
    server = lab["hosts"][STORAGE]["ip"]
    vmlab.ssh(CLIENTS[1], "ip link add outsider link eth0 type macvlan mode bridge && ip netns add outsider && "
                    "ip link set outsider netns outsider && "
                    f"ip -n outsider addr add {outsider}/24 dev outsider && ip -n outsider link set outsider up")
    try:
        # The server is reachable from there: a refusal below is the export list at work, not the network.
        vmlab.ssh(CLIENTS[1], f"ip netns exec outsider ping -c1 -W5 {server}")
        refused = vmlab.ssh(CLIENTS[1], f"mkdir -p /mnt/outsider && ip netns exec outsider "
                                  f"mount -t nfs -o soft,timeo=50,retrans=1 {server}:{WORKSPACE} /mnt/outsider",
                            check=False)
        assert refused.returncode != 0 and "access denied by server" in refused.stderr, refused.stderr
    finally:
        vmlab.ssh(CLIENTS[1], "ip netns delete outsider; rmdir /mnt/outsider", check=False)


def test_second_run_changes_nothing(inventory: Path, first_run: dict, tmp_path: Path) -> None:
    recap, _ = site(inventory, tmp_path / "second-run.log")
    assert all(changed == 0 for changed in recap.values()), recap


def test_the_mount_comes_back_after_a_client_reboot(lab: dict, first_run: dict) -> None:
    boot_id = vmlab.ssh(CLIENTS[0], "cat /proc/sys/kernel/random/boot_id").stdout
    vmlab.ssh(CLIENTS[0], "systemctl reboot", check=False)
    deadline = time.monotonic() + 420
    while True:
        try:
            again = vmlab.ssh(CLIENTS[0], "cat /proc/sys/kernel/random/boot_id", check=False, timeout=20)
        except subprocess.TimeoutExpired:
            again = None
        if again and again.returncode == 0 and again.stdout != boot_id:
            break
        assert time.monotonic() < deadline, f"{CLIENTS[0]} did not come back from its reboot within 420 s"
        time.sleep(3)
    # sshd comes up before the end of boot: wait for systemd to finish it (from fstab) rather than race it.
    vmlab.ssh(CLIENTS[0], "systemctl is-system-running --wait", check=False)
    token = uuid.uuid4().hex
    vmlab.ssh(STORAGE, f"echo {token} > {WORKSPACE}/vmtest-after-reboot")
    assert vmlab.ssh(CLIENTS[0], f"findmnt -n -o FSTYPE {WORKSPACE}").stdout.strip() == "nfs4"
    assert vmlab.ssh(CLIENTS[0], f"cat {WORKSPACE}/vmtest-after-reboot").stdout.strip() == token
