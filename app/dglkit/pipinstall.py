"""`dglkit pip --pip VENV/bin/pip -- install ARGS`: pip run as it is, with its progress for `dglkit follow`.

site.yml's environment build installs gigabytes of wheels (torch alone unpacks to more than a gigabyte) and pip
says nothing for minutes while it does. Run under `dglkit follow`, the playbook shows a line per poll: the
requirements pip has read ("collect", out of the lock's when it pins every package with --no-deps), then the
packages it has installed ("install": the distributions whose .dist-info appeared in the venv's site-packages, out
of pip's own "Installing collected packages" list). pip's output is passed through, then one JSON line:
{"changed": whether pip installed anything, "rc": pip's exit code}.

Standard library only: it runs with the system Python, before the venv has anything in it.
"""

import argparse
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

from dglkit.common import emit_result
from dglkit.progress import PROGRESS

POLL_SECONDS = 1.0
# A requirement line of a requirements file: a name first (comments, options and hash continuations are not).
REQUIREMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\s*(\[|==|>|<|~|!|;|$)")
READ = ("Processing ", "Collecting ")
INSTALLING = "Installing collected packages:"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pip", required=True, type=Path, help="the venv's pip (VENV/bin/pip)")
    parser.add_argument("pip_args", nargs=argparse.REMAINDER, help="pip's own arguments, after --")


def requirement_count(pip_args: list[str]) -> int:
    """How many packages pip will read: the requirement lines of its -r files when --no-deps keeps it to them,
    else 0 (not known before pip resolves)."""
    if "--no-deps" not in pip_args:
        return 0
    files = [Path(pip_args[i + 1]) for i, arg in enumerate(pip_args[:-1]) if arg in ("-r", "--requirement")]
    return sum(1 for file in files for line in file.read_text().splitlines() if REQUIREMENT.match(line))


def installed(site_packages: list[Path]) -> set[str]:
    """The .dist-info directories in the venv's site-packages."""
    return {entry.name for folder in site_packages if folder.is_dir() for entry in folder.glob("*.dist-info")}


class PipOutput:
    """pip's stdout, passed through line by line, read on a thread of its own: pip says nothing while it installs,
    and the progress must still move."""

    def __init__(self, stream) -> None:
        self.read = 0
        self.to_install = 0
        self.changed = False
        self.thread = threading.Thread(target=self.pass_through, args=(stream,), daemon=True)
        self.thread.start()

    def pass_through(self, stream) -> None:
        for line in stream:
            sys.stdout.write(line)
            sys.stdout.flush()
            if line.startswith(READ):
                self.read += 1
            elif line.startswith(INSTALLING):
                self.to_install = len([name for name in line[len(INSTALLING):].split(",") if name.strip()])
            elif line.startswith("Successfully installed"):
                self.changed = True


def show(output: PipOutput, total: int, site_packages: list[Path], before: set[str]) -> None:
    """The progress record: the requirements read until pip lists what it installs, then the installed ones."""
    if output.to_install:
        if PROGRESS.record["phase"] != "install":
            PROGRESS.phase("install", output.to_install, "packages")
        PROGRESS.step(min(len(installed(site_packages) - before), output.to_install))
    else:
        PROGRESS.step(output.read, max(total, output.read) if total else 0)


def run(args: argparse.Namespace) -> int:
    pip_args = args.pip_args[1:] if args.pip_args[:1] == ["--"] else args.pip_args
    total = requirement_count(pip_args)
    site_packages = list((args.pip.parent.parent / "lib").glob("python*/site-packages"))
    before = installed(site_packages)
    PROGRESS.phase("collect", total, "packages")
    pip = subprocess.Popen([str(args.pip), *pip_args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    output = PipOutput(pip.stdout)
    PROGRESS.watch_child(pip.pid)
    while pip.poll() is None:
        show(output, total, site_packages, before)
        time.sleep(POLL_SECONDS)
    output.thread.join()
    show(output, total, site_packages, before)
    emit_result({"changed": output.changed, "rc": pip.returncode})
    return pip.returncode
