"""How many times a playbook with nothing to do reaches each host: module runs per host, counted by
plugins/callback/contacts.py, for a no-op site.yml and a train.yml re-run of a finished job, on the training cluster
(conftest.train_cluster: node1 storage, node2 and node3 workers; its earlier jobs leave it as site.yml made it).
Each round trip costs a no-op run time on every host; a bound per host keeps new ones from creeping in unnoticed.
Lower a bound when a change removes round trips.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from jobhelpers import train
from test_builtin_tasks import LINK_PREDICTION

if TYPE_CHECKING:
    from conftest import Cluster, PlaybookRun

# Module runs per host of a no-op run: (storage host, each worker).
SITE_BOUND = (16, 10)
# train.yml: the pre-flight (with the lock and the earlier run), the release of the lock, the results.
TRAIN_BOUND = (3, 1)


@pytest.fixture(scope="module")
def stood_up(train_cluster: Cluster) -> Cluster:
    return train_cluster


def counted(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
            run: Callable[[], PlaybookRun]) -> tuple[PlaybookRun, dict[str, int]]:
    """A playbook run with the contacts callback on, and its module runs per cluster host."""
    path = tmp_path / "contacts.json"
    monkeypatch.setenv("ANSIBLE_CALLBACKS_ENABLED", "contacts")
    monkeypatch.setenv("DGLKIT_CONTACTS_FILE", str(path))
    result = run()
    counts = json.loads(path.read_text())["hosts"]
    return result, {host: n for host, n in counts.items() if host != "localhost"}


def bounds(cluster: Cluster, bound: tuple[int, int]) -> dict[str, int]:
    storage = next(iter(cluster.groups()["storage"]))
    return {host: bound[0] if host == storage else bound[1] for host in cluster.hosts()}


def test_a_no_op_site_run_reaches_each_host_a_bounded_number_of_times(
        stood_up: Cluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    run, counts = counted(monkeypatch, tmp_path, lambda: stood_up.playbook("site.yml"))
    assert run.changed_hosts() == [], run.recap
    limits = bounds(stood_up, SITE_BOUND)
    assert set(counts) == set(limits) and all(counts[h] <= limits[h] for h in limits), (counts, limits)


def test_a_train_run_of_a_finished_job_reaches_each_host_a_bounded_number_of_times(
        stood_up: Cluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    # test_builtin_tasks.py, earlier in the group (tests/conftest.py), ran this job to its end on this cluster: the
    # first train() finds it finished (run alone, this module trains it first).
    train(stood_up, runs, *LINK_PREDICTION)
    run, counts = counted(monkeypatch, tmp_path, lambda: train(stood_up, runs, *LINK_PREDICTION))
    assert "finished before" in run.output and run.changed_hosts() == [], run.recap
    limits = bounds(stood_up, TRAIN_BOUND)
    assert set(counts) == set(limits) and all(counts[h] <= limits[h] for h in limits), (counts, limits)
