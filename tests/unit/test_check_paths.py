"""roles/cluster_validate/files/check_paths.py: which workspace, venv and wheelhouse paths site.yml refuses, and
that every message names the setting, the path and the rule (the kit tier runs it inside site.yml)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "roles/cluster_validate/files/check_paths.py"


def check(*pairs: str) -> list[str]:
    proc = subprocess.run([sys.executable, SCRIPT, *pairs], capture_output=True, text=True, check=True)
    return json.loads(proc.stdout)


@pytest.mark.parametrize("path", ["/srv/dglkit", "/srv/dglkit/venv", "/opt/dglkit/venv", "/opt/dglkit-offline/wheelhouse",
                                  "/var/lib/dglkit-testcluster", "/home/ml/dglkit", "/mnt/shared/dglkit",
                                  "/tmp/pytest-of-root/ws", "/data"])
def test_directories_of_their_own_pass(path: str) -> None:
    assert check(f"dglkit_workspace={path}") == []


def test_an_empty_path_is_not_set_and_passes() -> None:
    assert check("dglkit_wheelhouse_dir=") == []


@pytest.mark.parametrize("path, rule", [
    ("/", "is the root directory: use a directory of its own"),
    ("srv/dglkit", "is not an absolute path without spaces"),
    ("/srv/dglkit/", "is not an absolute path without spaces"),
    ("/srv/dgl kit", "is not an absolute path without spaces"),
    ("/srv/./dglkit", "has an empty, '.' or '..' component"),
    ("/srv//dglkit", "has an empty, '.' or '..' component"),
    ("/srv/../etc", "has an empty, '.' or '..' component"),
    ("/srv", "is a system directory: use a directory of its own"),
    ("/var/lib", "is a system directory"),
    ("/tmp", "is a system directory"),
    ("/etc", "is inside /etc, a system directory"),
    ("/etc/ssh", "is inside /etc, a system directory"),
    ("/usr/lib/x", "is inside /usr, a system directory"),
    ("/usr/local/dglkit", "is inside /usr, a system directory"),
    ("/boot/efi/dglkit", "is inside /boot, a system directory"),
    ("/root/dglkit", "is inside /root, a system directory"),
    ("/lib64/x", "is inside /lib64, a system directory"),
    ("/var/lib/dpkg/x", "is inside /var/lib/dpkg, a system directory"),
    ("/var/log/dglkit", "is inside /var/log, a system directory"),
    ("/proc/wheels", "is on a kernel or runtime filesystem (/proc): use a directory on disk"),
    ("/run/dglkit", "is on a kernel or runtime filesystem (/run)"),
    ("/var/run/dglkit", "is on a kernel or runtime filesystem (/var/run)"),
    ("/dev/shm/ws", "is on a kernel or runtime filesystem (/dev)"),
])
def test_system_paths_are_refused_naming_setting_path_and_rule(path: str, rule: str) -> None:
    [message] = check(f"dglkit_venv_dir={path}")
    assert message.startswith(f"dglkit_venv_dir '{path}' {rule}"), message


def test_one_message_per_bad_path() -> None:
    assert check("dglkit_workspace=/srv/dglkit", "dglkit_venv_dir=/etc/venv", "dglkit_wheelhouse_dir=/usr/wheels") == [
        "dglkit_venv_dir '/etc/venv' is inside /etc, a system directory: use a directory of its own, e.g. /srv/dglkit",
        "dglkit_wheelhouse_dir '/usr/wheels' is inside /usr, a system directory: use a directory of its own, "
        "e.g. /srv/dglkit"]
