"""roles/cluster_validate/files/check_paths.py: which workspace, venv and wheelhouse paths site.yml refuses, and
that every message names the setting, the path and the rule (the kit tier runs it inside site.yml)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "roles/cluster_validate/files/check_paths.py"


# What site.yml passes for the default job account and workspace (cluster_validate's vars).
ACCOUNT_OWNED = [f"--account-owned={path}" for path in
                 ("/home/dglkit", "/srv/dglkit/jobs", "/srv/dglkit/datasets", "/srv/dglkit/partitions",
                  "/srv/dglkit/program-envs")]


def check(*pairs: str) -> list[str]:
    proc = subprocess.run([sys.executable, SCRIPT, *ACCOUNT_OWNED, *pairs], capture_output=True, text=True, check=True)
    return json.loads(proc.stdout)


@pytest.mark.parametrize("path", ["/srv/dglkit", "/srv/dglkit/venv", "/opt/dglkit/venv", "/opt/dglkit-offline/wheelhouse",
                                  "/var/lib/dglkit-testcluster", "/home/ml/dglkit", "/home/dglkitty/ws",
                                  "/mnt/shared/dglkit", "/srv/dglkit/jobsite", "/tmpfs/ws", "/data"])
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
    ("/tmp/ws", "is inside /tmp, where every account can create files (a link planted there would lead root's "
                "writes anywhere): use a directory of its own, e.g. /srv/dglkit"),
    ("/tmp/pytest-of-root/ws/venv", "is inside /tmp, where every account can create files"),
    ("/var/tmp/wheels", "is inside /var/tmp, where every account can create files"),
    ("/home/dglkit", "is inside /home/dglkit, which the job account can change (root would write through what it "
                     "puts there): use a directory of its own, e.g. /srv/dglkit"),
    ("/home/dglkit/venv", "is inside /home/dglkit, which the job account can change"),
    ("/srv/dglkit/datasets/venv", "is inside /srv/dglkit/datasets, which the job account can change"),
    ("/srv/dglkit/jobs", "is inside /srv/dglkit/jobs, which the job account can change"),
    ("/srv/dglkit/program-envs/wheels", "is inside /srv/dglkit/program-envs, which the job account can change"),
])
def test_system_paths_are_refused_naming_setting_path_and_rule(path: str, rule: str) -> None:
    [message] = check(f"dglkit_venv_dir={path}")
    assert message.startswith(f"dglkit_venv_dir '{path}' {rule}"), message


def test_one_message_per_bad_path() -> None:
    assert check("dglkit_workspace=/srv/dglkit", "dglkit_venv_dir=/etc/venv", "dglkit_wheelhouse_dir=/usr/wheels") == [
        "dglkit_venv_dir '/etc/venv' is inside /etc, a system directory: use a directory of its own, e.g. /srv/dglkit",
        "dglkit_wheelhouse_dir '/usr/wheels' is inside /usr, a system directory: use a directory of its own, "
        "e.g. /srv/dglkit"]
