"""Count the module runs on each host of a playbook run: the round trips that decide how long a run takes.

Enabled with ANSIBLE_CALLBACKS_ENABLED=contacts; with DGLKIT_CONTACTS_FILE=<path> it writes {"hosts": {host:
count}, "tasks": {host: {task: count}}} there at the end of the run, and otherwise prints one line per host.
A module run is a task (or a loop item) that was not skipped and whose action reaches the host: the actions
that run on the controller alone (assert, set_fact, fail, ...) do not count, and a delegated task counts for
the host it was delegated to.
"""

import json
import os
from collections import Counter, defaultdict

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
    name: contacts
    type: aggregate
    short_description: count the module runs on each host
    description:
      - Counts, per host, the tasks and loop items that ran a module there (not skipped, not a controller-only
        action); writes them as JSON to DGLKIT_CONTACTS_FILE, or prints them at the end of the run.
    requirements:
      - enable in ANSIBLE_CALLBACKS_ENABLED
"""

# Actions that never open a session on the host.
LOCAL_ACTIONS = {
    "add_host", "assert", "debug", "fail", "group_by", "import_role", "import_tasks", "include_role",
    "include_tasks", "include_vars", "meta", "set_fact", "set_stats", "validate_argument_spec",
}


def short(action: str) -> str:
    return action.rpartition(".")[2]


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "contacts"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self.tasks: dict[str, Counter] = defaultdict(Counter)

    def count(self, result) -> None:
        task = result._task
        if short(task.action) in LOCAL_ACTIONS:
            return
        if result._result.get("skipped") or (task.loop is not None and "results" in result._result):
            return  # skipped, or the summary of a loop whose items were counted one by one
        delegated = result._result.get("_ansible_delegated_vars", {}).get("ansible_delegated_host")
        if delegated is None and task.delegate_to:
            delegated = task.delegate_to
        self.tasks[delegated or result._host.get_name()][task.get_name()] += 1

    v2_runner_on_ok = v2_runner_on_failed = v2_runner_on_unreachable = count
    v2_runner_item_on_ok = v2_runner_item_on_failed = count

    def v2_playbook_on_stats(self, stats) -> None:
        hosts = {host: sum(tasks.values()) for host, tasks in sorted(self.tasks.items())}
        path = os.environ.get("DGLKIT_CONTACTS_FILE")
        if path:
            with open(path, "w") as out:
                json.dump({"hosts": hosts, "tasks": {h: dict(t) for h, t in self.tasks.items()}}, out, indent=1)
        else:
            self._display.display("Module runs per host: " + ", ".join(f"{h} {n}" for h, n in hosts.items()))
