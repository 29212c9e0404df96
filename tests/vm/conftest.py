"""The VM tier: one set of qemu VMs (node1 storage and worker, node2 worker) for the tier, torn down after its last test."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.cluster import staging
from tests.vm import vmlab

HOSTS = ["node1", "node2"]  # node1 is the storage host
# Per test, its share of the session's VM boot included: under TCG emulation the first site.yml takes many minutes.
VM_TIMEOUT = 2700


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(VM_TIMEOUT))


@pytest.fixture(scope="package")
def lab() -> dict:
    """The running VMs: {"hosts": {name: {"ip", "pid"}}, "accel", "boot_seconds"}. The storage VM's workspace
    disk holds the venv that the e2e tier's site.yml built, so that this tier's site.yml runs whole."""
    seed = staging.venv_seed(vmlab.host_python())
    with staging.seed_lock(seed):  # the e2e tier's site.yml may be building it on the other worker
        built = seed.is_dir()
    if not built:
        pytest.fail(f"no venv seed for the VMs at {seed}: the e2e tier builds it (make test-e2e, or at least "
                    "pytest tests/e2e/test_site.py), and `make test` runs that tier first")
    if vmlab.STATE.exists():
        print(f"removing the VM lab an earlier run left in {vmlab.STATE}", file=sys.stderr)
        vmlab.down()
    state = vmlab.up(HOSTS, timeout=420, workspace_venv=seed, storage_is_worker=True)
    print(f"VM lab: {len(HOSTS)} VMs ({state['accel']}) to SSH in {state['boot_seconds']} s", file=sys.stderr)
    yield state
    vmlab.down()


@pytest.fixture(scope="package")
def inventory(lab: dict) -> Path:
    return vmlab.STATE / "inventory"
