"""`python -m dglkit <command>`: dispatches to one module per job."""

import argparse
import importlib
import sys
from collections.abc import Collection

from dglkit.common import UserError
from dglkit.progress import PROGRESS

# command -> (module, one-line help). Each module has add_arguments(parser) and run(args) -> int.
COMMANDS = {
    "prepare": ("dglkit.data", "build a DGL graph with features, labels and split masks"),
    "chunked": ("dglkit.chunkcmd", "write a synthetic graph in DGL's chunked format chunk by chunk, or check one"),
    "partition": ("dglkit.partition", "partition a prepared graph with METIS for N machines"),
    "mpi": ("dglkit.mpijob", "partition a graph across the workers at once under mpirun (check, run, watch)"),
    "train": ("dglkit.train", "distributed trainer of the built-in tasks (DGL runs it as server and as trainer)"),
    "jobdir": ("dglkit.jobdir", "make a job's directory for a run: earlier run to history/, job.json, settings.json"),
    "launch": ("dglkit.launch", "start and supervise this node's DGL servers and trainers"),
    "watch": ("dglkit.watch", "report the state of a running job across all nodes"),
    "report": ("dglkit.report", "summarise a finished job: summary and training curves"),
    "pack": ("dglkit.pack", "a job directory's regular files as one tar archive (links and FIFOs left out)"),
    "settings": ("dglkit.settings", "write the files generated from the job settings' declaration (--write)"),
    "clidoc": ("dglkit.clidoc", "write docs/cli.md, this CLI's options, from the commands' parsers (--write)"),
    "plan": ("dglkit.plan", "check a job's settings and derive its id and files (the controller, JSON in --request)"),
    "follow": ("dglkit.follow", "run a long dglkit command in the background and answer with its progress or its result"),
    "pip": ("dglkit.pipinstall", "run pip and report its progress: the packages read, then those installed"),
    "control": ("dglkit.control", "the job unit on this node: its state, stopping it, what a stopped job left"),
}

THEN = "--then"


def command_parser(chosen: Collection[str]) -> argparse.ArgumentParser:
    """The CLI's parser with the options of the chosen commands (docs/cli.md is made from all of them)."""
    parser = argparse.ArgumentParser(prog="dglkit", description=__doc__)
    commands = parser.add_subparsers(dest="subcommand", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        sub = commands.add_parser(name, help=help_text, description=help_text)
        # Import only the chosen command's module: importing dgl and torch costs seconds.
        if name in chosen:
            module = importlib.import_module(module_name)
            module.add_arguments(sub)
            sub.set_defaults(run=module.run)
    return parser


def run_command(argv: list[str]) -> int:
    args = command_parser(argv[:1]).parse_args(argv)
    PROGRESS.begin(args.subcommand)
    try:
        return args.run(args)
    except UserError as error:
        print(f"dglkit {args.subcommand}: error: {error}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    """`dglkit A ARGS --then B ARGS`: commands in order, in one process, until one fails. A playbook runs steps
    that follow each other (prepare, then partition) as one task: one round trip and one Python start."""
    segments: list[list[str]] = [[]]
    for arg in sys.argv[1:] if argv is None else argv:
        if arg == THEN:
            segments.append([])
        else:
            segments[-1].append(arg)
    for segment in segments:
        code = run_command(segment)
        if code:
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
