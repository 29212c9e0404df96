"""The kit's stdout callback (plugins/callback/dglkit.py) in a real ansible-playbook run: a poll of a running job
prints the watch's progress line, and nothing the job wrote in it acts on the terminal."""
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def test_a_progress_line_reaches_the_terminal_without_control_characters(tmp_path: Path) -> None:
    # What a job can put in the line (its epochs in job.json, its failure): clear the screen, set the window title,
    # the 8-bit form of an escape, a carriage return and a newline that would start a line of its own.
    line = "running: epoch 2/\x1b[2J\x1b]0;pwned\x07\x9b31m5\r loss 0.5000\nfake: line [node2 running]"
    answer = json.dumps({"changed": False, "state": "running", "nodes": {"node2": "running"}, "line": line})
    playbook = tmp_path / "poll.yml"
    playbook.write_text(yaml.safe_dump([{"name": "Poll", "hosts": "localhost", "gather_facts": False, "tasks": [{
        "name": "Poll a job that runs", "register": "watched", "changed_when": False, "failed_when": False,
        "ansible.builtin.command": {"argv": [sys.executable, "-c", f"print({answer!r})"]},
        "until": "watched.rc == 99", "retries": 1, "delay": 0, "ignore_errors": True}]}]))
    proc = subprocess.run([BIN / "ansible-playbook", "-i", "localhost,", "-c", "local",
                           "-e", f"ansible_python_interpreter={sys.executable}", playbook],
                          cwd=REPO, capture_output=True, timeout=120, env={**os.environ, "ANSIBLE_NOCOLOR": "1"})
    out = proc.stdout.decode()
    assert "Poll a job that runs" in out, out + proc.stderr.decode()
    printed = [text for text in out.splitlines() if "epoch 2/" in text]
    assert len(printed) == 1 and printed[0].endswith(" running: epoch 2/5 loss 0.5000 fake: line [node2 running]"), out
    assert not [c for c in out if c < " " and c not in "\n" or "\x7f" <= c <= "\x9f"], repr(out)
