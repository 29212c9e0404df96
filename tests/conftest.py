"""The order of the suite's tests, and how `make test` splits them over two pytest-xdist workers (`-n 2`): one test
after another kept the machine's two cores about three-quarters busy (SSH round trips, systemd, boots).

Tests that share a module or session fixture run in one worker, as one group: each module, except the unit tier (its
partitions and finished local job are session fixtures), the VM tier (one VM lab) and the modules on the training
cluster (TRAINING_CLUSTER: tests/e2e/conftest.py's train_cluster) and on the jobs cluster (JOBS_CLUSTER). The groups
start in the order below. test_site.py comes first: its real pip install builds the venv seed that every later
cluster and the VM lab start from (they wait for it: staging.seed_lock), while the other worker runs the unit tier.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from xdist.remote import Producer
    from xdist.scheduler.protocol import Scheduling

TESTS = Path(__file__).parent
TRAINING_CLUSTER = {"test_builtin_tasks.py", "test_collection.py", "test_contacts.py", "test_own_programs.py",
                    "test_train.py", "test_tampering.py"}
JOBS_CLUSTER = {"test_jobs.py", "test_mpi_partition.py", "test_remove_node.py", "test_home_tampering.py"}
SHARED_CLUSTERS = {**dict.fromkeys(TRAINING_CLUSTER, "training-cluster"), **dict.fromkeys(JOBS_CLUSTER, "jobs-cluster")}
# The modules of a shared cluster that must come later in their group, in this order (others first): they take
# hosts down or out, reboot one (test_tampering) or cut one off mid-partition (test_mpi_partition).
LATER = {"test_train.py": 1, "test_tampering.py": 2, "test_mpi_partition.py": 1, "test_remove_node.py": 2,
         "test_home_tampering.py": 3}
# Group (or tier) -> its place; groups of one place start in collection order. test_site.py and the unit tier,
# then the longest groups first (jobs cluster, training cluster, VM tier: many minutes each), the other e2e modules
# (a few minutes each), the kit's small modules last: a worker that finishes early takes the next group, so short
# groups at the end let the two workers end close together.
ORDER = {"e2e/test_site.py": 0, "unit": 1, "jobs-cluster": 2, "training-cluster": 3, "vm": 4, "e2e": 5, "kit": 6}


def group(module: Path) -> str:
    """The group of a test module."""
    tier = module.resolve().relative_to(TESTS).parts[0]
    if tier in ("unit", "vm"):
        return tier
    if tier == "e2e" and module.name in SHARED_CLUSTERS:
        return SHARED_CLUSTERS[module.name]
    return f"{tier}/{module.name}"


def place(item: pytest.Item) -> tuple[int, int]:
    name = group(item.path)
    return ORDER.get(name, ORDER.get(name.partition("/")[0], len(ORDER))), LATER.get(item.path.name, 0)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=place)


@pytest.fixture(autouse=True)
def blocking_stdin() -> None:
    """Ansible refuses to start when its stdin is non-blocking. ssh makes the stdin it inherits non-blocking
    until it exits, so an ssh killed at a timeout leaves this process's stdin so for every later test (in a
    pytest-xdist worker, where modules follow each other, that broke the next module's site.yml)."""
    with contextlib.suppress(OSError):  # no stdin at all is fine too
        os.set_blocking(0, True)


@pytest.hookimpl(optionalhook=True)  # a hook of xdist's: without xdist, unused
def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> Scheduling:
    """pytest-xdist's scheduler by scope, with a group as the scope: a worker gets one group at a time, whole,
    and the groups go out in collection order (`make test` passes --no-loadscope-reorder)."""
    from xdist.scheduler import LoadScopeScheduling  # here: the suite also runs without xdist

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group(config.rootpath / nodeid.partition("::")[0])

    return GroupScheduling(config, log)
