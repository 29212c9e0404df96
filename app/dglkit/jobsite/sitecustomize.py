"""Imported first by every Python process of a job: the launcher puts this directory at the front of
PYTHONPATH. An uncaught exception ends the process at once, with its traceback. Without this, DGL's exit
handler waits for the other trainers, which wait in an all-reduce for this one: the process never exits,
torchrun never reports it, and the job hangs instead of failing.

(It takes the place of Debian's sitecustomize, which only installs apport's crash hook.)
"""
import os
import sys
import traceback


def exit_on_uncaught_exception(kind, value, tb) -> None:
    traceback.print_exception(kind, value, tb)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


sys.excepthook = exit_on_uncaught_exception
