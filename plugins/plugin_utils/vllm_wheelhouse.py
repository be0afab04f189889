"""The command that fills a controller wheelhouse (scripts/wheelhouse.sh), as the fix messages of preflight's
install and build_host sections and of the image plan (vllm_image.py) name it."""

import os
import shlex

# scripts/wheelhouse.sh by its path in this copy of the collection (a checkout or an installed one; preflight runs
# on the controller): the fix names a command that runs from any directory, into the wheelhouse preflight read.
WHEELHOUSE_SCRIPT = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__)))), "scripts", "wheelhouse.sh"
)


def wheelhouse_command(wheelhouse, *args):
    """The shell command that fills ``wheelhouse`` (controller directory) with ``args``."""
    return shlex.join(["bash", WHEELHOUSE_SCRIPT, "--dest", str(wheelhouse), *map(str, args)])
