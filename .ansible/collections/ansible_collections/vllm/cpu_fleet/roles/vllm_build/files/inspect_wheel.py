#!/usr/bin/env python3
"""inspect_wheel.py WHEEL: JSON of what the build role checks in a built wheel.

{wheel, sha256, size, version, requires_dist, url_requirements, libraries}:
url_requirements are Requires-Dist entries with a direct URL (`name @ url`),
which make the wheel uninstallable without that URL; libraries are the
compiled vllm/_C*.so modules by name (_C, _C_AVX512, _C_AVX2, ...).
"""

import hashlib
import json
import os
import re
import sys
import zipfile


def main(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    with zipfile.ZipFile(path) as wheel:
        names = wheel.namelist()
        metadata_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = wheel.read(metadata_name).decode("utf-8")
    requires = [line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    version = next((line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Version:")), "")
    libraries = sorted({m.group(1) for n in names if (m := re.match(r"^vllm/(_C[A-Za-z0-9_]*)\.[^/]*so$", n))})
    print(
        json.dumps(
            {
                "wheel": os.path.basename(path),
                "sha256": digest.hexdigest(),
                "size": os.path.getsize(path),
                "version": version,
                "requires_dist": requires,
                "url_requirements": [r for r in requires if re.match(r"^[A-Za-z0-9_.\-\[\], ]+@", r)],
                "libraries": libraries,
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1])
