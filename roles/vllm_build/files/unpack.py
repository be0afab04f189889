#!/usr/bin/env python3
"""unpack.py TARBALL DEST: unpack a .tar.gz/.tar.xz with its top directory stripped.

Standard library only (no xz binary needed on the builder). DEST must not exist;
the tree lands in DEST.part first and is renamed when complete.
"""

import os
import shutil
import sys
import tarfile


def main(tarball, dest):
    part = dest + ".part"
    shutil.rmtree(part, ignore_errors=True)
    os.makedirs(part)
    with tarfile.open(tarball) as archive:
        members = []
        for member in archive.getmembers():
            _unused, _sep, rest = member.name.partition("/")
            if not rest or member.name.startswith("/") or ".." in rest.split("/"):
                continue
            member.name = rest
            members.append(member)
        # Python < 3.11.4 has no extraction filters; the member check above keeps paths inside DEST.
        options = {"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}
        archive.extractall(part, members=members, **options)
    os.rename(part, dest)
    print(f"unpacked {tarball} into {dest}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
