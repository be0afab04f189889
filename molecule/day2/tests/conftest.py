"""The serve scenario's hooks, shared: print the services' journals when a test fails, and
reach another molecule host (get_host)."""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "serve_conftest", Path(__file__).resolve().parents[2] / "serve" / "tests" / "conftest.py"
)
_serve = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_serve)

pytest_runtest_makereport = _serve.pytest_runtest_makereport
get_host = _serve.get_host
