#!/usr/bin/env python3
"""Read-only: where the active-version link points and the install record of one directory.

Usage: install_dirs.py ACTIVE_LINK VENV_DIR
Prints {"active": "<link target or ''>", "record": {<VENV_DIR/vllm-install.json> or {}}}.
"""

import json
import os
import sys


def main(active_link, venv):
    try:
        active = os.readlink(active_link) if os.path.islink(active_link) else ""
    except OSError:
        active = ""
    try:
        with open(os.path.join(venv, "vllm-install.json"), encoding="utf-8") as handle:
            record = json.load(handle)
    except (OSError, ValueError):
        record = {}
    print(json.dumps({"active": active, "record": record}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
