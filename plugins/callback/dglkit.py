"""Ansible's default output, plus one progress line for each poll of a running dglkit job.

train.yml waits for a job with a single `until` task (constant controller memory however long the job runs);
Ansible reports each of its retries through v2_runner_retry, which the default callback prints as
"FAILED - RETRYING". For a `dglkit watch` poll this prints the line the watch wrote instead, without a control
character: the line carries what the job wrote (its epochs, its failure), and a terminal acts on an escape sequence.
"""

import importlib.util
import json
import time
from pathlib import Path

from ansible.plugins.callback.default import CallbackModule as DefaultCallback

DOCUMENTATION = """
    name: dglkit
    type: stdout
    short_description: default output with a progress line per poll of a dglkit job
    description:
      - The default stdout callback; a retry of a task whose last stdout line is a `dglkit watch` result
        prints that result's progress line instead of "FAILED - RETRYING".
    extends_documentation_fragment:
      - default_callback
      - result_format_callback
    requirements:
      - set as stdout_callback in ansible.cfg
"""

# The app's own cleaner (standard library only), by its path: the controller does not install the app.
_SPEC = importlib.util.spec_from_file_location(
    "dglkit_printable", Path(__file__).resolve().parents[2] / "app" / "dglkit" / "printable.py")
assert _SPEC is not None and _SPEC.loader is not None
_CLEANER = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_CLEANER)


def watch_line(result: dict) -> str | None:
    """The progress line of a `dglkit watch` result, one printable line, or None for any other task."""
    lines = result.get("stdout_lines") or [""]
    try:
        parsed = json.loads(lines[-1])
    except ValueError:
        return None
    line = parsed.get("line") if isinstance(parsed, dict) and "nodes" in parsed else None
    return _CLEANER.printable(line, lines=False) if isinstance(line, str) else None


class CallbackModule(DefaultCallback):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "stdout"
    CALLBACK_NAME = "dglkit"

    def v2_runner_retry(self, result) -> None:
        line = watch_line(result._result)
        if line is None:
            super().v2_runner_retry(result)
        else:
            self._display.display(f"{time.strftime('%H:%M:%S')} {line}")
