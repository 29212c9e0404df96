"""The VM lab itself: own kernels with nfsd, verified SSH host keys, an isolated network, the staged apt repo."""
from __future__ import annotations

import os
import subprocess

import pytest

from tests.vm import vmlab

pytestmark = pytest.mark.vm


def test_each_vm_has_its_own_verified_host_key(lab: dict, tmp_path) -> None:
    fingerprints = {}
    for host in lab["hosts"]:
        local = vmlab.run(["ssh-keygen", "-lf", vmlab.STATE / "vms" / host / "ssh_host_ed25519_key.pub"]).stdout
        remote = vmlab.ssh(host, "ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub").stdout
        assert remote.split()[1] == local.split()[1], host
        fingerprints[host] = local.split()[1]
    assert len(set(fingerprints.values())) == len(fingerprints)

    # With another VM's key on record for its address, ssh must refuse to talk to the VM.
    first, second = list(lab["hosts"])[:2]
    pub = (vmlab.STATE / "vms" / second / "ssh_host_ed25519_key.pub").read_text()
    wrong = tmp_path / "known_hosts"
    wrong.write_text(f"{lab['hosts'][first]['ip']} {pub}")
    # ssh takes the first value of an option: these override the lab's known_hosts and shared connection.
    override = ["ssh", "-o", f"UserKnownHostsFile={wrong}", "-o", "ControlPath=none"]
    proc = subprocess.run(override + vmlab.ssh_args(lab["hosts"][first]["ip"])[1:] + ["true"], capture_output=True,
                          text=True)
    assert proc.returncode != 0 and "Host key verification failed" in proc.stderr


def test_own_kernel_with_nfsd(lab: dict) -> None:
    for host in lab["hosts"]:
        assert vmlab.ssh(host, "uname -r").stdout.strip() != os.uname().release
        assert vmlab.ssh(host, "hostname").stdout.strip() == host
        out = vmlab.ssh(host, "modprobe nfsd && grep -w nfsd /proc/filesystems && modprobe nfsv4 && echo ok").stdout
        assert out.strip().endswith("ok"), f"{host}: {out}"


def test_network_is_isolated(lab: dict) -> None:
    # The controller's one route into the lab is the VM subnet, and the VMs have none out of it.
    routes = vmlab.run(["ip", "-4", "route", "show", "dev", vmlab.VETH]).stdout.splitlines()
    assert [r.split()[0] for r in routes] == [f"{vmlab.SUBNET}.0/24"]
    ips = [vm["ip"] for vm in lab["hosts"].values()]
    for host in lab["hosts"]:
        assert "default" not in vmlab.ssh(host, "ip -4 route").stdout
        vmlab.ssh(host, " && ".join(f"ping -c1 -W2 {ip} >/dev/null" for ip in ips))


def test_staged_apt_repository_is_readonly_inside(lab: dict) -> None:
    host = list(lab["hosts"])[-1]
    mount = vmlab.ssh(host, "findmnt -n -o FSTYPE,OPTIONS /opt/dglkit-offline/apt").stdout.split()
    assert mount[0] == "9p" and "ro" in mount[1].split(",")
    # Private lists and sources, so the kit's own apt runs later find the VM as it was.
    apt = ("mkdir -p /tmp/apt/lists/partial && "
           f"echo '{vmlab.APT_LINE}' > /tmp/apt/sources.list && "
           "apt-get -o Dir::Etc::SourceList=/tmp/apt/sources.list -o Dir::Etc::SourceParts=- "
           "-o Dir::State::Lists=/tmp/apt/lists")
    vmlab.ssh(host, f"{apt} -qq update")
    out = vmlab.ssh(host, f"{apt} -s install nfs-kernel-server").stdout
    assert "Inst nfs-kernel-server" in out
    vmlab.ssh(host, "rm -rf /tmp/apt")
