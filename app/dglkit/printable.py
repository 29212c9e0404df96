"""Text that a job wrote, made safe to show on a terminal. Standard library only: the controller's stdout
callback (plugins/callback/dglkit.py) loads this file by its path, without the app's other modules."""

import re
from typing import Any

# ESC sequences whole (CSI with its parameters; OSC, DCS, SOS, PM and APC strings up to their terminator, or to
# the end when there is none; two-character escapes), their 8-bit (C1) forms, and every other C0 or C1 control
# character but newline and tab: a terminal acts on them (clears the screen, sets the title, moves the cursor).
CONTROL = re.compile(r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"
                     r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
                     r"|\x1b[ -/]*[0-~]?"
                     r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# Where every match of CONTROL starts: a text without one (nearly all, and a 32 MB archive in base64) is kept as it
# is after one quick scan.
CONTROL_CHARACTER = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str, lines: bool = True) -> str:
    """text without control characters; newlines and tabs stay when it is shown as lines, else become spaces."""
    if CONTROL_CHARACTER.search(text):
        text = CONTROL.sub("", text)
    return text if lines else text.replace("\n", " ").replace("\t", " ")


def scrub(value: Any) -> Any:
    """A JSON value with every string in it (keys too) made printable."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {printable(str(key)): scrub(item) for key, item in value.items()}
    if isinstance(value, list):
        return [scrub(item) for item in value]
    return value
