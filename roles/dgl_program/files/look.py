#!/usr/bin/env python3
"""What dgl_program finds in the workspace, in one round trip: whether this version of the program is shipped,
the node environment's pin set, and the program environments that are complete.

Usage: look.py SHIPPED_DIR [PINS_FILE ENVS_DIR]   (the last two for a program with requirements)
Prints one JSON line: {"shipped": bool, "pins": text or null, "environments": [names]}.
"""

import json
import os
import sys


def main(shipped: str, pins_file: str = "", envs: str = "") -> None:
    pins = None
    if pins_file:
        try:
            with open(pins_file, encoding="utf-8") as record:
                pins = record.read()
        except FileNotFoundError:
            sys.exit(f"no {pins_file}: the node environment has no pin set; run site.yml")
    try:
        names = sorted(os.listdir(envs)) if envs else []
    except FileNotFoundError:
        names = []
    print(json.dumps({"shipped": os.path.exists(os.path.join(shipped, ".fingerprint")), "pins": pins,
                      "environments": [name for name in names if os.path.exists(os.path.join(envs, name, ".installed"))]}))


if __name__ == "__main__":
    main(*sys.argv[1:])
