#!/usr/bin/env python3
"""restamp_wheel.py WHEEL NAME VERSION DEST_DIR: copy a wheel under another
distribution name and version (file name, .dist-info directory, METADATA
Name/Version, RECORD hashes), for vllm_build_stand_in_wheel only: the test
scenario's prebuilt wheel then comes out of build.sh named as the compile's
own wheel would be. Standard library only; prints the new wheel's path.
"""

import base64
import hashlib
import os
import re
import sys
import zipfile


def _record_hash(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def restamp(source, name, version, dest_dir):
    base = os.path.basename(source)
    match = re.match(r"^([^-]+)-([^-]+)-(.+\.whl)$", base)
    if not match:
        raise SystemExit(f"{base}: not a wheel file name")
    old_info = f"{match.group(1)}-{match.group(2)}.dist-info/"
    norm = re.sub(r"[-_.]+", "_", name)
    new_info = f"{norm}-{version}.dist-info/"
    target = os.path.join(dest_dir, f"{norm}-{version}-{match.group(3)}")
    record = []
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as new:
        for info in old.infolist():
            if info.filename == old_info + "RECORD":
                continue
            data = old.read(info)
            path = info.filename.replace(old_info, new_info, 1) if info.filename.startswith(old_info) else info.filename
            if path == new_info + "METADATA":
                text = data.decode("utf-8")
                text = re.sub(r"(?m)^Name: .*$", f"Name: {name}", text, count=1)
                text = re.sub(r"(?m)^Version: .*$", f"Version: {version}", text, count=1)
                data = text.encode("utf-8")
            entry = zipfile.ZipInfo(path, date_time=info.date_time)
            entry.external_attr = info.external_attr
            new.writestr(entry, data, compress_type=zipfile.ZIP_DEFLATED)
            record.append(f"{path},{_record_hash(data)},{len(data)}")
        record.append(f"{new_info}RECORD,,")
        new.writestr(new_info + "RECORD", "\n".join(record) + "\n")
    return target


if __name__ == "__main__":
    if len(sys.argv) != 5:
        raise SystemExit(__doc__)
    print(restamp(*sys.argv[1:]))
