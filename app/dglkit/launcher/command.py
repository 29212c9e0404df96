"""The command that the launcher runs as every server and trainer: its {placeholders}, the paths of the programs
it names (found in the program directory) and the check that they exist on this node."""

import os
import re
import shlex
import shutil
from pathlib import Path

from dglkit.common import UserError, read_partition_config

# What a command may name in braces; everything else in braces is refused (`${VAR}` is the shell's).
PLACEHOLDERS = ("ip_config", "part_config", "graph_name", "output_dir", "job_dir", "program_dir", "node_name",
                "machine_id", "num_machines", "num_servers", "num_trainers", "num_samplers")
PLACEHOLDER = re.compile(r"(?<!\$)\{([A-Za-z_][A-Za-z0-9_]*)\}")
# The kit's own trainer: the command when job.json names no program (train_args are appended).
BUILTIN_COMMAND = "python3 -m dglkit train --ip-config {ip_config} --part-config {part_config} --out-dir {output_dir}"
# The command's python: the script it runs is found from there (DGL's launch.py puts torchrun after it).
PYTHON_WORD = re.compile(r"(?:^|(?<=[\s;&|(]))((?:[^\s;&|()]*/)?python[0-9.]*)(?=\s|$)")
SHELL_BUILTINS = {"cd", "exec", "export", "set", "eval", ".", "source", "(", "{", "ulimit", "umask", "true"}


def graph_name(part_config: Path) -> str:
    return str(read_partition_config(part_config)["graph_name"])


def expand(command: str, values: dict) -> str:
    """The command with each {placeholder} replaced by its shell-quoted value."""
    unknown = sorted({name for name in PLACEHOLDER.findall(command) if name not in values})
    if unknown:
        raise UserError(f"unknown placeholder(s) {', '.join('{' + name + '}' for name in unknown)} in the command; "
                        f"known: {', '.join('{' + name + '}' for name in PLACEHOLDERS)} (write ${{NAME}} for a "
                        "shell variable)")
    return PLACEHOLDER.sub(lambda found: shlex.quote(str(values[found.group(1)])), command)


def python_word(command: str) -> re.Match:
    found = PYTHON_WORD.search(command)
    if not found:
        raise UserError(f"the command {command!r} starts no python: as for DGL's launch.py, which runs trainers as "
                        "`python -m torch.distributed.run <your script>`, the command must run python")
    return found


def in_program_dir(command: str, program_dir: Path) -> str:
    """The command with the script its python runs, and a first program or python given as a relative path
    (./run.sh), named by their path in the program directory: the command runs from the job directory (as
    launch.py runs it from its --workspace), so that the program's relative writes land in the job's output."""
    python = python_word(command)
    paths = {python.span(1)}
    first = re.match(r"\s*(\S+)", command)
    if first and first.start(1) < python.start(1):
        paths.add(first.span(1))
    script = re.compile(r"(?<=\s)(?!-)\S+").search(command, python.end())
    words = [span for span in paths if "/" in command[slice(*span)]]
    if script and not any(option.startswith(("-m", "-c")) for option in command[python.end():script.start()].split()):
        words.append(script.span())
    for start, end in sorted(words, reverse=True):
        word = command[start:end]
        if re.fullmatch(r"[\w.+-]+(?:/[\w.+-]+)*", word) and (program_dir / word).is_file():
            command = command[:start] + shlex.quote(str(program_dir / word)) + command[end:]
    return command


def check_executables(command: str, cwd: Path, path: str, node: str) -> None:
    """The command's first program and its python must exist on this node, and so must the script that python
    runs when the command starts with it."""
    try:
        words = [word for word in shlex.split(command) if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", word)]
    except ValueError as error:
        raise UserError(f"the command {command!r} is not a valid shell command line: {error}") from None
    python = python_word(command).group(1)
    for program in {words[0], python} - SHELL_BUILTINS:
        if not (shutil.which(program, path=path) if "/" not in program else os.access(cwd / program, os.X_OK)):
            raise UserError(f"`{program}` of the command is not an executable on {node} (looked in {path} from "
                            f"{cwd}): install it or fix the command")
    if words[0] != python:
        return
    if not any(word in ("-m", "-c") or not word.startswith("-") for word in words[1:]):
        raise UserError(f"the command {command!r} gives python no script: name the script or module it runs")
    script = next((word for word in words[1:] if not word.startswith("-")), None)
    if script and script.endswith(".py") and "-m" not in words[1:words.index(script)] and not (cwd / script).is_file():
        raise UserError(f"{python} would run {script}, which is not in {cwd} on {node}: fix the command or the "
                        "program directory")
