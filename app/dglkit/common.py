"""Small helpers shared by the commands."""

import hashlib
import json
import os
import resource
import sys
from pathlib import Path
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


def digest(value: Any) -> str:
    """Short stable hash of a JSON-able value: equal inputs give equal fingerprints across runs."""
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in path, or None when it is missing or unreadable (then it gets rebuilt)."""
    try:
        with open(path) as f:
            value = json.load(f)
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def write_json(path: Path, value: dict[str, Any]) -> None:
    """Write atomically: a reader (or a re-run after a crash) never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(value, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)
