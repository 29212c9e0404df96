"""What root reads of systemd's units and of the processes they run: `systemctl show` properties, a unit's
command line, a process's /proc files. Shared by `dglkit control` (the job unit) and dglkit.mpiunit (the mpi
partition's unit)."""

from pathlib import Path


def parse_show(text: str) -> dict[str, str]:
    """`systemctl show -p ...` output (Key=Value lines) as a dict."""
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def exec_argv(exec_start: str) -> list[str]:
    """The command line of a unit's `systemctl show -p ExecStart` ("{ path=… ; argv[]=… ; … }"), word by word."""
    return exec_start.partition("argv[]=")[2].partition(" ; ")[0].split()


def read_proc(pid: str, name: str) -> list[str]:
    """A NUL-separated /proc file as a list; [] for a process that is gone or a kernel thread."""
    try:
        return (Path("/proc") / pid / name).read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []
