"""roles/job_account/files/home.py, the kit's files in the job account's home, on a directory of the test's own
(as the test's user: the account's rights are the e2e tier's, tests/e2e/test_home_tampering.py). What is in the way
at a name (a link, a FIFO, a hard link, a file of someone else's) is removed and named, never followed or opened."""
from __future__ import annotations

import importlib.util
import os
import pwd
import stat
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "roles/job_account/files/home.py"
SPEC = importlib.util.spec_from_file_location("home", SCRIPT)
assert SPEC and SPEC.loader
home_py = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(home_py)
COMMENT = "dglkit-mesh"


def make_home(path: Path, check: bool = False):  # -> home_py.Home
    entry = pwd.struct_passwd(("dglkit", "x", os.getuid(), os.getgid(), "", str(path), "/bin/bash"))
    return home_py.Home(entry, check)


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A file outside the home that nothing may change."""
    target = tmp_path / "outside"
    target.mkdir()
    (target / "secret").write_text("root's\n")
    (target / "secret").chmod(0o640)
    return target


@pytest.fixture
def home_dir(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    return path


def test_dirs_replace_a_link_and_leave_its_target_alone(home_dir: Path, outside: Path) -> None:
    (home_dir / ".ansible").symlink_to(outside)
    home = make_home(home_dir)
    home.directory(".ansible/tmp")
    assert home.changed and home.replaced == [f"{home_dir}/.ansible (a symbolic link)"]
    for rel in (".ansible", ".ansible/tmp"):
        st = (home_dir / rel).lstat()
        assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700, rel
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]
    again = make_home(home_dir)
    again.directory(".ansible/tmp")
    assert not again.changed


def test_check_mode_reports_and_changes_nothing(home_dir: Path, outside: Path) -> None:
    (home_dir / ".ssh").symlink_to(outside)
    home = make_home(home_dir, check=True)
    assert home_py.key(home, "dglkit_ed25519", COMMENT) == {"public_key": None}
    assert home.changed and (home_dir / ".ssh").is_symlink()


def test_key_made_once_and_a_fifo_in_its_place_replaced(home_dir: Path) -> None:
    home = make_home(home_dir)
    made = home_py.key(home, "dglkit_ed25519", f"{COMMENT} node1")
    assert made["public_key"].startswith("ssh-ed25519 ") and home.changed
    again = make_home(home_dir)
    assert home_py.key(again, "dglkit_ed25519", f"{COMMENT} node1") == made and not again.changed
    (home_dir / ".ssh/dglkit_ed25519.pub").unlink()
    os.mkfifo(home_dir / ".ssh/dglkit_ed25519.pub")
    fifo = make_home(home_dir)
    remade = home_py.key(fifo, "dglkit_ed25519", f"{COMMENT} node1")
    assert remade["public_key"] != made["public_key"]
    assert fifo.replaced == [f"{home_dir}/.ssh/dglkit_ed25519.pub (a FIFO)"]


def test_authorized_keys_through_a_link_or_a_hard_link_writes_a_file_of_its_own(home_dir: Path, outside: Path) -> None:
    (home_dir / ".ssh").mkdir(mode=0o700)
    (home_dir / ".ssh/authorized_keys").symlink_to(outside / "secret")
    home = make_home(home_dir)
    home.write(home_py.AUTHORIZED, "ssh-ed25519 AAAA dglkit-mesh node2\n")
    assert home.replaced == [f"{home_dir}/.ssh/authorized_keys (a symbolic link)"]
    os.link(outside / "secret", home_dir / ".ssh/hard")
    os.replace(home_dir / ".ssh/hard", home_dir / ".ssh/authorized_keys")
    hard = make_home(home_dir)
    hard.write(home_py.AUTHORIZED, "ssh-ed25519 AAAA dglkit-mesh node2\n")
    assert hard.replaced == [f"{home_dir}/.ssh/authorized_keys (a hard link: 2 names)"]
    written = (home_dir / ".ssh/authorized_keys").lstat()
    assert stat.S_ISREG(written.st_mode) and written.st_nlink == 1 and stat.S_IMODE(written.st_mode) == 0o600
    assert (outside / "secret").read_text() == "root's\n" and (outside / "secret").stat().st_nlink == 1


def test_unmesh_drops_the_kits_lines_alone_and_never_edits_a_linked_file(home_dir: Path, outside: Path) -> None:
    (home_dir / ".ssh").mkdir(mode=0o700)
    (home_dir / ".ssh/authorized_keys").write_text("ssh-ed25519 AAAA mine\nrestrict ssh-ed25519 BBBB dglkit-mesh node2\n")
    (home_dir / ".ssh/authorized_keys").chmod(0o600)
    (home_dir / ".ssh/dglkit_ed25519").write_text("key")
    home = make_home(home_dir)
    home_py.unmesh(home, "dglkit_ed25519", COMMENT)
    assert (home_dir / ".ssh/authorized_keys").read_text() == "ssh-ed25519 AAAA mine\n"
    assert not (home_dir / ".ssh/dglkit_ed25519").exists() and home.replaced == []
    (outside / "secret").write_text("root ssh-ed25519 CCCC dglkit-mesh node3\n")
    (home_dir / ".ssh/authorized_keys").unlink()
    (home_dir / ".ssh/authorized_keys").symlink_to(outside / "secret")
    linked = make_home(home_dir)
    home_py.unmesh(linked, "dglkit_ed25519", COMMENT)
    assert not os.path.lexists(home_dir / ".ssh/authorized_keys")
    assert (outside / "secret").read_text() == "root ssh-ed25519 CCCC dglkit-mesh node3\n"


def test_a_directory_of_someone_else_is_refused_naming_it(home_dir: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to give a directory away")
    (home_dir / ".ssh").mkdir(mode=0o700)
    os.chown(home_dir / ".ssh", 12345, 12345)
    with pytest.raises(SystemExit, match=rf"{home_dir}/.ssh is a directory of uid 12345, not of the job account"):
        make_home(home_dir).directory(".ssh")
