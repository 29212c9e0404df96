"""The kit as an Ansible collection, as its users run it: `make collection`, the tarball installed offline into an
empty collections path of a project directory that has nothing of the clone (its own ansible.cfg as
docs/cluster.md gives it: the collection's stdout callback), then the playbooks by name against the training
cluster (conftest.train_cluster, stood up from the clone): `dglkit.cluster.site` changes nothing there, and
`dglkit.cluster.train` runs a short job whose progress lines come from the collection's callback and whose
TensorBoard curves appear in the project's runs/<job id>/ while the job runs and match metrics.jsonl at its end.
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from jobhelpers import flat, kill

if TYPE_CHECKING:
    from conftest import Cluster

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
# docs/cluster.md's ansible.cfg for a project that uses the installed collection, with its collections path.
ANSIBLE_CFG = """[defaults]
collections_path = ./collections
stdout_callback = dglkit.cluster.dglkit
callback_result_format = yaml
interpreter_python = auto_silent
forks = 25

[ssh_connection]
pipelining = True
ssh_args = -o ControlMaster=auto -o ControlPersist=120s -o ServerAliveInterval=15
"""
# Epochs enough that training outlasts several 1 s progress polls: at 4 epochs (about 1.2 s) a loaded host's
# first poll could see the job's end, and the live curves were never seen live.
EPOCHS = 30
JOB = ["-e", "dgl_job_synthetic_nodes=20000", "-e", f"dgl_job_epochs={EPOCHS}", "-e", "dgl_job_batch_size=100",
       "-e", "dgl_job_id=e2e-collection", "-e", "dgl_job_force=true", "-e", "dgl_job_progress_seconds=1"]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project directory with the collection built by `make collection` and installed offline into its empty
    collections path."""
    build = subprocess.run(["make", "collection", f"ANSIBLE_GALAXY={BIN / 'ansible-galaxy'}"], cwd=REPO,
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr
    [tarball] = (REPO / "dist").glob("dglkit-cluster-*.tar.gz")
    project = tmp_path_factory.mktemp("project")
    (project / "ansible.cfg").write_text(ANSIBLE_CFG)
    (project / "collections").mkdir()
    install = subprocess.run([BIN / "ansible-galaxy", "collection", "install", "--offline", "-p",
                              str(project / "collections"), str(tarball)], cwd=project, capture_output=True,
                             text=True, timeout=300)
    assert install.returncode == 0, install.stdout + install.stderr
    assert (project / "collections/ansible_collections/dglkit/cluster/playbooks/site.yml").is_file()
    return project


def test_the_installed_collections_site_playbook_changes_nothing_on_a_cluster_the_clone_stood_up(
        train_cluster: Cluster, project: Path) -> None:
    run = train_cluster.playbook("dglkit.cluster.site", cwd=project)
    assert "running playbook inside collection dglkit.cluster" in run.output or "dglkit.cluster." in run.output
    assert run.changed_hosts() == [], run.output[-4000:]


def test_a_job_through_the_installed_train_playbook_writes_tensorboard_curves_live(
        train_cluster: Cluster, project: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    from dglkit import tboard  # pytest.ini's pythonpath: this checkout's app

    folder = project / "runs" / "e2e-collection"
    metrics = train_cluster.workspace / "jobs" / "e2e-collection" / "metrics.jsonl"
    proc = train_cluster.start_playbook("dglkit.cluster.train", *JOB, cwd=project)
    seen_live = False
    deadline = time.time() + 900
    while proc.poll() is None and time.time() < deadline:
        # The file first, then the job's end: a file seen before the test event was written live.
        if list(folder.glob("events.out.tfevents.*")) and '"event": "test"' not in (
                metrics.read_text() if metrics.exists() else ""):
            seen_live = True
        time.sleep(0.5)
    output = kill(proc) if proc.poll() is None else proc.communicate()[0]
    assert proc.returncode == 0, output[-6000:]
    assert seen_live, output[-3000:]
    assert "running: epoch" in flat(output)  # the collection's stdout callback's progress lines
    assert f"curves: tensorboard --logdir {(project / 'runs').resolve()}" in flat(output)
    [path] = folder.glob("events.out.tfevents.*")
    reader = EventAccumulator(str(path), size_guidance={SCALARS: 0})
    reader.Reload()
    records = tboard.epochs((folder / "metrics.jsonl").read_text())
    assert len(records) == EPOCHS
    for tag in ("loss", "train_acc", "val_acc", "epoch_time", "seeds_per_s"):
        assert [s.step for s in reader.Scalars(tag)] == list(range(EPOCHS))
        assert [s.value for s in reader.Scalars(tag)] == pytest.approx([r[tag] for r in records], rel=1e-6)
