"""The test cluster gives the kit what real machines would: SSH with verified host keys, separate hosts,
a shared workspace, an offline apt repository, no way out, and nothing left behind by `down`."""
from __future__ import annotations

import json
import re
import secrets
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

if TYPE_CHECKING:
    from conftest import Cluster


def test_ansible_reaches_every_host_with_verified_keys(cluster: Cluster, tmp_path: Path) -> None:
    proc = cluster.ansible("cluster", "-m", "ping", "-o")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(re.findall(r"^(\S+) \| SUCCESS", proc.stdout, re.M)) == sorted(cluster.hosts())

    playbook = tmp_path / "facts.yml"
    playbook.write_text(yaml.safe_dump([{"hosts": "cluster", "gather_facts": True, "tasks": [
        {"command": "hostname", "register": "out", "changed_when": False},
        {"assert": {"that": ["out.stdout == inventory_hostname",
                             "ansible_default_ipv4 == {} or ansible_default_ipv4.address is not defined",
                             "ansible_host in ansible_all_ipv4_addresses"]}}]}]))
    run = cluster.playbook(str(playbook))
    assert sorted(run.recap) == sorted(cluster.hosts())
    assert run.changed_hosts() == [] and run.failed_hosts() == []
    assert all(counts["ok"] >= 3 for counts in run.recap.values())


def test_wrong_host_key_is_refused(cluster: Cluster, tmp_path: Path) -> None:
    # node2's entry now carries a key node2 does not have: strict checking must refuse the connection.
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "impostor")], check=True)
    impostor = (tmp_path / "impostor.pub").read_text().split()[:2]
    known = [line for line in (cluster.dir / "ssh/known_hosts").read_text().splitlines()
             if not line.startswith("node2,")]
    known.append(f"node2,{cluster.hosts()['node2']} {' '.join(impostor)}")
    (tmp_path / "known_hosts").write_text("\n".join(known) + "\n")
    args = f"-o IdentitiesOnly=yes -o UserKnownHostsFile={tmp_path / 'known_hosts'} -o StrictHostKeyChecking=yes"
    # Fresh connections: a connection master from an earlier test would skip the host key check.
    proc = cluster.ansible("cluster", "-m", "ping", "-o", "-e", json.dumps(
        {"ansible_ssh_common_args": args, "ansible_control_path_dir": str(tmp_path / "cp")}))
    assert proc.returncode != 0
    assert re.search(r"^node2 \| UNREACHABLE", proc.stdout, re.M), proc.stdout
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in proc.stdout and "Host key verification failed" in proc.stdout
    assert re.search(r"^node1 \| SUCCESS", proc.stdout, re.M) and re.search(r"^node3 \| SUCCESS", proc.stdout, re.M)


def test_hosts_are_separate_machines(cluster: Cluster) -> None:
    token = secrets.token_hex(8)
    seen: dict[str, list[str]] = {}
    for host, address in cluster.hosts().items():
        out = cluster.ssh(host, f"hostname; ip -4 -o addr show dev eth0; cat /etc/machine-id; "
                                f"findmnt -n -o SIZE /dev/shm; ls /dev/shm; touch /dev/shm/{token}-{host}").stdout
        hostname, addr, machine_id, shm_size, *shm = out.split("\n")
        assert hostname == host
        assert f" {address}/24 " in addr
        assert re.fullmatch(r"[0-9a-f]{32}", machine_id)
        assert shm_size.strip() == "6G"
        seen[host] = [machine_id] + [f for f in shm if f.startswith(token)]
    # Each host sees only the /dev/shm file written on it (written after its own listing), and none is on
    # the controller's /dev/shm.
    assert all(files[1:] == [] for files in seen.values())
    assert len({files[0] for files in seen.values()}) == len(seen)
    assert not list(Path("/dev/shm").glob(f"{token}-*"))
    listing = cluster.ssh("node2", "ls /dev/shm").stdout.split()
    assert [f for f in listing if f.startswith(token)] == [f"{token}-node2"]
    host_keys = [line.split()[2] for line in (cluster.dir / "ssh/known_hosts").read_text().splitlines()
                 if line.split()[1] == "ssh-ed25519"]
    assert len(host_keys) == len(set(host_keys)) == len(seen)


def test_workspace_is_shared(cluster: Cluster) -> None:
    token = secrets.token_hex(8)
    cluster.ssh("node2", f"echo {token} > /srv/dglkit/shared-{token}")
    assert cluster.ssh("node3", f"cat /srv/dglkit/shared-{token}").stdout.strip() == token
    assert cluster.ssh("node1", f"cat /srv/dglkit/shared-{token}").stdout.strip() == token
    assert (cluster.workspace / f"shared-{token}").read_text().strip() == token
    assert "/srv/dglkit" not in cluster.ssh("node1", "findmnt -n -t overlay -o TARGET").stdout.split()


def test_offline_apt_repository_installs_a_package(cluster: Cluster) -> None:
    settings = yaml.safe_load((cluster.inventory / "group_vars/all/testcluster.yml").read_text())
    # Hosts come with no apt sources of their own: only the kit's offline source can install anything.
    assert cluster.ssh("node3", "grep -rhs '^[^#]' /etc/apt/sources.list /etc/apt/sources.list.d/",
                       check=False).stdout == ""
    assert cluster.ssh("node3", "dpkg -s acl", check=False).returncode != 0
    cluster.ssh("node3", f"echo '{settings['dglkit_apt_repository']}' > /etc/apt/sources.list.d/offline.list && "
                         "apt-get -qq update && DEBIAN_FRONTEND=noninteractive apt-get -qq -y install acl")
    assert "getfacl" in cluster.ssh("node3", "getfacl --version").stdout
    wheels = cluster.ssh("node3", f"ls {settings['dglkit_wheelhouse_dir']}").stdout.split()
    assert any(w.startswith("dgl-2.1.0-") for w in wheels) and any(w.startswith("torch-2.2.1-") for w in wheels)
    assert cluster.ssh("node3", f"touch {settings['dglkit_wheelhouse_dir']}/x", check=False).returncode != 0


def test_no_route_out_of_a_host(cluster: Cluster) -> None:
    state = cluster.state()
    subnet = f"10.77.{state['subnet']}.0/24"
    # `ip route get` asks the routing table only; no packet is sent.
    out = cluster.ssh("node2", "ip -4 route; ip route get 1.1.1.1; ip -6 route get 2606:4700::1111", check=False)
    assert out.stdout.split("\n")[0].split()[0] == subnet and len(out.stdout.strip().split("\n")) == 1
    assert out.stderr.count("Network is unreachable") == 2
    controller = subprocess.run(["ip", "-4", "route", "show", "dev", state["controller_if"]],
                                capture_output=True, text=True, check=True).stdout.strip().split("\n")
    assert [line.split()[0] for line in controller] == [subnet]


def artefacts(name: str) -> list[str]:
    """Everything of cluster `name` visible on this machine: namespaces, links, cgroups, mounts, processes."""
    found = [ns for ns in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
             if ns.startswith(f"dglkit-{name}-")]
    found += [str(p) for p in Path("/sys/fs/cgroup").glob(f"*/dglkit-{name}-*")]
    found += [line for line in Path("/proc/self/mountinfo").read_text().splitlines()
              if f"/dglkit-testcluster/{name}/" in line]
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = proc.joinpath("cmdline").read_text(errors="replace").replace("\0", " ")
        except OSError:
            continue
        found += [f"pid {proc.name}: {cmdline}"] * (f"/dglkit-testcluster/{name}/" in cmdline)
    found += [str(Path("/var/lib/dglkit-testcluster") / name)] * (Path("/var/lib/dglkit-testcluster") / name).exists()
    return found


def test_resize_crash_recovery_and_down_leave_nothing(cluster_factory: Callable[..., Cluster]) -> None:
    small = cluster_factory("harness-cycle", 2)
    link = small.state()["controller_if"]
    assert artefacts(small.name)

    small.up(3, storage_is_worker=True)
    assert small.groups() == {"storage": {"node1": small.hosts()["node1"]}, "workers": small.hosts()}
    assert small.ssh("node3", "hostname").stdout.strip() == "node3"
    small.remove("node2")
    assert list(small.groups()["workers"]) == ["node1", "node3"]
    assert not [a for a in artefacts(small.name) if "node2" in a]

    # A crashed run: the host's nspawn is gone but its systemd, overlay, cgroup and namespace are not.
    pid = int((small.dir / "hosts/node3/nspawn.pid").read_text())
    subprocess.run(["kill", "-KILL", str(pid)], check=True)
    small.up(2)
    assert list(small.hosts()) == ["node1", "node2"]
    assert small.ssh("node2", "systemctl is-system-running --wait").stdout.strip() == "running"

    small.down()
    assert artefacts(small.name) == []
    assert subprocess.run(["ip", "link", "show", "dev", link], capture_output=True).returncode != 0


def test_bad_input_fails_before_anything_changes(testcluster_cli: Callable[..., subprocess.CompletedProcess]) -> None:
    for args, message in [(["up", "--name", "Bad_Name", "--hosts", "2"], "cluster name 'Bad_Name'"),
                          (["up", "--name", "ok", "--hosts", "0"], "--hosts 0"),
                          (["down", "--name", "harness-nosuch", "--host", "node2"], "cluster harness-nosuch has no host node2")]:
        proc = testcluster_cli(*args, check=False)
        assert proc.returncode != 0
        assert proc.stderr.startswith(f"error: {message}") and proc.stderr.count("\n") == 1, proc.stderr
    assert artefacts("Bad_Name") == artefacts("ok") == artefacts("harness-nosuch") == []


def test_boot_timeout_names_the_host(testcluster_cli: Callable[..., subprocess.CompletedProcess]) -> None:
    proc = testcluster_cli("up", "--name", "harness-slow", "--hosts", "1", "--timeout", "0", check=False)
    try:
        assert proc.returncode != 0
        assert re.match(r"error: node1 \(10\.77\.\d+\.11\): sshd did not answer within 0 s .*"
                        r"end of /var/lib/dglkit-testcluster/harness-slow/hosts/node1/console.log:", proc.stderr)
    finally:
        testcluster_cli("down", "--name", "harness-slow")
    assert artefacts("harness-slow") == []



def test_stage_twice_rebuilds_nothing(testcluster_cli: Callable[..., subprocess.CompletedProcess]) -> None:
    first = testcluster_cli("stage")
    root = Path(first.stdout.split()[1])
    before = {p: p.stat().st_mtime_ns for p in [root, root / "etc", Path("/var/cache/dglkit/aptrepo/Packages")]}
    second = testcluster_cli("stage")
    assert second.stdout == first.stdout
    assert "[stage]" not in second.stderr, second.stderr
    assert {p: p.stat().st_mtime_ns for p in before} == before
    assert (root / "etc/machine-id").read_text() == "" and not list(root.glob("etc/ssh/ssh_host_*"))
    assert (root / "etc/apt/sources.list").read_text() == "" and not list(root.glob("etc/apt/sources.list.d/*"))
