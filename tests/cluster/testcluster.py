"""A cluster of real Debian hosts on this machine: systemd-nspawn containers booting systemd and sshd.

    python3 tests/cluster/testcluster.py stage
    python3 tests/cluster/testcluster.py up --name NAME --hosts 3 [--storage-is-worker] [--cluster-network]
                                            [--node-dir /opt/dglkit]
    python3 tests/cluster/testcluster.py down --name NAME [--host node3] | down --all
    python3 tests/cluster/testcluster.py shutdown|boot --name NAME --host node3
    python3 tests/cluster/testcluster.py shutdown --cut --name NAME --host node3   # a power cut
    python3 tests/cluster/testcluster.py cap --name NAME --host node2 --memory-mb 900   # 0: no limit
    python3 tests/cluster/testcluster.py status

Each host has an overlay over the cached root, its own network namespace joined by a veth to a bridge
in a namespace of its own (no uplink), its own cgroups (memory: see `cap`), /dev/shm and SSH host keys. The controller (this
namespace) reaches the cluster's /24 through one veth into the bridge. Everything about cluster NAME
lives in /var/lib/dglkit-testcluster/NAME/ (see docs/design.md, "Test cluster").
"""
from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import staging  # a script: its own folder is on the path (clusterclient.py runs it, never imports it)

STATE = Path("/var/lib/dglkit-testcluster")
# Hierarchies systemd uses on a hybrid cgroup machine; each host gets its own group in both.
CGROUP_ROOTS = [Path("/sys/fs/cgroup/systemd"), Path("/sys/fs/cgroup/unified")]
SHM_SIZE = "6g"
NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,23}")
HOSTS_FILE = """127.0.0.1\tlocalhost
127.0.1.1\t{host}
::1\tlocalhost ip6-localhost ip6-loopback
ff02::1\tip6-allnodes
ff02::2\tip6-allrouters
"""


def fail(msg: str) -> None:
    sys.exit(f"error: {msg}")


def log(msg: str) -> None:
    print(f"[testcluster] {msg}", file=sys.stderr, flush=True)


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if check and proc.returncode:
        fail(f"`{' '.join(cmd)}` failed: {proc.stderr.strip()}")
    return proc


def cluster_dir(name: str) -> Path:
    return STATE / name


def netns(name: str, host: str) -> str:
    return f"dglkit-{name}-{host}"


def memory_root() -> Path:
    """The memory cgroup (v1 hierarchy) this process runs in: each host gets a group below it, which its
    container sees as its root (nspawn makes a cgroup namespace), so that `cap` limits a host's memory as a
    container runtime would."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return Path("/sys/fs/cgroup/memory") / path.lstrip("/")
    fail("no cgroup v1 memory hierarchy here (the test hosts use a hybrid cgroup layout)")


def cgroups(name: str, host: str) -> list[Path]:
    return [root / f"dglkit-{name}-{host}" for root in (*CGROUP_ROOTS, memory_root())]


def cap(name: str, host: str, memory_mb: int) -> None:
    """Limit a running host's memory to memory_mb (0: no limit): processes that need more are reclaimed from,
    then OOM-killed inside the host, and what the kit reads as the host's memory shows the limit."""
    state = load_state(name)
    if not state or host not in state["hosts"] or nspawn_pid(name, host) is None:
        fail(f"cluster {name} has no running host {host}; see: status")
    limit = cgroups(name, host)[-1] / "memory.limit_in_bytes"
    limit.write_text(str(memory_mb * 2**20) if memory_mb else "-1")
    log(f"{name}: {host} memory {'limited to ' + str(memory_mb) + ' MB' if memory_mb else 'not limited'}")


def host_num(host: str) -> int:
    return int(host.removeprefix("node"))


def load_state(name: str) -> dict | None:
    path = cluster_dir(name) / "cluster.json"
    return json.loads(path.read_text()) if path.is_file() else None


def save_state(state: dict) -> None:
    (cluster_dir(state["name"]) / "cluster.json").write_text(json.dumps(state, indent=1) + "\n")


def free_subnet(name: str) -> int:
    """Third octet of 10.77.<k>.0/24: stable per name, moved on if another cluster or route has it."""
    taken = {s["subnet"] for s in map(load_state, list_clusters()) if s}
    routes = sh("ip", "-4", "route", "show").stdout
    k = 20 + int(hashlib.sha256(name.encode()).hexdigest(), 16) % 200
    while k in taken or f"10.77.{k}." in routes:
        k = 20 + (k - 19) % 200
    return k


def host_ip(state: dict, host: str) -> str:
    return f"10.77.{state['subnet']}.{10 + host_num(host)}"


def cluster_ip(state: dict, host: str) -> str | None:
    """With --cluster-network, the host's address on the second network (eth1, 10.77.<k>.128/25), which the
    inventory gives as dglkit_cluster_address; the controller keeps reaching the host on eth0."""
    return f"10.77.{state['subnet']}.{130 + host_num(host)}" if state.get("cluster_network") else None


def outsider_ip(state: dict) -> str:
    return f"10.77.{state['subnet']}.250"


def list_clusters() -> list[str]:
    names = {p.name for p in STATE.iterdir() if p.is_dir()} if STATE.is_dir() else set()
    for ns in sh("ip", "netns", "list").stdout.split():
        m = re.fullmatch(r"dglkit-(.+)-(br|out|node\d+)", ns)
        names |= {m.group(1)} if m else set()
    return sorted(names)


def nspawn_pid(name: str, host: str) -> int | None:
    """The host's running systemd-nspawn, if any."""
    pidfile = cluster_dir(name) / "hosts" / host / "nspawn.pid"
    try:
        pid = int(pidfile.read_text())
        comm, rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)
    except (OSError, ValueError):
        return None
    # A zombie ("Z") that nobody has reaped yet is gone too.
    return pid if comm.endswith("(systemd-nspawn") and rest.split()[0] != "Z" else None


def create_network(state: dict) -> None:
    name, k = state["name"], state["subnet"]
    br = netns(name, "br")
    sh("ip", "netns", "add", br)
    sh("ip", "-n", br, "link", "set", "lo", "up")
    sh("ip", "-n", br, "link", "add", "br0", "type", "bridge")
    sh("ip", "-n", br, "link", "set", "br0", "up")
    if state.get("cluster_network"):
        sh("ip", "-n", br, "link", "add", "br1", "type", "bridge")
        sh("ip", "-n", br, "link", "set", "br1", "up")
    sh("ip", "link", "add", state["controller_if"], "type", "veth", "peer", "name", "ctl", "netns", br)
    sh("ip", "-n", br, "link", "set", "ctl", "master", "br0", "up")
    sh("ip", "addr", "add", f"10.77.{k}.1/24", "dev", state["controller_if"])
    sh("ip", "link", "set", state["controller_if"], "up")
    # An outsider: a namespace on the cluster network that is no host of the inventory (tests attack from it).
    out = netns(name, "out")
    sh("ip", "netns", "add", out)
    sh("ip", "-n", out, "link", "set", "lo", "up")
    sh("ip", "link", "add", "eth0", "netns", out, "type", "veth", "peer", "name", "out", "netns", br)
    sh("ip", "-n", br, "link", "set", "out", "master", "br0", "up")
    sh("ip", "-n", out, "addr", "add", f"{outsider_ip(state)}/24", "dev", "eth0")
    sh("ip", "-n", out, "link", "set", "eth0", "up")


def start_host(state: dict, host: str, stage: dict[str, Path]) -> None:
    name = state["name"]
    cdir, hdir = cluster_dir(name), cluster_dir(name) / "hosts" / host
    for sub in ("upper", "work", "root"):
        (hdir / sub).mkdir(parents=True, exist_ok=True)
    root = hdir / "root"
    sh("mount", "-t", "overlay", "overlay", "-o",
       f"lowerdir={stage['root']},upperdir={hdir / 'upper'},workdir={hdir / 'work'}", str(root))
    (root / "etc/hostname").write_text(host + "\n")
    (root / "etc/hosts").write_text(HOSTS_FILE.format(host=host))
    (root / "root/.ssh").mkdir(mode=0o700, exist_ok=True)
    shutil.copy(cdir / "ssh/id_ed25519.pub", root / "root/.ssh/authorized_keys")
    # Host keys are made here, not at boot, so the controller's known_hosts can be written first.
    sh("ssh-keygen", "-A", "-f", str(root))

    ns = netns(name, host)
    sh("ip", "netns", "add", ns)
    sh("ip", "-n", ns, "link", "set", "lo", "up")
    sh("ip", "link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", host, "netns", netns(name, "br"))
    sh("ip", "-n", netns(name, "br"), "link", "set", host, "master", "br0", "up")
    sh("ip", "-n", ns, "addr", "add", f"{host_ip(state, host)}/24", "dev", "eth0")
    sh("ip", "-n", ns, "link", "set", "eth0", "up")
    if cluster_ip(state, host):
        # The /25 is more specific than eth0's /24: traffic between cluster addresses takes eth1.
        sh("ip", "link", "add", "eth1", "netns", ns, "type", "veth", "peer", "name", f"{host}c",
           "netns", netns(name, "br"))
        sh("ip", "-n", netns(name, "br"), "link", "set", f"{host}c", "master", "br1", "up")
        sh("ip", "-n", ns, "addr", "add", f"{cluster_ip(state, host)}/25", "dev", "eth1")
        sh("ip", "-n", ns, "link", "set", "eth1", "up")

    groups = cgroups(name, host)
    for group in groups:
        group.mkdir(exist_ok=True)
    cmd = ["systemd-nspawn", "-b", "-D", str(root), "--register=no", "--keep-unit",
           f"--network-namespace-path=/run/netns/{ns}", f"--machine={ns}", f"--hostname={host}",
           # The host's own network namespace: its firewall (nftables) affects no one else.
           "--capability=CAP_NET_ADMIN",
           "--console=read-only", "--link-journal=no", "--resolv-conf=off",
           f"--tmpfs=/dev/shm:mode=1777,size={SHM_SIZE}",
           f"--bind={cdir / 'workspace'}:/srv/dglkit",
           f"--bind-ro={stage['aptrepo']}:/opt/dglkit-offline/apt",
           f"--bind-ro={stage['wheelhouse']}:/opt/dglkit-offline/wheelhouse"]
    if state.get("node_dir"):
        # A directory of the host's own that the controller can fill with hard links (a per-node venv).
        (hdir / "node-dir").mkdir(exist_ok=True)
        cmd.append(f"--bind={hdir / 'node-dir'}:{state['node_dir']}")

    def join_cgroups() -> None:
        # Without a cgroup of its own, same-named units (ssh.service) of different hosts collide.
        for group in groups:
            (group / "cgroup.procs").write_text(str(os.getpid()))

    with open(hdir / "console.log", "ab") as console:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=join_cgroups)
    (hdir / "nspawn.pid").write_text(str(proc.pid))


def wait_ssh(state: dict, hosts: list[str], timeout: float) -> None:
    """Until every host's sshd sends its banner; on timeout name the host and show its console."""
    deadline = time.monotonic() + timeout
    for host in hosts:
        while True:
            try:
                with socket.create_connection((host_ip(state, host), 22), timeout=1) as conn:
                    if conn.recv(8).startswith(b"SSH-"):
                        break
            except OSError:
                pass
            dead = nspawn_pid(state["name"], host) is None
            if dead or time.monotonic() > deadline:
                console = cluster_dir(state["name"]) / "hosts" / host / "console.log"
                tail = "\n".join(console.read_text(errors="replace").splitlines()[-25:])
                why = "its systemd-nspawn exited" if dead else f"sshd did not answer within {timeout:.0f} s"
                fail(f"{host} ({host_ip(state, host)}): {why} (cluster left for inspection; remove it with "
                     f"down --name {state['name']}); end of {console}:\n{tail}")
            time.sleep(0.2)


def write_access(state: dict) -> None:
    """known_hosts, ssh config and the Ansible inventory for the hosts now in the cluster."""
    cdir = cluster_dir(state["name"])
    hosts = sorted(state["hosts"], key=host_num)
    known, config = [], []
    for host in hosts:
        ip = host_ip(state, host)
        for pub in sorted((cdir / "hosts" / host / "root/etc/ssh").glob("ssh_host_*_key.pub")):
            keytype, key = pub.read_text().split()[:2]
            known.append(f"{host},{ip} {keytype} {key}")
        config.append(f"Host {host}\n  HostName {ip}\n")
    # One user and port per host here, so the host's name tells the connections apart: %C's 40 characters (and
    # ssh's 17 of a temporary name) took a long cluster name's socket path over the 107 a socket may have.
    ssh_opts = {"User": "root", "IdentityFile": cdir / "ssh/id_ed25519", "IdentitiesOnly": "yes",
                "UserKnownHostsFile": cdir / "ssh/known_hosts", "StrictHostKeyChecking": "yes",
                "ControlMaster": "auto", "ControlPersist": "60s", "ControlPath": cdir / "ssh/cp/%h"}
    (cdir / "ssh/known_hosts").write_text("\n".join(known) + "\n")
    (cdir / "ssh/config").write_text("".join(config) + "Host *\n"
                                     + "".join(f"  {k} {v}\n" for k, v in ssh_opts.items()))

    workers = hosts if state["storage_is_worker"] else hosts[1:]
    def group(members: list[str]) -> str:
        return "".join(f"            {h}:\n              ansible_host: {host_ip(state, h)}\n"
                       + (f"              dglkit_cluster_address: {cluster_ip(state, h)}\n" if cluster_ip(state, h) else "")
                       for h in members)
    inventory = cdir / "inventory"
    (inventory / "group_vars/all").mkdir(parents=True, exist_ok=True)
    (inventory / "hosts.yml").write_text(
        f"# Test cluster {state['name']}, written by tests/cluster/testcluster.py.\n"
        "all:\n  children:\n    cluster:\n      children:\n"
        f"        storage:\n          hosts:\n{group(hosts[:1])}"
        f"        workers:\n          hosts:\n{group(workers)}")
    common_args = " ".join(f"-o {k}={ssh_opts[k]}" for k in ("IdentitiesOnly", "UserKnownHostsFile",
                                                              "StrictHostKeyChecking"))
    (inventory / "group_vars/all/testcluster.yml").write_text(
        "# Connection and offline settings of the test cluster, written by tests/cluster/testcluster.py.\n"
        "ansible_user: root\n"
        f"ansible_ssh_private_key_file: {cdir / 'ssh/id_ed25519'}\n"
        f"ansible_ssh_common_args: \"{common_args}\"\n"
        # Connection masters per cluster: a master left from an earlier cluster on the same
        # addresses must never be reused, and `down` closes these.
        f"ansible_control_path_dir: {cdir / 'ssh/cp'}\n"
        "ansible_python_interpreter: /usr/bin/python3\n"
        "dglkit_shared_fs: existing\n"
        "dglkit_workspace: /srv/dglkit\n"
        "dglkit_apt_repository: \"deb [trusted=yes] file:/opt/dglkit-offline/apt ./\"\n"
        "dglkit_wheelhouse_dir: /opt/dglkit-offline/wheelhouse\n")


def raise_inotify_limit(minimum: int = 1024) -> None:
    """Each host's systemd takes inotify instances from the one kernel-wide per-user budget (root's default 128
    runs out at a few dozen hosts: "Too many open files" at boot)."""
    limit = Path("/proc/sys/fs/inotify/max_user_instances")
    if int(limit.read_text()) < minimum:
        limit.write_text(str(minimum))


def up(name: str, count: int, storage_is_worker: bool, timeout: float, cluster_network: bool = False,
       node_dir: str = "") -> None:
    stage = staging.stage()
    raise_inotify_limit()
    state = load_state(name)
    if state and any(nspawn_pid(name, h) is None for h in set(state["hosts"]) - set(state.get("down", []))):
        log(f"cleaning up leftovers of an earlier run of {name}")
        state = None
    if state is None and name in list_clusters():
        down(name)
    if state and cluster_network and not state.get("cluster_network"):
        fail(f"cluster {name} was started without --cluster-network; take it down first")
    if state and node_dir and state.get("node_dir", "") != node_dir:
        fail(f"cluster {name} was started with --node-dir {state.get('node_dir', '')!r}; take it down first")
    if state and len(state["hosts"]) > count:
        fail(f"cluster {name} has {len(state['hosts'])} hosts; remove hosts with: down --name {name} --host nodeK")
    start = time.monotonic()
    if state is None:
        cdir = cluster_dir(name)
        (cdir / "ssh/cp").mkdir(parents=True)
        (cdir / "workspace").mkdir()
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"dglkit-testcluster-{name}",
           "-f", str(cdir / "ssh/id_ed25519"))
        k = free_subnet(name)
        # Written before anything is created, so `down` can find all of it after a crash.
        state = {"name": name, "subnet": k, "controller_if": f"dglkit{k}", "hosts": [],
                 "cluster_network": cluster_network, "node_dir": node_dir}
        save_state(state)
        create_network(state)
    state["storage_is_worker"] = storage_is_worker
    new = [f"node{i}" for i in range(1, count + 1) if f"node{i}" not in state["hosts"]]
    for host in new:
        state["hosts"].append(host)
        save_state(state)
        start_host(state, host, stage)
    write_access(state)
    wait_ssh(state, new, timeout)
    log(f"{name}: {len(new)} host(s) up in {time.monotonic() - start:.1f} s; "
        f"inventory {cluster_dir(name) / 'inventory'}")


def kill_cgroup(groups: list[Path], timeout: float) -> None:
    """SIGKILL everything left in the host's cgroups (nested ones included) and remove them."""
    deadline = time.monotonic() + timeout
    while True:
        pids = {int(p) for g in groups if g.is_dir() for procs in g.rglob("cgroup.procs")
                for p in procs.read_text().split()}
        if not pids:
            break
        if time.monotonic() > deadline:
            fail(f"processes {sorted(pids)} in {groups[0]} survive SIGKILL")
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)
    for group in groups:
        for sub in sorted((p for p in group.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            sub.rmdir()
        if group.is_dir():
            group.rmdir()


def is_mounted(path: Path) -> bool:
    return any(line.split()[4] == str(path) for line in Path("/proc/self/mountinfo").read_text().splitlines())


def close_ssh_masters(name: str) -> None:
    for sock in (cluster_dir(name) / "ssh/cp").glob("*"):
        sh("ssh", "-o", f"ControlPath={sock}", "-O", "exit", "controlmaster", check=False)


def stop_hosts(name: str, hosts: list[str], grace: float = 10.0, keep_disk: bool = False) -> None:
    """Shut hosts down together, then remove all they had: processes, cgroups, overlay mount, namespace (and
    with it the address), and unless keep_disk the host's directory (its root filesystem's changes)."""
    close_ssh_masters(name)
    for host in hosts:
        pid = nspawn_pid(name, host)
        if pid:
            # nspawn turns SIGTERM into an orderly shutdown of the host's systemd.
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(nspawn_pid(name, h) for h in hosts) and time.monotonic() < deadline:
        time.sleep(0.1)
    for host in hosts:
        kill_cgroup(cgroups(name, host), timeout=10)
        root = cluster_dir(name) / "hosts" / host / "root"
        if is_mounted(root):
            sh("umount", str(root))
        if netns(name, host) in sh("ip", "netns", "list").stdout.split():
            sh("ip", "netns", "del", netns(name, host))
        if not keep_disk:
            shutil.rmtree(cluster_dir(name) / "hosts" / host, ignore_errors=True)


def freeze(name: str, host: str) -> None:
    """Stop every process of a host where it is (its cgroup v2 freezer), as the first instant of a power cut:
    nothing it runs takes another step, answers or closes a connection until it is killed."""
    group = CGROUP_ROOTS[-1] / f"dglkit-{name}-{host}"
    if not (group / "cgroup.freeze").is_file():
        fail(f"cluster {name} has no running host {host}; see: status")
    (group / "cgroup.freeze").write_text("1")
    deadline = time.monotonic() + 10
    while "frozen 1" not in (group / "cgroup.events").read_text():
        if time.monotonic() > deadline:
            fail(f"{host} of cluster {name} did not freeze within 10 s")
        time.sleep(0.01)


def power(name: str, host: str, on: bool, timeout: float, cut: bool = False) -> None:
    """Shut a host down keeping its disk, or boot it again: same address, host keys and root filesystem; what
    its systemd enables starts as after a reboot, and its /dev/shm is empty. A cut (the host frozen first, see
    main) kills its processes where they are instead of an orderly shutdown."""
    start = time.monotonic()
    state = load_state(name)
    if not state or host not in state["hosts"]:
        fail(f"cluster {name} has no host {host}; see: status")
    running = nspawn_pid(name, host) is not None
    if on and not running:
        # Leftovers of the shutdown (a namespace whose removal failed) must not stop the boot.
        stop_hosts(name, [host], keep_disk=True)
        start_host(state, host, staging.stage())
        wait_ssh(state, [host], timeout)
    elif not on and running:
        # As long as systemd gives a unit to stop (TimeoutStopSec) before it kills what is left.
        stop_hosts(name, [host], grace=0 if cut else 45, keep_disk=True)
    state["down"] = sorted(set(state.get("down", [])) - {host} | (set() if on else {host}))
    save_state(state)
    log(f"{name}: {host} {'up' if on else 'down'} in {time.monotonic() - start:.1f} s")


def down(name: str, only: str | None = None) -> None:
    start = time.monotonic()
    state = load_state(name)
    if only:
        if not state or only not in state["hosts"]:
            fail(f"cluster {name} has no host {only}; see: status")
        if only == "node1":
            fail("node1 is the storage host; take the whole cluster down instead")
        stop_hosts(name, [only])
        state["hosts"].remove(only)
        state["down"] = [h for h in state.get("down", []) if h != only]
        save_state(state)
        write_access(state)
        log(f"{name}: {only} removed in {time.monotonic() - start:.1f} s")
        return
    # Hosts from the state file and anything a crashed run left without recording it.
    hosts = set(state["hosts"] if state else [])
    hosts |= {p.name for p in (cluster_dir(name) / "hosts").glob("node*")}
    hosts |= {ns.rsplit("-", 1)[1] for ns in sh("ip", "netns", "list").stdout.split()
              if re.fullmatch(rf"dglkit-{re.escape(name)}-node\d+", ns)}
    hosts |= {g.name.rsplit("-", 1)[1] for root in (*CGROUP_ROOTS, memory_root())
              for g in root.glob(f"dglkit-{name}-node*")}
    stop_hosts(name, sorted(hosts, key=host_num))
    # Deleting the bridge namespace would remove the controller's veth too, but only some time later.
    if state and sh("ip", "link", "show", "dev", state["controller_if"], check=False).returncode == 0:
        sh("ip", "link", "del", state["controller_if"])
    for ns in (netns(name, "out"), netns(name, "br")):
        if ns in sh("ip", "netns", "list").stdout.split():
            sh("ip", "netns", "del", ns)
    shutil.rmtree(cluster_dir(name), ignore_errors=True)
    log(f"{name}: down in {time.monotonic() - start:.1f} s")


def status() -> None:
    for name in list_clusters():
        state = load_state(name)
        if not state:
            print(f"{name}: leftovers of a crashed run (clean up with: down --name {name})")
            continue
        print(f"{name}: 10.77.{state['subnet']}.0/24, inventory {cluster_dir(name) / 'inventory'}, "
              f"ssh -F {cluster_dir(name) / 'ssh/config'} <host>, outsider {outsider_ip(state)} "
              f"(ip netns exec {netns(name, 'out')} ...)")
        for host in sorted(state["hosts"], key=host_num):
            print(f"  {host} {host_ip(state, host)}{' cluster ' + cluster_ip(state, host) if cluster_ip(state, host) else ''} "
                  f"{'running' if nspawn_pid(name, host) else 'shut down' if host in state.get('down', []) else 'NOT RUNNING'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("stage", help="build the cached root, apt repository and wheelhouse")
    p_up = sub.add_parser("up", help="start a cluster, or add hosts to a running one")
    p_up.add_argument("--name", required=True)
    p_up.add_argument("--hosts", type=int, required=True, help="number of hosts: node1 (storage) .. nodeN")
    p_up.add_argument("--storage-is-worker", action="store_true", help="list node1 in workers too")
    p_up.add_argument("--cluster-network", action="store_true",
                      help="a second network (eth1 on its own bridge) for node-to-node traffic; the inventory sets "
                           "dglkit_cluster_address to it (kept when the cluster grows)")
    p_up.add_argument("--node-dir", default="", help="bind each host's own hosts/<host>/node-dir at this path "
                      "(kept when the cluster grows): the controller fills it with hard links, e.g. a per-node venv")
    p_up.add_argument("--timeout", type=float, default=120, help="seconds to wait for every sshd")
    p_down = sub.add_parser("down", help="stop a cluster (or one host) and remove everything it made")
    which = p_down.add_mutually_exclusive_group(required=True)
    which.add_argument("--name")
    which.add_argument("--all", action="store_true")
    p_down.add_argument("--host", help="remove only this host, e.g. node3")
    for command, what in (("shutdown", "shut a host down, keeping its disk, address and host keys"),
                          ("boot", "boot a host that was shut down")):
        p_power = sub.add_parser(command, help=what)
        p_power.add_argument("--name", required=True)
        p_power.add_argument("--host", required=True, help="e.g. node3")
        p_power.add_argument("--timeout", type=float, default=120, help="seconds to wait for sshd (boot)")
        if command == "shutdown":
            p_power.add_argument("--cut", action="store_true",
                                 help="a power cut: every process stops at once, no orderly shutdown")
    p_cap = sub.add_parser("cap", help="limit a running host's memory (a memory cgroup limit)")
    p_cap.add_argument("--name", required=True)
    p_cap.add_argument("--host", required=True, help="e.g. node2")
    p_cap.add_argument("--memory-mb", type=int, required=True, help="the limit in MB; 0 removes it")
    sub.add_parser("status", help="list clusters and their hosts")
    args = parser.parse_args()

    if os.geteuid() != 0:
        fail("testcluster needs root (namespaces, mounts, cgroups)")
    STATE.mkdir(parents=True, exist_ok=True)
    if args.command == "shutdown" and args.cut:
        # At once, not after whatever change of another cluster holds the lock: the cut's moment matters.
        freeze(args.name, args.host)
    lock = open(STATE / ".lock", "w")
    if args.command != "status":
        # One change at a time: concurrent runs would pick the same subnet or build the same cache.
        fcntl.flock(lock, fcntl.LOCK_EX)
    if getattr(args, "name", None) and not NAME_RE.fullmatch(args.name):
        fail(f"cluster name {args.name!r}: use 1-24 characters of a-z, 0-9 and '-', starting with a letter or digit")
    if args.command == "stage":
        for what, path in staging.stage().items():
            print(f"{what}: {path}")
    elif args.command == "up":
        if not 1 <= args.hosts <= 50:
            fail(f"--hosts {args.hosts}: give a number of hosts from 1 to 50")
        up(args.name, args.hosts, args.storage_is_worker, args.timeout, args.cluster_network, args.node_dir)
    elif args.command == "down":
        if args.host and args.all:
            fail("--host needs --name, not --all")
        for name in list_clusters() if args.all else [args.name]:
            down(name, args.host)
    elif args.command in ("shutdown", "boot"):
        power(args.name, args.host, args.command == "boot", args.timeout, getattr(args, "cut", False))
    elif args.command == "cap":
        cap(args.name, args.host, args.memory_mb)
    else:
        status()


if __name__ == "__main__":
    main()
