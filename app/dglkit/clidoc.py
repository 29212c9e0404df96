"""docs/cli.md, the node CLI's option reference, made from the commands' own argparse parsers and those of the
programs run as `python -m dglkit.<module>` (PROGRAMS).

`python -m dglkit clidoc --write` (`make docs`) rewrites it; a kit test fails when it is stale. docs/design.md keeps
what the options cannot say: what each command is for and what it prints.
"""

import argparse
import importlib
import sys
from collections.abc import Iterator
from pathlib import Path

DOCS_FILE = "docs/cli.md"
GENERATED = "generated from the commands' and programs' parsers (app/dglkit) by `make docs`: change them there"
DESIGN_LINK = "design.md#the-node-cli-python--m-dglkit-command-console-script-dglkit"
INTRO = f"""# The node CLI's options

Every command is `python -m dglkit <command>` (console script `dglkit`) on a node; `dglkit A ARGS --then B ARGS`
runs several in one process. After the commands, the programs that run as `python -m dglkit.<module>`: under
mpirun, on the controller, or as a command's child process. What each is for, its files and its JSON result:
[docs/design.md, The node CLI]({DESIGN_LINK}).
"""
# The programs run as `python -m dglkit.<module>`, each module's argument_parser() (its prog is the page's title), and
# what runs it. A module run that way with options belongs here: kit/test_docs.py looks for them in roles and app.
PROGRAMS = {
    "dglkit.mpiassign": "the partition assignment by PT-Scotch, every worker at once, each rank holding its share of "
                        "the edges (`dglkit mpi run` runs it under mpirun)",
    "dglkit.mpibuild": "the partition's parts from an assignment, rank p writing part p (`dglkit mpi run` runs it "
                       "under mpirun after dglkit.mpiassign)",
    "dglkit.leanpart": "METIS in a process of its own, so that its memory is gone before the parts are built: the "
                       "assignment step of `dglkit partition --builder lean`, which runs it",
    "dglkit.tboard": "the job's TensorBoard curves in its run folder, on the controller (roles/dgl_job runs it with "
                     "Ansible's Python)",
}
# The modules that run as programs and are not on the page, and why.
UNLISTED = {
    "dglkit.follow": "the supervisor that `dglkit follow` starts, given its directory alone",
    "dglkit.lock": "cluster_lock's script (`python3 -c`, before any venv exists): take LOCK OWNER, release LOCK",
}


def subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser, str]]:
    """Each (name, parser, one-line help) under parser's sub-commands, in declaration order."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, sub, helps.get(name, "")


def invocation(action: argparse.Action) -> str:
    """The option as typed: its flags and, when it takes a value, the value's name."""
    flags = ", ".join(action.option_strings) or action.dest
    if action.nargs == 0:
        return flags
    metavar = action.metavar or ("{" + ",".join(map(str, action.choices)) + "}" if action.choices else action.dest.upper())
    shape = {"?": f"[{metavar}]", "*": f"[{metavar} ...]", "+": f"{metavar} [{metavar} ...]"}
    value = shape.get(str(action.nargs), str(metavar))
    return value if not action.option_strings else f"{flags} {value}"


def described(action: argparse.Action, prog: str) -> str:
    """The help text as `--help` shows it (%(default)s and the like filled in)."""
    if not action.help:
        return ""
    params = {**vars(action), "prog": prog}
    if action.choices is not None:
        params["choices"] = ", ".join(map(str, action.choices))
    return action.help % params


def default_cell(action: argparse.Action) -> str:
    if action.required:
        return "required"
    # A help that speaks of its default says it better (and a default such as this checkout's path is no docs').
    if action.nargs == 0 or action.default in (None, argparse.SUPPRESS) or "default" in (action.help or ""):
        return ""
    return f"`{action.default}`"


def cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def one_of(parser: argparse.ArgumentParser) -> dict[argparse.Action, str]:
    """The default cell of each option of a required mutually exclusive group: the options to choose from."""
    return {action: "one of " + ", ".join(f"`{choice.option_strings[0]}`" for choice in group._group_actions)
            for group in parser._mutually_exclusive_groups if group.required for action in group._group_actions}


def render_parser(title: str, parser: argparse.ArgumentParser, summary: str) -> list[str]:
    lines = [f"## `{title}`", "", summary or cell(parser.description or ""), ""]
    chosen = one_of(parser)
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if a.help != argparse.SUPPRESS
                   and not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]
        if not actions:
            continue
        if group.title not in ("options", "optional arguments", "positional arguments"):
            title = cell(group.title or "").replace("*", "\\*")  # a title such as ogbn-* in italics
            lines += [f"*{title}*" + (f": {cell(group.description)}" if group.description else ""), ""]
        lines += ["| option | default | |", "|---|---|---|"]
        lines += [f"| `{invocation(a)}` | {chosen.get(a) or default_cell(a)} | {cell(described(a, parser.prog))} |"
                  for a in actions]
        lines.append("")
    for name, sub, help_text in subcommands(parser):
        lines += render_parser(f"{title} {name}", sub, help_text)
    return lines


def render() -> str:
    from dglkit.__main__ import COMMANDS, command_parser  # the commands' modules import dgl: only when asked

    lines = [INTRO, f"<!-- {GENERATED} -->", ""]
    for name, sub, help_text in subcommands(command_parser(COMMANDS)):
        lines += render_parser(f"dglkit {name}", sub, help_text)
    for module_name, summary in PROGRAMS.items():
        parser = importlib.import_module(module_name).argument_parser()
        lines += render_parser(parser.prog, parser, summary)
    return "\n".join(lines).rstrip("\n") + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[2],
                        help="the repository (default: the one this file is in)")
    parser.add_argument("--write", action="store_true", help=f"rewrite {DOCS_FILE} when it differs from the parsers")


def run(args: argparse.Namespace) -> int:
    path = args.root / DOCS_FILE
    text = render()
    if path.exists() and path.read_text() == text:
        return 0
    if args.write:
        path.write_text(text)
        print(f"rewrote {DOCS_FILE}")
        return 0
    print(f"{DOCS_FILE} differs from the commands' parsers (make docs rewrites it)", file=sys.stderr)
    return 1
