"""docs/cli.md, the node CLI's option reference, made from the commands' own argparse parsers.

`python -m dglkit clidoc --write` (`make docs`) rewrites it; a kit test fails when it is stale. docs/design.md keeps
what the options cannot say: what each command is for and what it prints.
"""

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path

DOCS_FILE = "docs/cli.md"
GENERATED = "generated from the commands' parsers (app/dglkit) by `make docs`: change them there"
DESIGN_LINK = "design.md#the-node-cli-python--m-dglkit-command-console-script-dglkit"
INTRO = f"""# The node CLI's options

Every command is `python -m dglkit <command>` (console script `dglkit`) on a node; `dglkit A ARGS --then B ARGS`
runs several in one process. What each command is for, its files and its JSON result:
[docs/design.md, The node CLI]({DESIGN_LINK}).
"""


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


def render_parser(title: str, parser: argparse.ArgumentParser, summary: str) -> list[str]:
    lines = [f"## `{title}`", "", summary or cell(parser.description or ""), ""]
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if a.help != argparse.SUPPRESS
                   and not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]
        if not actions:
            continue
        if group.title not in ("options", "optional arguments", "positional arguments"):
            title = cell(group.title or "").replace("*", "\\*")  # a title such as ogbn-* in italics
            lines += [f"*{title}*" + (f": {cell(group.description)}" if group.description else ""), ""]
        lines += ["| option | default | |", "|---|---|---|"]
        lines += [f"| `{invocation(a)}` | {default_cell(a)} | {cell(described(a, parser.prog))} |" for a in actions]
        lines.append("")
    for name, sub, help_text in subcommands(parser):
        lines += render_parser(f"{title} {name}", sub, help_text)
    return lines


def render() -> str:
    from dglkit.__main__ import COMMANDS, command_parser  # the commands' modules import dgl: only when asked

    lines = [INTRO, f"<!-- {GENERATED} -->", ""]
    for name, sub, help_text in subcommands(command_parser(COMMANDS)):
        lines += render_parser(f"dglkit {name}", sub, help_text)
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
