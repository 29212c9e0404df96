"""The launcher's settings: flags over job.json (its keys are the long flags' names) over defaults."""

import argparse
import json
import os
import socket
from pathlib import Path
from typing import Any

from dglkit.common import UserError
from dglkit.launcher.command import PLACEHOLDERS
from dglkit.settings import LAUNCHER_NUMBERS, SETTINGS

# The job settings that the launcher reads, declared once in dglkit.settings (type, default, checks), by their
# job.json key; the program is not among them (plan gives job.json its command, program_dir and python_env).
DECLARED = LAUNCHER_NUMBERS
TYPES = {"int": int, "float": float}
# Every key of job.json and its default: the declared ones, and the launcher's own; flags override job.json.
DEFAULTS: dict[str, Any] = {
    "ip_config": None,
    "part_config": None,
    "job_dir": None,
    "node_name": socket.gethostname(),
    "machine_id": None,
    **{key: setting.default for key, setting in DECLARED.items()},
    # By hand (no job.json from train.yml, which always sets it) the first failure ends the job.
    "max_restarts": 0,
    "nodes": [],
    "connect_retries": 10,
    "grace": 10.0,
    "local": False,
    "command": "",
    "program_dir": None,
    "python_env": None,
    "node_data_names": SETTINGS["node_data_names"].default,
    # The kit's trainer's settings (`dglkit train --settings <this file>` reads them; no flag).
    "train": {},
    "train_args": [],
}
# The launcher's own numbers: (least value, flag help).
OWN_NUMBERS = {"connect_retries": (1, "DGL connect attempts, 3 s apart, before a trainer gives up on a server"),
               "grace": (1, "seconds between SIGTERM and SIGKILL when stopping")}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # Defaults stay None here so that a flag given on the command line can be told from job.json's value.
    parser.add_argument("--config", help="job.json: keys are this command's long flag names with underscores")
    parser.add_argument("--ip-config", help="DGL ip_config: one '<address> <port>' line per machine")
    parser.add_argument("--part-config", help="partition json; its num_parts must equal ip_config's lines")
    parser.add_argument("--job-dir", help="shared job directory (default: the --config file's directory)")
    parser.add_argument("--node-name", help="name of this node's log directory (default: hostname)")
    parser.add_argument("--machine-id", type=int, help="this node's ip_config line, 0-based (default: the line "
                        "whose address is on a local interface)")
    for key, setting in DECLARED.items():
        parser.add_argument("--" + key.replace("_", "-"), type=TYPES[setting.type],
                            help=f"{setting.help} (default {DEFAULTS[key]}; job setting {setting.var})")
    for key, (_, text) in OWN_NUMBERS.items():
        parser.add_argument("--" + key.replace("_", "-"), type=type(DEFAULTS[key]), help=f"{text} (default {DEFAULTS[key]})")
    parser.add_argument("--nodes", type=lambda text: text.split(","), help="every node's --node-name, comma "
                        "separated, in ip_config order: enables restarts and the other nodes' liveness checks")
    parser.add_argument("--local", action="store_true", default=None,
                        help="run the whole job on this machine (127.0.0.1, a 1-part partition)")
    parser.add_argument("--command", help="the program's command line as for DGL's launch.py, with {placeholders}: "
                        + ", ".join(f"{{{name}}}" for name in PLACEHOLDERS) + " (default: the kit's trainer)")
    parser.add_argument("--program-dir", help="the program's directory: its script and modules are found there while "
                        "it runs from the job dir, where its relative writes land (default: the job dir)")
    parser.add_argument("--python-env", help="environment whose bin/ leads PATH, so that the command's python is "
                        "its python (default: the launcher's)")
    parser.add_argument("--node-data-names", type=json.loads, help="JSON: the partition's node data under the names "
                        "the program reads, {\"feat\": \"features\"} for every node type or {\"paper\": {\"feat\": "
                        "\"features\"}} for one (DGL's servers rename them as they load them)")
    parser.add_argument("--check", action="store_true", help="run the pre-flight checks only and start nothing")
    parser.add_argument("train_args", nargs=argparse.REMAINDER, help="-- then `dglkit train` arguments")


def check_numbers(cfg: argparse.Namespace) -> None:
    """The declared settings' checks (as `dglkit plan` applies them to dgl_job_*) and the launcher's own."""
    for key, setting in DECLARED.items():
        problem = setting.problem(getattr(cfg, key))
        if problem:
            raise UserError(f"--{key.replace('_', '-')} {getattr(cfg, key)}: {problem} (job setting {setting.var})")
    for key, (least, _) in OWN_NUMBERS.items():
        if getattr(cfg, key) < least:
            raise UserError(f"--{key.replace('_', '-')} {getattr(cfg, key)}: use a value >= {least}")


def settings(args: argparse.Namespace, config: dict[str, Any] | None = None) -> argparse.Namespace:
    """Flags over job.json (or `config`, its content) over defaults."""
    source = "the job's configuration"
    if config is None and args.config:
        source = args.config
        try:
            config = json.loads(Path(args.config).read_text())
        except (OSError, ValueError) as error:
            raise UserError(f"cannot read --config {args.config}: {error}") from None
        config.setdefault("job_dir", str(Path(args.config).resolve().parent))
    config = config or {}
    unknown = sorted(set(config) - set(DEFAULTS))
    if unknown:
        raise UserError(f"{source}: unknown keys {unknown}; valid keys are {sorted(DEFAULTS)}")
    flags: dict[str, Any] = {key: getattr(args, key, None) for key in DEFAULTS}
    if flags["train_args"] and flags["train_args"][0] == "--":
        flags["train_args"] = flags["train_args"][1:]
    merged = {key: flags[key] if flags[key] not in (None, []) else config.get(key, default)
              for key, default in DEFAULTS.items()}
    if not merged["trainer_threads"]:  # 0 or none: picked here
        merged["trainer_threads"] = max((os.cpu_count() or 1) // 2 // max(merged["num_trainers"], 1), 1)
    return argparse.Namespace(**merged)
