"""Debian 12 qemu VMs with their own kernels, for what the nspawn test hosts cannot do (kernel NFS).

    python3 -m tests.vm.vmlab image                         build the cached disk image (no-op when current)
    python3 -m tests.vm.vmlab up --hosts node1,node2,node3  boot VMs (node1: storage), wait for SSH, write an inventory
        [--storage-is-worker] [--workspace-venv DIR]        node1 trains too; give it a workspace disk with DIR as venv/
    python3 -m tests.vm.vmlab down                          stop the VMs, remove taps, namespace and overlays

The image is a raw ext4 disk made from a debootstrap root; its kernel is booted directly (-kernel/-initrd).
Each VM runs on its own qcow2 overlay of that image and gets its identity (host name, SSH host key, address,
the controller's key) from a small seed disk read once at first boot. The VMs sit on a bridge in the network
namespace `dglkit-vm`, which has no uplink; the controller reaches them through a veth whose only route is
the VM subnet. The staged apt repository is shared read-only over virtio-9p at /opt/dglkit-offline/apt.
With --workspace-venv the storage VM's workspace (/srv/dglkit) is a disk of its own, as on a storage host with a
data disk, that already holds the pinned venv which site.yml built on earlier test hosts (tests/cluster/staging.py
venv_seed): installing several GB of wheels under emulation would take most of an hour.
VMs run under KVM when a probe boot shows that it works, else under TCG emulation; DGLKIT_VM_ACCEL=tcg|kvm
skips the probe (15 s where /dev/kvm hangs a kernel).
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from tests.cluster import staging

HERE = Path(__file__).resolve().parent

RECIPE = HERE / "image"
CACHE = staging.CACHE / "vm"
STATE = Path("/var/lib/dglkit-vmlab")
# What a VM needs beyond the nspawn hosts' root: its own kernel, and udev for its disks. And packages that
# site.yml would install, since dpkg takes minutes per package under emulation: python3-venv and nftables (the
# e2e tier's nspawn hosts install them from the staged repository), and nfs-common (the NFS client's package,
# which the server's package depends on: the storage VM still installs nfs-kernel-server from that repository).
VM_PACKAGES = ["linux-image-amd64", "udev", "python3-venv", "nftables", "nfs-common"]
# An initrd with just what finds the root disk: a fifth of the default size, which TCG unpacks much faster.
VM_FINISH = """
echo MODULES=list > etc/initramfs-tools/conf.d/dglkit-vm.conf
printf '%s\\n' virtio_pci virtio_blk ext4 > etc/initramfs-tools/modules
chroot . update-initramfs -u -k all
"""
NETNS, BRIDGE, VETH = "dglkit-vm", "br0", "dglkitvm"
SUBNET = "10.78.0"  # the nspawn harness uses another /24
CONTROLLER_IP = f"{SUBNET}.1"
FIRST_HOST = 11
# A DGL server and a trainer (torch imported in each) on a worker; the job's prepare and partition on storage.
MEMORY_MB = 2048
MAX_HOSTS = 8  # a few hundred MB each, and every one a busy emulated CPU
HOST_NAME = re.compile(r"[a-z][a-z0-9-]{0,30}")
APT_LINE = "deb [trusted=yes] file:/opt/dglkit-offline/apt ./"
WORKSPACE = "/srv/dglkit"  # the kit's default dglkit_workspace
WORKSPACE_DISKS = staging.CACHE / "vm-workspace"
WORKSPACE_LABEL = "dglkit-ws"


def run(cmd: list, **kwargs) -> subprocess.CompletedProcess:
    """Runs a command; on failure raises with its stderr, which says more than the exit code."""
    proc = subprocess.run([str(c) for c in cmd], text=True, capture_output=True, **kwargs)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    return proc


def vm_root() -> Path:
    """The staged host root (tests/cluster/staging.py) plus a kernel and udev, built once and cached."""
    return staging.build_root("vm", staging.HOST_PACKAGES + VM_PACKAGES, staging.HOST_FINISH + VM_FINISH)


def recipe_digest(root: Path) -> str:
    """Hash of everything that goes into the image, so that changing the recipe rebuilds it."""
    digest = hashlib.sha256(root.name.encode())
    for path in sorted(RECIPE.rglob("*")):
        if path.is_file():
            digest.update(str(path.relative_to(RECIPE)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def build_image() -> Path:
    """disk.raw, vmlinuz and initrd.img under the cache, built when the recipe changed (a few minutes)."""
    root = vm_root()
    out = CACHE / recipe_digest(root)
    if (out / "disk.raw").exists():
        return out
    started = time.monotonic()
    work = CACHE / "build"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    tree = work / "root"
    run(["cp", "-a", root, tree])
    shutil.copytree(RECIPE / "rootfs", tree, dirs_exist_ok=True, symlinks=True)
    (tree / "opt/dglkit-offline/apt").mkdir(parents=True)
    run(["systemctl", "--root", tree, "enable", "dglkit-seed.service", "systemd-networkd.service"])
    run(["systemctl", "--root", tree, "mask", "e2scrub_reap.service"])  # half a minute of a TCG boot, no use here
    shutil.copy(max((tree / "boot").glob("vmlinuz-*")), work / "vmlinuz")
    shutil.copy(max((tree / "boot").glob("initrd.img-*")), work / "initrd.img")
    run(["mkfs.ext4", "-q", "-L", "dglkit-root", "-d", tree, work / "disk.raw", "4G"])
    shutil.rmtree(tree)
    for old in CACHE.iterdir():
        if old != work:
            shutil.rmtree(old)
    work.rename(out)
    print(f"vmlab: image {out} built in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return out


def host_python() -> str:
    """`python3 -V` of the VMs' Debian: with the pins, it names the venv seed that fits them."""
    return run(["chroot", vm_root(), "python3", "-V"]).stdout.strip()


def workspace_disk(venv: Path) -> Path:
    """A raw ext4 disk holding `venv` as venv/ and room for a small job's data, built once per venv."""
    disk = WORKSPACE_DISKS / f"{venv.name}.raw"
    if disk.exists():
        return disk
    started = time.monotonic()
    shutil.rmtree(WORKSPACE_DISKS, ignore_errors=True)
    tree = WORKSPACE_DISKS / "build"
    tree.mkdir(parents=True)
    run(["cp", "-al", venv, tree / "venv"])
    size_mb = int(run(["du", "-sm", tree]).stdout.split()[0]) + 3072
    partial = disk.with_suffix(".partial")
    run(["mkfs.ext4", "-q", "-L", WORKSPACE_LABEL, "-d", tree, partial, f"{size_mb}M"])
    shutil.rmtree(tree)
    partial.rename(disk)
    print(f"vmlab: workspace disk {disk} built in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return disk


def kvm_boots(image: Path) -> bool:
    """True when a kernel boots under KVM here: some hypervisors expose /dev/kvm but hang a stock kernel.

    With no root disk the kernel panics right after boot, and -no-reboot turns the panic into qemu's exit,
    so a kernel that gets that far within seconds proves KVM works.
    """
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return False
    cmd = ["qemu-system-x86_64", "-accel", "kvm", "-m", "256", "-nodefaults", "-no-user-config",
           "-display", "none", "-serial", "stdio", "-no-reboot", "-kernel", image / "vmlinuz",
           "-append", "console=ttyS0 panic=-1"]
    try:
        proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=15)
    except subprocess.TimeoutExpired:
        return False
    return "Kernel panic" in proc.stdout


def accelerator(image: Path) -> str:
    """DGLKIT_VM_ACCEL (tcg or kvm) if set, which skips the probe; else KVM when a probe boot works."""
    chosen = os.environ.get("DGLKIT_VM_ACCEL", "")
    if chosen not in ("", "tcg", "kvm"):
        raise RuntimeError(f"DGLKIT_VM_ACCEL={chosen!r}: set it to tcg or kvm, or unset it to probe")
    return chosen or ("kvm" if kvm_boots(image) else "tcg")


def address(index: int) -> str:
    return f"{SUBNET}.{FIRST_HOST + index}"


def seed_archive(host: str, ip: str, host_key: Path, controller_pub: str) -> bytes:
    """The tar archive the VM unpacks over / at first boot (see image/rootfs/.../dglkit-seed.service)."""
    files = {
        "etc/hostname": (f"{host}\n", 0o644),
        "etc/hosts": (f"127.0.0.1 localhost\n127.0.1.1 {host}\n", 0o644),  # as a stock Debian install
        "etc/systemd/network/10-lab.network": (f"[Match]\nName=eth0\n\n[Network]\nAddress={ip}/24\n", 0o644),
        "etc/ssh/ssh_host_ed25519_key": (host_key.read_text(), 0o600),
        "etc/ssh/ssh_host_ed25519_key.pub": (host_key.with_suffix(".pub").read_text(), 0o644),
        "root/.ssh/authorized_keys": (controller_pub, 0o600),
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        dir_info = tarfile.TarInfo("root/.ssh")
        dir_info.type, dir_info.mode = tarfile.DIRTYPE, 0o700
        tar.addfile(dir_info)
        for name, (text, mode) in files.items():
            info = tarfile.TarInfo(name)
            data = text.encode()
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def ssh_options() -> list[str]:
    """Options that check a VM's host key against the one generated for it (also Ansible's)."""
    return ["-o", f"UserKnownHostsFile={STATE / 'ssh/known_hosts'}", "-o", "StrictHostKeyChecking=yes",
            "-o", "BatchMode=yes", "-o", "ConnectTimeout=5"]


def ssh_args(host_ip: str) -> list[str]:
    """ssh to a VM as root. Connections are shared: a key exchange costs seconds on an emulated CPU."""
    return (["ssh", "-i", str(STATE / "ssh/id_ed25519")] + ssh_options()
            + ["-o", "ControlMaster=auto", "-o", f"ControlPath={STATE / 'ssh/%h.sock'}", "-o", "ControlPersist=30",
               f"root@{host_ip}"])


def lab() -> dict:
    """The running lab: {"hosts": {name: {"ip", "pid"}}, "storage", "accel", "boot_seconds"}."""
    path = STATE / "lab.json"
    if not path.exists():
        raise RuntimeError(f"no VM lab is up ({path} missing): run vmlab.py up first")
    return json.loads(path.read_text())


def ssh(host: str, command: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
    # Its own stdin: ssh makes its stdin non-blocking, and one killed at the timeout would leave ours so.
    proc = subprocess.run(ssh_args(lab()["hosts"][host]["ip"]) + [command], text=True, capture_output=True,
                          stdin=subprocess.DEVNULL, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{host}: `{command}` exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    return proc


def setup_network() -> None:
    if Path(f"/run/netns/{NETNS}").exists() or Path(f"/sys/class/net/{VETH}").exists():
        raise RuntimeError(f"network namespace {NETNS} or link {VETH} already exists: run vmlab.py down first")
    run(["ip", "netns", "add", NETNS])
    run(["ip", "-n", NETNS, "link", "set", "lo", "up"])
    run(["ip", "-n", NETNS, "link", "add", BRIDGE, "type", "bridge"])
    run(["ip", "-n", NETNS, "link", "set", BRIDGE, "up"])
    run(["ip", "link", "add", VETH, "type", "veth", "peer", "name", "uplink", "netns", NETNS])
    run(["ip", "-n", NETNS, "link", "set", "uplink", "master", BRIDGE, "up"])
    # The /24 on the veth gives the controller a route to the VM subnet and nowhere else.
    run(["ip", "addr", "add", f"{CONTROLLER_IP}/24", "dev", VETH])
    run(["ip", "link", "set", VETH, "up"])


def start_vm(index: int, host: str, image: Path, aptrepo: Path, accel: str, controller_pub: str,
             data_disk: Path | None) -> dict:
    vm_dir = STATE / "vms" / host
    vm_dir.mkdir(parents=True)
    ip = address(index)
    host_key = vm_dir / "ssh_host_ed25519_key"
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{host}", "-f", host_key])
    with open(STATE / "ssh/known_hosts", "a") as known_hosts:
        known_hosts.write(f"{ip} {host_key.with_suffix('.pub').read_text()}")
    seed = vm_dir / "seed.tar"
    seed.write_bytes(seed_archive(host, ip, host_key, controller_pub))
    overlay = vm_dir / "disk.qcow2"
    run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", image / "disk.raw", overlay])
    data_drive = []
    if data_disk:
        data_overlay = vm_dir / "data.qcow2"
        run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", data_disk, data_overlay])
        data_drive = ["-drive", f"file={data_overlay},if=virtio,format=qcow2"]
    tap = f"vm{index}"
    run(["ip", "-n", NETNS, "tuntap", "add", "dev", tap, "mode", "tap"])
    run(["ip", "-n", NETNS, "link", "set", tap, "master", BRIDGE, "up"])
    run(["ip", "netns", "exec", NETNS, "qemu-system-x86_64", "-name", host, "-accel", accel,
         "-m", str(MEMORY_MB), "-smp", "1", "-nodefaults", "-no-user-config", "-display", "none",
         "-serial", f"file:{vm_dir / 'console.log'}",
         "-kernel", image / "vmlinuz", "-initrd", image / "initrd.img",
         "-append", "root=/dev/vda rw console=ttyS0 net.ifnames=0 quiet mitigations=off",
         "-drive", f"file={overlay},if=virtio,format=qcow2",
         "-drive", f"file={seed},if=virtio,format=raw,readonly=on", *data_drive,
         "-netdev", f"tap,id=net0,ifname={tap},script=no,downscript=no",
         "-device", f"virtio-net-pci,netdev=net0,mac=52:54:00:78:00:{FIRST_HOST + index:02x}",
         "-virtfs", f"local,path={aptrepo},mount_tag=aptrepo,security_model=none,readonly=on",
         "-device", "virtio-rng-pci", "-daemonize", "-pidfile", vm_dir / "qemu.pid"])
    return {"ip": ip, "pid": int((vm_dir / "qemu.pid").read_text())}


def wait_for_ssh(hosts: dict, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    waiting = dict(hosts)
    while waiting:
        for host, vm in list(waiting.items()):
            if not Path(f"/proc/{vm['pid']}").exists():
                raise RuntimeError(f"VM {host} (qemu pid {vm['pid']}) exited during boot; "
                                   f"see {STATE / 'vms' / host / 'console.log'}")
            try:
                if subprocess.run(ssh_args(vm["ip"]) + ["true"], capture_output=True, stdin=subprocess.DEVNULL,
                                  timeout=60).returncode == 0:
                    del waiting[host]
            except subprocess.TimeoutExpired:
                pass  # sshd accepted but the VM is still too busy booting to finish the handshake
        if waiting and time.monotonic() > deadline:
            raise RuntimeError(f"no SSH from {', '.join(waiting)} within {timeout:.0f} s; "
                               f"see the console logs under {STATE / 'vms'}")
        time.sleep(2)


def write_inventory(hosts: dict, storage_is_worker: bool) -> None:
    """An inventory of the kit's groups: the first host is the storage host, the others (and with
    storage_is_worker the first too) are workers."""
    names = list(hosts)
    workers = names if storage_is_worker else names[1:]
    inventory = STATE / "inventory"
    (inventory / "group_vars/all").mkdir(parents=True)
    spec = {"all": {"children": {"cluster": {"children": {
        "storage": {"hosts": {names[0]: {"ansible_host": hosts[names[0]]["ip"]}}},
        "workers": {"hosts": {n: {"ansible_host": hosts[n]["ip"]} for n in workers}}}}}}}
    (inventory / "hosts.yml").write_text(json.dumps(spec, indent=2) + "\n")
    settings = {"ansible_user": "root", "ansible_ssh_private_key_file": str(STATE / "ssh/id_ed25519"),
                "ansible_ssh_common_args": " ".join(ssh_options()), "ansible_python_interpreter": "/usr/bin/python3",
                "dglkit_shared_fs": "nfs", "dglkit_apt_repository": APT_LINE}
    (inventory / "group_vars/all/vmlab.yml").write_text(json.dumps(settings, indent=2) + "\n")


def mount_workspace(host: str) -> None:
    """Mounts the workspace disk where the kit expects the workspace, now and at every boot."""
    ssh(host, f"mkdir -p {WORKSPACE} && echo 'LABEL={WORKSPACE_LABEL} {WORKSPACE} ext4 defaults 0 2' >> /etc/fstab "
              f"&& systemctl daemon-reload && mount {WORKSPACE}")


def up(host_names: list[str], timeout: float, workspace_venv: Path | None = None, storage_is_worker: bool = False) -> dict:
    if STATE.exists():
        raise RuntimeError(f"a VM lab is already up ({STATE} exists): run vmlab.py down first")
    image = build_image()
    data_disk = workspace_disk(workspace_venv) if workspace_venv else None
    accel = accelerator(image)
    (STATE / "ssh").mkdir(parents=True)
    hosts: dict = {}
    state = {"accel": accel, "storage": host_names[0], "hosts": hosts}
    try:
        (STATE / "lab.json").write_text(json.dumps(state, indent=2))
        # A hard-linked snapshot: re-staging the repository while VMs run must not pull it from under them.
        aptrepo = STATE / "aptrepo"
        run(["cp", "-al", staging.build_aptrepo(staging.host_root()), aptrepo])
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "dglkit-vmlab", "-f", STATE / "ssh/id_ed25519"])
        controller_pub = (STATE / "ssh/id_ed25519.pub").read_text()
        setup_network()
        started = time.monotonic()
        for index, host in enumerate(host_names):
            hosts[host] = start_vm(index, host, image, aptrepo, accel, controller_pub, data_disk if index == 0 else None)
            (STATE / "lab.json").write_text(json.dumps(state, indent=2))
        wait_for_ssh(hosts, timeout)
        state["boot_seconds"] = round(time.monotonic() - started, 1)
        (STATE / "lab.json").write_text(json.dumps(state, indent=2))
        if data_disk:
            mount_workspace(host_names[0])
        write_inventory(hosts, storage_is_worker)
    except BaseException:
        down()
        raise
    return state


def stop_process(pid: int) -> None:
    """SIGTERM, then SIGKILL after 10 s. For qemu a power-off: nothing in a VM needs to survive."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    if Path(f"/proc/{pid}").exists():
        os.kill(pid, signal.SIGKILL)


def lab_processes() -> list[int]:
    """Processes whose command line names the lab's files: qemu, and SSH connections (ours and Ansible's)."""
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if str(STATE).encode() in (proc / "cmdline").read_bytes() and int(proc.name) != os.getpid():
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def leftovers() -> list[str]:
    found = [f"process {pid}" for pid in lab_processes()]
    found += [f"network namespace {NETNS}"] if Path(f"/run/netns/{NETNS}").exists() else []
    found += [f"link {VETH}"] if Path(f"/sys/class/net/{VETH}").exists() else []
    found += [f"route {r}" for r in run(["ip", "-4", "route", "show", f"{SUBNET}.0/24"]).stdout.splitlines()]
    return found + ([str(STATE)] if STATE.exists() else [])


def down() -> None:
    """Stops clients before the storage host (a client whose NFS server is gone hangs), then everything else."""
    storage = json.loads((STATE / "lab.json").read_text())["storage"] if (STATE / "lab.json").exists() else ""
    for pid_file in sorted((STATE / "vms").glob("*/qemu.pid"), key=lambda p: p.parent.name == storage):
        stop_process(int(pid_file.read_text()))
    for pid in lab_processes():
        stop_process(pid)
    if Path(f"/run/netns/{NETNS}").exists():
        run(["ip", "netns", "delete", NETNS])  # takes the bridge, taps and the veth pair with it
    if Path(f"/sys/class/net/{VETH}").exists():
        run(["ip", "link", "delete", VETH])
    shutil.rmtree(STATE, ignore_errors=True)
    left = leftovers()
    if left:
        raise RuntimeError(f"vmlab down left {', '.join(left)} behind")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("image", help="build the cached disk image unless it is current")
    up_parser = sub.add_parser("up", help="boot VMs (the first is the storage host) and wait for SSH")
    up_parser.add_argument("--hosts", default="node1,node2,node3", help="comma-separated host names")
    up_parser.add_argument("--timeout", type=float, default=420, help="seconds to wait for SSH")
    up_parser.add_argument("--workspace-venv", type=Path, help="a venv for the storage VM's workspace disk")
    up_parser.add_argument("--storage-is-worker", action="store_true", help="the storage VM is a worker too")
    sub.add_parser("down", help="stop the VMs and remove everything `up` created")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("vmlab: needs root (network namespaces, taps, /var/lib and /var/cache)")
    try:
        if args.command == "image":
            print(build_image())
        elif args.command == "up":
            names = args.hosts.split(",")
            bad = [n for n in names if not HOST_NAME.fullmatch(n) or n in ("storage", "workers", "cluster")]
            if bad or len(set(names)) != len(names) or not 1 <= len(names) <= MAX_HOSTS:
                parser.error(f"--hosts {args.hosts!r}: give 1 to {MAX_HOSTS} distinct names of a-z, 0-9 and '-' "
                             "(not the group names storage, workers, cluster), comma-separated")
            print(json.dumps(up(names, args.timeout, args.workspace_venv, args.storage_is_worker)))
        else:
            down()
    except RuntimeError as err:
        sys.exit(f"vmlab: {err}")


if __name__ == "__main__":
    main()
