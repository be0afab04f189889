#!/usr/bin/env python3
"""Find (and optionally download) a release sdist on PEP 503 simple indexes.

--resolve prints the file's URL when an index lists NAME-VERSION.tar.gz with the
expected sha256; --dest DIR also downloads it there (kept when already present
with the right sha256). Exits 1 naming every index tried when none has it.
Standard library only: runs with the builder's system Python.
"""

import argparse
import hashlib
import html.parser
import os
import sys
import tempfile
import time
import urllib.parse
import urllib.request


class _Links(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.links = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            href = dict(attrs).get("href")
            if href:
                self.links.append(href)


def _sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _open(url, timeout, attempts=4):
    """urlopen with retries: a builder's resolver or proxy may fail transiently."""
    for attempt in range(1, attempts + 1):
        try:
            return urllib.request.urlopen(url, timeout=timeout)
        except OSError:
            if attempt == attempts:
                raise
            time.sleep(5 * attempt)
    raise AssertionError("unreachable")


def find(indexes, name, version, sha256):
    filename = f"{name}-{version}.tar.gz"
    tried = []
    for index in indexes:
        page = index.rstrip("/") + f"/{name}/"
        try:
            with _open(page, 60) as response:
                text = response.read().decode("utf-8", "replace")
        except Exception as err:  # report any failure per index
            tried.append(f"{page}: {err}")
            continue
        parser = _Links()
        parser.feed(text)
        for href in parser.links:
            url = urllib.parse.urljoin(page, href)
            path, _sep, fragment = url.partition("#")
            if os.path.basename(urllib.parse.urlparse(path).path) != filename:
                continue
            listed = dict(part.split("=", 1) for part in fragment.split("&") if "=" in part).get("sha256")
            if listed and listed != sha256:
                tried.append(f"{page}: {filename} has sha256 {listed}, expected {sha256}")
                break
            return path, tried
        else:
            tried.append(f"{page}: no {filename}")
    return None, tried


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--index", action="append", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--version", required=True)
    parser.add_argument("--sha256", required=True)
    parser.add_argument("--resolve", action="store_true")
    parser.add_argument("--dest")
    args = parser.parse_args()

    target = os.path.join(args.dest, f"{args.name}-{args.version}.tar.gz") if args.dest else None
    if target and os.path.isfile(target) and _sha256(target) == args.sha256:
        print(f"present {target}")
        return 0
    url, tried = find(args.index, args.name, args.version, args.sha256)
    if url is None:
        print(f"{args.name}-{args.version}.tar.gz (sha256 {args.sha256}) not found: " + "; ".join(tried))
        return 1
    if not target:
        print(url)
        return 0
    fd, tmp = tempfile.mkstemp(dir=args.dest, suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out, _open(url, 300) as response:
            while block := response.read(1 << 20):
                out.write(block)
        got = _sha256(tmp)
        if got != args.sha256:
            print(f"{url}: downloaded sha256 {got}, expected {args.sha256}")
            return 1
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    print(f"downloaded {target} from {url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
