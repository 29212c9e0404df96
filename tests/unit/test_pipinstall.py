"""`dglkit pip` under `dglkit follow`, as site.yml's environment build runs it: a Python with nothing but the standard
library runs the app from its directory, pip installs pinned wheels from the staged wheelhouse into a new venv,
the polls show what pip has read and installed, and the last answer is pip's own output and a JSON line."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cluster.staging import CACHE

APP = Path(__file__).resolve().parents[2] / "app"
LOCK = APP / "requirements" / "node.lock"
WHEELHOUSE = CACHE / "wheelhouse"


def small_pins(count: int) -> str:
    """The node lock's entries (a pin and its hashes) of its `count` smallest wheels in the wheelhouse."""
    entries = {}
    lines = LOCK.read_text().splitlines()
    starts = [i for i, line in enumerate(lines) if line[:1].isalnum()] + [len(lines)]
    for begin, end in zip(starts, starts[1:]):
        name = lines[begin].split("==")[0].lower().replace("-", "_")
        wheels = [w for w in WHEELHOUSE.glob("*.whl") if w.name.lower().startswith(name + "-")]
        if wheels:
            entries[wheels[0].stat().st_size] = "\n".join(lines[begin:end])
    return "\n".join(entries[size] for size in sorted(entries)[:count]) + "\n"


@pytest.fixture(scope="module")
def pythons(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A Python with the standard library alone (the system Python of a fresh node) and a new venv to fill."""
    root = tmp_path_factory.mktemp("pythons")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", root / "bare"], check=True, timeout=120)
    subprocess.run([sys.executable, "-m", "venv", root / "target"], check=True, timeout=300)
    return root / "bare" / "bin" / "python", root / "target"


def pip_install(venv: Path, lock: Path) -> list[str]:
    """`dglkit pip`'s arguments as the python_env role passes them: the lock, pinned, from the wheelhouse alone."""
    return ["pip", "--pip", str(venv / "bin" / "pip"), "--", "install", "-r", str(lock), "--require-hashes",
            "--no-deps", "--no-index", "--find-links", str(WHEELHOUSE)]


def poll(python: Path, state: Path, command: list[str]) -> tuple[list[str], subprocess.CompletedProcess]:
    """Every running poll's line, and the answer of the poll that found the command ended."""
    lines = []
    for _ in range(1200):
        answer = subprocess.run([python, "-m", "dglkit", "follow", "--state-dir", state, "--wait", "0.2",
                                 "--command", json.dumps(command)], capture_output=True, text=True, timeout=120,
                                env={"PYTHONPATH": str(APP), "PATH": "/usr/bin:/bin"})
        last = json.loads(answer.stdout.splitlines()[-1]) if answer.returncode == 0 else {}
        if last.get("follow") != "running":
            return lines, answer
        lines.append(last["line"])
    pytest.fail(f"pip did not end: {lines[-3:]}")


def test_pip_installs_a_lock_under_follow_with_the_system_python_and_shows_what_it_read_and_installed(
        pythons: tuple[Path, Path], tmp_path: Path) -> None:
    python, venv = pythons
    lock = tmp_path / "small.lock"
    lock.write_text(small_pins(3))
    command = pip_install(venv, lock)
    lines, answer = poll(python, tmp_path / "state", command)
    assert answer.returncode == 0, answer.stderr
    assert "Successfully installed" in answer.stdout
    assert json.loads(answer.stdout.splitlines()[-1]) == {"changed": True, "rc": 0}
    # A poll before pip's first record says "starting" (under load, the first poll can come that early).
    shown = lines[next((i for i, line in enumerate(lines) if line != "starting"), len(lines)):]
    assert shown and all(line.startswith("pip: ") for line in shown), lines
    installed = subprocess.run([venv / "bin" / "pip", "list", "--format=json"], capture_output=True, text=True,
                               check=True, timeout=120)
    names = {p["name"].lower().replace("_", "-") for p in json.loads(installed.stdout)}
    wanted = {line.split("==")[0].lower() for line in lock.read_text().splitlines() if "==" in line}
    assert wanted <= names, (wanted, names)

    # Installed already: pip changes nothing, and says so.
    _, again = poll(python, tmp_path / "state", command)
    assert again.returncode == 0 and json.loads(again.stdout.splitlines()[-1]) == {"changed": False, "rc": 0}


def test_the_progress_record_counts_the_packages_read_then_those_installed(
        pythons: tuple[Path, Path], tmp_path: Path) -> None:
    """Without follow, which removes the record with the command's directory: pip's last record, once it ended."""
    python, _ = pythons
    venv, lock, record = tmp_path / "venv", tmp_path / "small.lock", tmp_path / "progress.json"
    subprocess.run([sys.executable, "-m", "venv", venv], check=True, timeout=300)
    lock.write_text(small_pins(4))
    done = subprocess.run([python, "-m", "dglkit", *pip_install(venv, lock)],
                          capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(APP), "PATH": "/usr/bin:/bin", "DGLKIT_PROGRESS": str(record)})
    assert done.returncode == 0, done.stderr
    last = json.loads(record.read_text())
    assert {k: last[k] for k in ("command", "phase", "done", "total", "unit")} == {
        "command": "pip", "phase": "install", "done": 4, "total": 4, "unit": "packages"}, last
    assert last["peak_rss_mb"] > 20  # pip's own, not the wrapper's alone


def test_a_failing_pip_answers_with_its_error_and_exit_code(pythons: tuple[Path, Path], tmp_path: Path) -> None:
    python, venv = pythons
    lock = tmp_path / "bad.lock"
    lock.write_text("no-such-package-anywhere==1.0 \\\n    --hash=sha256:" + "0" * 64 + "\n")
    command = pip_install(venv, lock)
    _, answer = poll(python, tmp_path / "state", command)
    assert answer.returncode == 1 and "no-such-package-anywhere" in answer.stderr, answer
    assert json.loads(answer.stdout.splitlines()[-1]) == {"changed": False, "rc": 1}
