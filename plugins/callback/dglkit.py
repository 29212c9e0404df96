"""Ansible's default output, plus one progress line for each poll of a running dglkit job.

train.yml waits for a job with a single `until` task (constant controller memory however long the job runs);
Ansible reports each of its retries through v2_runner_retry, which the default callback prints as
"FAILED - RETRYING". For a `dglkit watch` poll this prints the line the watch wrote instead.
"""

import json
import time

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


def watch_line(result: dict) -> str | None:
    """The progress line of a `dglkit watch` result, or None for any other task."""
    lines = result.get("stdout_lines") or [""]
    try:
        parsed = json.loads(lines[-1])
    except ValueError:
        return None
    return parsed.get("line") if isinstance(parsed, dict) and "nodes" in parsed else None


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
