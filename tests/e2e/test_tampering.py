"""A job that attacks the kit from inside its job directory (tests/programs/tamper): it plants links to
root-only files, hard links, FIFOs and directories at every path the kit touches afterwards outside the job's
sandbox: the unit's log, settings.json, job.json, FAILED files, report's outputs, history/ and the results.
Then a worker reboots (its unit starts again), the job is stopped, run again with -e dgl_job_resume=true and its
results fetched. Nothing root does follows a link the job planted: no root-owned file appears outside the job
directory, no root-only content reaches the run folder or any playbook's output, and the playbooks name what the
job replaced instead of crashing. The program has a requirements.txt, so its own environment (built by the job
account on the workspace) is in the attack too. On the training cluster (conftest.train_cluster: node1 storage,
node2 and node3 workers, the shared venv), after test_train.
"""
from __future__ import annotations

import json
import re
import secrets
import stat
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from jobhelpers import assert_clean, flat, run_folder, start_train, stop_background, train, workers

if TYPE_CHECKING:
    from conftest import Cluster

PROGRAM = Path(__file__).resolve().parents[1] / "programs" / "tamper"
# train.py is a link to tamper.py inside the program's directory: shipped as a link.
COMMAND = ("python3 train.py --pause 1 --ip-config {ip_config} --part-config {part_config} --out-dir {output_dir} "
           "--num-epochs 12 --batch-size 100")
JOB = ["-e", "dgl_job_synthetic_nodes=5000", "-e", "dgl_job_id=e2e-tamper", "-e", "dgl_job_max_restarts=1",
       "-e", "dgl_job_restart_wait=900", "-e", "dgl_job_poll_seconds=5",
       "-e", json.dumps({"dgl_program_dir": str(PROGRAM), "dgl_program_command": COMMAND})]
# Everything root must never create: the targets of the links the program plants (tamper.py).
PWNED = "find / -xdev -name 'pwned-*' -print"


@pytest.fixture(scope="module")
def site(train_cluster: Cluster) -> Cluster:
    return train_cluster


@pytest.fixture(autouse=True)
def stop_background_jobs(site: Cluster) -> Iterator[None]:
    yield
    stop_background(site)


def wait_for(check: Callable[[], bool], what: str, timeout: float, playbook: subprocess.Popen | None = None) -> None:
    """Until check() holds; fails at once, with its output, if the playbook started in the background ended."""
    deadline = time.time() + timeout
    while not check():
        if playbook is not None and playbook.poll() is not None:
            pytest.fail(f"train.yml ended before the {what}:\n{playbook.communicate()[0][-4000:]}")
        assert time.time() < deadline, f"no {what} within {timeout:.0f} s"
        time.sleep(1)


def root_only(site: Cluster) -> list[str]:
    """Text that only root can read on the hosts: every host's marker (put in /root/dglkit-marker, 0600) and the
    lines of its /etc/shadow."""
    found = []
    for host in site.hosts():
        marker = f"dglkit-root-only-{host}-{secrets.token_hex(8)}"
        site.ssh(host, f"umask 077 && echo {marker} > /root/dglkit-marker")
        shadow = site.ssh(host, "cat /etc/shadow").stdout.splitlines()
        found += [marker, *(line for line in shadow if len(line) > 12)]
    return found


def root_files_since(site: Cluster, host: str) -> list[str]:
    """Root-owned files created or changed in /root since the test began (its stamp), but for Ansible's
    temporary files and root's authorized_keys (which the test harness writes at each boot);
    with the link targets' names (/root/pwned-*) anywhere and /etc/shadow's lines compared
    separately: what a root that followed the job's links would have left."""
    listing = site.ssh(host, "find /root -xdev -user root -newer /root/.tampering-stamp -not -type d "
                             "-not -path '/root/.ansible/*' -not -path /root/.ssh/authorized_keys").stdout
    return sorted(listing.split())


def kinds(folder: Path) -> dict[str, str]:
    """Every entry of the run folder that is neither a regular file nor a directory, with its kind."""
    odd = {}
    for path in folder.rglob("*"):
        mode = path.lstat().st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            odd[str(path.relative_to(folder))] = oct(stat.S_IFMT(mode))
    return odd


def test_a_job_that_plants_links_fifos_and_hard_links_gets_nothing_from_root(
        site: Cluster, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    secret = root_only(site)
    secret_shadow = [line for line in secret if not line.startswith("dglkit-root-only-")]
    for host in site.hosts():
        site.ssh(host, "touch /root/.tampering-stamp && rm -f /root/pwned-*")
    job_dir = site.workspace / "jobs/e2e-tamper"
    outputs = []

    # 1. The job runs and plants (after its first checkpoint) on both workers.
    proc = start_train(site, runs, *JOB)
    wait_for(lambda: all((job_dir / "nodes" / node / "planted").exists() for node in workers(site)), "planting", 600, proc)
    assert (job_dir / "nodes/node3/unit.log").readlink() == Path("/root/pwned-node3")
    # The unit's shell execs the launcher: it is the unit's main process (KillMode=mixed signals it), as the account.
    main = site.ssh("node3", "ps -o user=,args= -p $(systemctl show -P MainPID dglkit-job)").stdout.split()
    assert main[0] == "dglkit" and "launch" in main and main[-2:] == ["--node-name", "node3"], main

    # 2. node3 reboots: systemd starts the job's unit again, whose log is now a link to /root/pwned-node3.
    site.shutdown("node3")
    site.boot("node3")
    wait_for(lambda: "dglkit-job.service" in site.ssh("node3", "journalctl -b -o cat -u dglkit-job").stdout,
             "start of the job unit after the boot", 120)
    time.sleep(3)
    journal = site.ssh("node3", "journalctl -b -o cat -u dglkit-job").stdout
    print(journal)
    for host in site.hosts():
        assert site.ssh(host, PWNED).stdout == "", host
    # The unit's shell, as the job account, could not open the link: the launcher did not start, the node failed.
    assert re.search(r"cannot create \S+/nodes/node3/unit.log: (Permission denied|Read-only file system)", journal), journal

    # 3. The job is stopped: node2 waits at the restart barrier for node3, which does not come back.
    stop = site.playbook("playbooks/stop.yml")
    outputs.append(stop.output)
    first = proc.communicate(timeout=300)[0]
    outputs.append(first)
    assert proc.returncode != 0 and "job e2e-tamper was stopped on request" in flat(first), first[-4000:]
    assert "Traceback" not in first
    warning = re.search(r"WARNING: job e2e-tamper: left out of the results because they are not regular files.*",
                        flat(first))
    assert warning, first[-4000:]
    for planted in ("nodes/node2/unit.log (a symbolic link)", "nodes/node3/shadow.log (a symbolic link)",
                    "nodes/node2/fifo.log (a FIFO)", "settings.json (a symbolic link)", "history (a symbolic link)",
                    "job.json (a hard link: 2 names)", "attempts/80/FAILED (a symbolic link)"):
        assert planted in warning.group(0), planted
    # The summary of the stopped job replaced the FIFO the job left there (report writes by rename).
    summary = runs / "e2e-tamper" / "summary.txt"
    assert summary.is_file() and not summary.is_symlink() and summary.read_text().strip(), summary

    # 4. Run again and resume: the earlier run's files (the planted ones with them) move to history/1/.
    second = train(site, runs, *JOB, "-e", "dgl_job_resume=true")
    outputs.append(second.output)
    assert "succeeded" in flat(second.output) and "Traceback" not in second.output
    assert ("WARNING: /srv/dglkit/jobs/e2e-tamper/settings.json is a symbolic link (the job replaced it): not compared"
            in flat(second.output)), second.output[-4000:]
    for planted in ("history/1/nodes/node3/unit.log (a symbolic link)", "history/1/settings.json (a symbolic link)",
                    "history/1/nodes/node2/fifo.log (a FIFO)", "job-link.json (a hard link: "):
        assert planted in flat(second.output), planted
    folder = run_folder(second.output)
    metrics = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert any(m["event"] == "resume" for m in metrics) and metrics[-1]["event"] == "test", metrics[-1]
    assert "epochs          12 of 12" in (folder / "summary.txt").read_text()
    assert json.loads((folder / "summary.json").read_text())["epochs"] == 12

    # Nothing of root's: no file, no content, anywhere.
    assert kinds(folder) == {}
    fetched = [path.read_bytes().decode(errors="replace") for path in folder.rglob("*") if path.is_file()]
    assert not [line for line in secret if any(line in text for text in fetched + outputs)]
    for host in site.hosts():
        assert site.ssh(host, PWNED).stdout == "", host
        assert root_files_since(site, host) == [], host
    shadow_lines = [line for host in site.hosts() for line in site.ssh(host, "cat /etc/shadow").stdout.splitlines()
                    if len(line) > 12]
    assert shadow_lines == secret_shadow
    assert_clean(site)

