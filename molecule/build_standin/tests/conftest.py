"""Shared by the build_standin tests: the patches in their applied order and the manifest."""

import json
import os
from pathlib import Path

import pytest

# The gcc 12.2 workaround's two patches first, then the inventory's backport.
PATCHES = [
    "01-01-x86-gcc-check-12.2.patch",
    "02-02-flash-mla-static-constexpr.patch",
    "03-01-cpu-triton-fallback-signature.patch",
]


@pytest.fixture(scope="module")
def manifest():
    path = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "artifacts" / "x86_64" / "vllm-0.32.0.json"
    return json.loads(path.read_text())
