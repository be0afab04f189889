"""Stands in for get-pip.py when ansible-test bootstraps pip in a test's virtualenv, offline.

ansible-test runs each sanity test in a virtualenv of its own (~/.ansible/test/venv) made without pip, and puts pip
there with get-pip.py from ci-files.testing.ansible.com, a host this machine and CI cannot reach, unless the script
is already in its cache (~/.ansible/test/cache/get_pip_<version>.py). scripts/bootstrap.sh copies this file there.

Like get-pip.py it runs in the new virtualenv with pip's arguments (the packages to install, such as pip==24.2, pip
options, and get-pip's own --no-setuptools and --no-wheel). It runs the pip wheel that Python's ensurepip bundles,
which installs those packages from the package index pip is configured for; ansible-test's pinned requirements
(ansible_test/_data/requirements/sanity.*.txt) come from there too, with the virtualenv's new pip.
"""

from __future__ import annotations

import argparse
import ensurepip
import glob
import os
import sys

# Where the pip wheel that ensurepip installs lies: beside ensurepip, or where Debian's python3-venv keeps it.
WHEEL_PLACES = (os.path.join(os.path.dirname(ensurepip.__file__), "_bundled"), "/usr/share/python-wheels")


def bundled_pip_wheel():
    """Return the path of the pip wheel that ensurepip installs from."""
    for place in WHEEL_PLACES:
        wheels = sorted(glob.glob(os.path.join(place, "pip-*.whl")))
        if wheels:
            return wheels[-1]
    raise SystemExit(f"ansible_test_get_pip: no pip wheel bundled with this Python ({', '.join(WHEEL_PLACES)})")


def main():
    """Install pip and the requested packages into the running Python's virtualenv."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("packages", nargs="*", help="what to install, such as pip==24.2 (and any pip install option)")
    parser.add_argument("--no-setuptools", action="store_true", help="get-pip.py's: nothing else is installed anyway")
    parser.add_argument("--no-wheel", action="store_true", help="get-pip.py's: nothing else is installed anyway")
    args, pip_options = parser.parse_known_args()
    if sys.prefix == sys.base_prefix:
        parser.error(f"{sys.executable} is not in a virtualenv: this installs only into ansible-test's own")
    sys.path.insert(0, bundled_pip_wheel())
    from pip._internal.cli.main import main as pip_main  # pylint: disable=import-outside-toplevel

    return pip_main(["install", "--upgrade", "--force-reinstall", *pip_options, *args.packages])


if __name__ == "__main__":
    sys.exit(main())
