"""The whole kit passes ansible-lint's production profile and ansible-playbook --syntax-check."""
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PLAYBOOKS = ["site.yml", *sorted(str(p.relative_to(REPO)) for p in (REPO / "playbooks").glob("*.yml"))]


def test_ansible_lint_production_profile() -> None:
    proc = subprocess.run([BIN / "ansible-lint", "--offline", "--nocolor", "--profile", "production"], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]


@pytest.mark.parametrize("playbook", PLAYBOOKS)
def test_syntax_check(playbook: str) -> None:
    proc = subprocess.run([BIN / "ansible-playbook", "-i", "inventory/sample", "--syntax-check", playbook],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
