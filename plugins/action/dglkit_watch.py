"""ansible.builtin.command for train.yml's `dglkit watch` polls, plus the job's training curves in TensorBoard.

roles/dgl_job/tasks/wait.yml polls a job with one `until` task on the storage host. Each poll's answer has the
job's latest epoch record ("progress"); this action, which runs on the controller, adds it to the TensorBoard
event file in the job's run folder (app/dglkit/tboard.py) as the answer arrives, so `tensorboard --logdir runs`
shows the job live. Nothing more runs on the nodes. A curve that cannot be written (no tensorboard package in
Ansible's Python, a run folder that cannot be written) is a warning: the job is watched all the same.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from ansible.plugins.action import ActionBase

DOCUMENTATION = """
    name: dglkit_watch
    short_description: run a dglkit watch command and write its progress to TensorBoard
    description:
      - Runs C(argv) on the host as M(ansible.builtin.command) does and returns its result.
      - When C(tensorboard_dir) is set and the last stdout line is a C(dglkit watch) answer with a progress record,
        appends that epoch to the TensorBoard event file in C(tensorboard_dir) on the controller.
    options:
      argv:
        description: The command, as M(ansible.builtin.command)'s argv.
        type: list
        elements: str
        required: true
      tensorboard_dir:
        description: The job's run folder on the controller; empty writes no curves.
        type: path
        default: ""
"""

# The node app's writer, beside the plugins in a clone and in the collection alike. Loaded from its file: the
# controller's Python may have another dglkit installed (a developer's venv), and the module needs no other.
TBOARD = Path(__file__).resolve().parents[2] / "app" / "dglkit" / "tboard.py"


def progress_of(stdout_lines: list[str]) -> dict | None:
    """The epoch record of a `dglkit watch` answer (its last line), or None."""
    try:
        answer = json.loads((stdout_lines or [""])[-1])
    except ValueError:
        return None
    progress = answer.get("progress") if isinstance(answer, dict) else None
    return progress if isinstance(progress, dict) else None


def write_curves(folder: str, progress: dict) -> str | None:
    """Append the progress to the run's event file; a warning when it could not be."""
    spec = importlib.util.spec_from_file_location("dglkit_tboard", TBOARD)
    if spec is None or spec.loader is None:
        return f"no TensorBoard curves: {TBOARD} is missing"
    tboard = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(tboard)
        tboard.record(Path(folder), [progress])
    except ImportError as error:
        return f"no TensorBoard curves: {error} (pip install tensorboard into Ansible's Python)"
    except (OSError, ValueError) as error:
        return f"no TensorBoard curves in {folder}: {error}"
    return None


class ActionModule(ActionBase):
    _VALID_ARGS = frozenset(("argv", "tensorboard_dir"))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        result.update(self._execute_module(module_name="ansible.legacy.command",
                                           module_args={"argv": self._task.args["argv"]}, task_vars=task_vars))
        self._remove_tmp_path(self._connection._shell.tmpdir)
        folder = self._task.args.get("tensorboard_dir")
        progress = progress_of(result.get("stdout_lines", [])) if folder and result.get("rc") == 0 else None
        warning = write_curves(folder, progress) if progress else None
        if warning:
            result.setdefault("warnings", []).append(warning)
        return result
