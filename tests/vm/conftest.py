"""The VM tier: one set of qemu VMs (storage, w1, w2) for the whole session, torn down at the end."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vmlab  # noqa: E402

HOSTS = ["storage", "w1", "w2"]


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
