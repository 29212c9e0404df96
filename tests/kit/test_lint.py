"""`make lint` in the suite: the whole kit passes ansible-lint's production profile and ansible-playbook
--syntax-check, every Python file ruff and app/ mypy (both configured in pyproject.toml)."""
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


def test_ruff_checks_every_python_file_and_finds_nothing() -> None:
    listed = subprocess.run([BIN / "ruff", "check", "--show-files"], cwd=REPO, capture_output=True, text=True,
                            timeout=120)
    checked = {Path(line).resolve().relative_to(REPO) for line in listed.stdout.splitlines()}
    every = {path.relative_to(REPO) for path in REPO.rglob("*.py") if not path.is_symlink()
             and not any(part.startswith(".") or part == "runs" for part in path.relative_to(REPO).parts)}
    assert checked == every
    proc = subprocess.run([BIN / "ruff", "check", "--output-format", "concise"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]


def test_mypy_finds_nothing_in_the_app() -> None:
    modules = len(list((REPO / "app" / "dglkit").rglob("*.py")))
    proc = subprocess.run([BIN / "mypy"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert f"no issues found in {modules} source files" in proc.stdout
