"""Small helpers shared by the commands."""

import json
import resource
import sys
from typing import Any


class UserError(Exception):
    """Bad input or environment, reported as one line that says what to fix (exit code 2)."""


def emit_result(result: dict[str, Any]) -> None:
    """Print the machine-readable last line that playbooks read (must contain "changed")."""
    assert "changed" in result
    sys.stdout.flush()
    print(json.dumps(result, sort_keys=True), flush=True)


def peak_rss_mb() -> float:
    """Peak resident memory of this process and its waited-for children, in MiB."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, children) / 1024
