"""The job account attacks site.yml and remove_node.yml through its own home: code running as the account plants
links to a root-owned directory outside (as it would point ~/.ansible at /etc/systemd/system), FIFOs and hard links
at every name the kit touches there (~/.ansible, ~/.ansible/tmp, ~/.ssh, the mesh's key pair, authorized_keys).
The real playbooks then run as usual. Nothing outside the home changes (owner, mode, names and content of the
root-owned directory and its files), no playbook hangs on a FIFO, nothing root-only reaches a file the account
reads, and the account's paths are repaired: the mesh works again and a second site.yml changes nothing.
On the jobs cluster (conftest.jobs_cluster: node1 storage, node2 and node3 workers, the SSH mesh on), after
test_remove_node: its last test takes node3 out. The tests run in file order.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from jobhelpers import as_job_user, flat, mesh_ssh

if TYPE_CHECKING:
    from conftest import Cluster

HOME = "/home/dglkit"
# Root's: a directory as /etc/systemd/system is, with a private file and an authorized_keys holding a mesh line
# (what the kit would edit or remove at those names in the account's .ssh).
TARGET = "/etc/dglkit-target"
MAKE_TARGET = (f"rm -rf {TARGET} && mkdir -m 0755 {TARGET} && cd {TARGET} && umask 077 && "
               "echo root-only-$(hostname)-$(od -An -N8 -tx8 /dev/urandom | tr -d \" \") > dglkit_ed25519 && "
               "echo 'restrict ssh-ed25519 AAAAroot dglkit-mesh node9' > authorized_keys && chmod 0644 authorized_keys")
# Everything about the target that a root following a link would change.
TARGET_STATE = (f"stat -c '%n %U %G %a %h %s %Y' {TARGET} {TARGET}/*; sha1sum {TARGET}/*; ls -A {TARGET}")
# The account's kit paths: each must be what the kit makes (a real directory or file of the account's, one name).
HOME_STATE = (f"cd {HOME} && stat -c '%n %F %U %a' .ansible .ansible/tmp .ssh && "
              "stat -c '%n %F %U %a %h' .ssh/dglkit_ed25519 .ssh/dglkit_ed25519.pub .ssh/authorized_keys")
REPAIRED = [".ansible directory dglkit 700", ".ansible/tmp directory dglkit 700", ".ssh directory dglkit 700",
            ".ssh/dglkit_ed25519 regular file dglkit 600 1", ".ssh/dglkit_ed25519.pub regular file dglkit 600 1",
            ".ssh/authorized_keys regular file dglkit 600 1"]


@pytest.fixture(scope="module")
def site(jobs_cluster: Cluster) -> Cluster:
    return jobs_cluster


def targets(site: Cluster) -> dict[str, str]:
    return {host: site.ssh(host, TARGET_STATE).stdout for host in site.hosts()}


def make_targets(site: Cluster) -> dict[str, str]:
    for host in site.hosts():
        site.ssh(host, MAKE_TARGET)
    return targets(site)


def assert_repaired(site: Cluster) -> None:
    """The account's paths are the kit's again, every node's key is authorized everywhere and the mesh works."""
    for host in site.hosts():
        assert site.ssh(host, HOME_STATE).stdout.splitlines() == REPAIRED, host
        authorized = site.ssh(host, f"grep -v '^#' {HOME}/.ssh/authorized_keys").stdout.splitlines()
        assert [line.split()[-1] for line in authorized] == sorted(site.hosts()), (host, authorized)
        assert all(" ssh-ed25519 AAAAC3" in line and "root-only" not in line for line in authorized), authorized
    for source in site.hosts():
        for target in site.hosts():
            assert site.ssh(source, mesh_ssh(target)).stdout.strip() == target, (source, target)


def test_links_in_the_home_lead_root_nowhere(site: Cluster) -> None:
    before = make_targets(site)
    # ~/.ansible (node1), ~/.ssh (node2), ~/.ansible/tmp and authorized_keys (node3): links to root's directory.
    site.ssh("node1", as_job_user(f"rm -rf {HOME}/.ansible && ln -s {TARGET} {HOME}/.ansible"))
    site.ssh("node2", as_job_user(f"rm -rf {HOME}/.ssh && ln -s {TARGET} {HOME}/.ssh"))
    site.ssh("node3", as_job_user(f"rm -rf {HOME}/.ansible/tmp && ln -s {TARGET} {HOME}/.ansible/tmp && "
                                  f"ln -sf {TARGET}/authorized_keys {HOME}/.ssh/authorized_keys"))
    planted = {host: site.ssh(host, f"ls -la {HOME} {HOME}/.ansible {HOME}/.ssh").stdout for host in site.hosts()}
    # --check names every host whose home it would repair, and changes nothing; then the real run.
    check = site.playbook("site.yml", "--check", check=False, timeout=900)
    after_check = ({host: site.ssh(host, f"ls -la {HOME} {HOME}/.ansible {HOME}/.ssh").stdout for host in site.hosts()},
                   targets(site))
    run = site.playbook("site.yml", check=False, timeout=900)
    assert targets(site) == before
    assert after_check == (planted, before)
    assert check.returncode == 0 and check.changed_hosts() == sorted(site.hosts()), check.output[-4000:]
    assert run.returncode == 0 and "Traceback" not in run.output, run.output[-4000:]
    assert_repaired(site)
    assert site.playbook("site.yml").changed_hosts() == []


def test_fifos_and_hard_links_in_the_home_neither_hang_nor_leak(site: Cluster) -> None:
    before = make_targets(site)
    # A hard link to root's private file at the public key's name: the kernel (fs.protected_hardlinks) keeps the
    # account from making one, so root makes it, as a kernel without that protection would let the account.
    site.ssh("node2", f"ln -f {TARGET}/dglkit_ed25519 {HOME}/.ssh/dglkit_ed25519.pub")
    site.ssh("node3", as_job_user(f"rm -f {HOME}/.ssh/authorized_keys && mkfifo {HOME}/.ssh/authorized_keys"))
    site.ssh("node1", as_job_user(f"rm -f {HOME}/.ssh/dglkit_ed25519 && mkfifo {HOME}/.ssh/dglkit_ed25519"))
    # A second site.yml takes seconds: one that blocks on a FIFO never ends.
    run = site.playbook("site.yml", check=False, timeout=300)
    assert run.returncode == 0 and "Traceback" not in run.output, run.output[-4000:]
    # The hard link's second name is gone (root's file has one name again, as before), nothing else changed.
    assert targets(site) == before
    assert_repaired(site)


def test_a_workspace_the_account_can_write_is_refused_before_root_writes_there(site: Cluster) -> None:
    site.workspace.chmod(0o777)
    try:
        run = site.playbook("site.yml", check=False)
    finally:
        site.workspace.chmod(0o755)
    assert run.returncode != 0
    # The message as Ansible's YAML output quotes it (root''s).
    assert ("/srv/dglkit (dglkit_workspace) belongs to uid 0 with mode 777: root writes the venv, app/ and "
            "ip_config.txt there, so it must be root''s and writable by root alone (chown root:root /srv/dglkit; "
            "chmod go-w /srv/dglkit)") in flat(run.output), run.output[-3000:]
    assert run.changed_hosts() == [], run.recap


def test_remove_node_removes_a_linked_ssh_directory_and_leaves_its_target_alone(site: Cluster) -> None:
    before = make_targets(site)
    site.ssh("node3", as_job_user(f"rm -rf {HOME}/.ssh && ln -s {TARGET} {HOME}/.ssh"))
    run = site.playbook("playbooks/remove_node.yml", "-e", "dglkit_remove_nodes=node3", check=False, timeout=900)
    assert targets(site) == before
    assert run.returncode == 0 and "Traceback" not in run.output, run.output[-4000:]
    assert "node3 left the cluster" in flat(run.output)
    assert site.ssh("node3", f"ls -A {HOME}; test ! -e {HOME}/.ssh -a ! -L {HOME}/.ssh && echo gone").stdout.split()[-1] == "gone"
