"""The VM tier: one set of qemu VMs (node1 storage, node2 and node3 workers) for the session, torn down at the end."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vmlab  # noqa: E402

HOSTS = ["node1", "node2", "node3"]  # node1 is the storage host
# Per test, its share of the session's VM boot included: TCG emulation boots three VMs in minutes.
VM_TIMEOUT = 2700


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(VM_TIMEOUT))


@pytest.fixture(scope="session")
def lab() -> dict:
    """The running VMs: {"hosts": {name: {"ip", "pid"}}, "accel", "boot_seconds"}."""
    if vmlab.STATE.exists():
        print(f"removing the VM lab an earlier run left in {vmlab.STATE}", file=sys.stderr)
        vmlab.down()
    state = vmlab.up(HOSTS, timeout=420)
    print(f"VM lab: {len(HOSTS)} VMs ({state['accel']}) to SSH in {state['boot_seconds']} s", file=sys.stderr)
    yield state
    vmlab.down()


@pytest.fixture(scope="session")
def inventory(lab: dict) -> Path:
    return vmlab.STATE / "inventory"
