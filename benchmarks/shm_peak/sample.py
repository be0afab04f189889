"""Sample /dev/shm usage every INTERVAL seconds until STOPFILE exists.

Usage: sample.py STAMPFILE OUT.jsonl PHASEFILE STOPFILE [ROOTPIDFILE] [INTERVAL]

Per sample (one JSON line):
  t            seconds since sampler start (monotonic)
  wall         unix time
  phase        content of PHASEFILE (written by measure.sh)
  df_used      `df -B1 /dev/shm` "Used" column (bytes), by running df itself
  newer_size   sum of st_size of regular files under /dev/shm newer (mtime) than STAMPFILE
               (the same as `find /dev/shm -newer STAMP -type f -printf '%s\n' | sum`)
  newer_alloc  sum of st_blocks*512 of those files (what tmpfs actually holds; files may be sparse)
  new_size / new_alloc  same, for files whose (name, inode) was not present at sampler start
  files        {name: [size, alloc_bytes]} for files newer than STAMP or new since start
  maps         /dev/shm paths mapped by the server process tree (from /proc/PID/maps),
               incl. "(deleted)" ones that df counts but find cannot see
"""
import json
import os
import subprocess
import sys
import time

SHM = "/dev/shm"


def df_used():
    out = subprocess.run(["df", "-B1", "--output=used", SHM], capture_output=True, text=True, check=False).stdout
    return int(out.split()[-1])


def walk():
    res = {}
    for root, _dirs, files in os.walk(SHM):
        for f in files:
            p = os.path.join(root, f)
            try:
                st = os.lstat(p)
            except FileNotFoundError:
                continue
            if not os.path.isfile(p) or os.path.islink(p):
                continue
            res[os.path.relpath(p, SHM)] = st
    return res


def proc_tree(root_pid):
    pids = [root_pid]
    try:
        import psutil
        pids += [c.pid for c in psutil.Process(root_pid).children(recursive=True)]
    except Exception:
        pass
    return pids


def shm_maps(pids):
    seen = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as fh:
                for line in fh:
                    parts = line.split(None, 5)
                    if len(parts) == 6 and parts[5].startswith(SHM + "/"):
                        name = parts[5].strip()
                        lo, hi = (int(x, 16) for x in parts[0].split("-"))
                        d = seen.setdefault(name, {"pids": set(), "mapped": 0})
                        d["pids"].add(pid)
                        d["mapped"] = max(d["mapped"], hi - lo)
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return {k: {"pids": sorted(v["pids"]), "max_vma": v["mapped"]} for k, v in seen.items()}


def main():
    stamp, out, phasefile, stopfile = sys.argv[1:5]
    rootpidfile = sys.argv[5] if len(sys.argv) > 5 else ""
    interval = float(sys.argv[6]) if len(sys.argv) > 6 else 0.2
    stamp_mtime = os.stat(stamp).st_mtime
    base = {(n, st.st_ino) for n, st in walk().items()}
    t0 = time.monotonic()
    nxt = t0
    with open(out, "w") as fh:
        while not os.path.exists(stopfile):
            try:
                with open(phasefile, encoding="utf-8") as handle:
                    phase = handle.read().strip()
            except FileNotFoundError:
                phase = "?"
            used = df_used()
            cur = walk()
            files = {}
            newer_size = newer_alloc = new_size = new_alloc = 0
            for n, st in cur.items():
                is_newer = st.st_mtime > stamp_mtime
                is_new = (n, st.st_ino) not in base
                if is_newer:
                    newer_size += st.st_size
                    newer_alloc += st.st_blocks * 512
                if is_new:
                    new_size += st.st_size
                    new_alloc += st.st_blocks * 512
                if is_newer or is_new:
                    files[n] = [st.st_size, st.st_blocks * 512]
            maps = {}
            if rootpidfile:
                try:
                    with open(rootpidfile, encoding="utf-8") as handle:
                        rp = int(handle.read().strip())
                    maps = shm_maps(proc_tree(rp))
                except (FileNotFoundError, ValueError):
                    pass
            rec = {
                "t": round(time.monotonic() - t0, 3),
                "wall": round(time.time(), 3),
                "phase": phase,
                "df_used": used,
                "newer_size": newer_size,
                "newer_alloc": newer_alloc,
                "new_size": new_size,
                "new_alloc": new_alloc,
                "files": files,
                "maps": maps,
            }
            fh.write(json.dumps(rec) + "\n")
            fh.flush()
            nxt += interval
            time.sleep(max(0.0, nxt - time.monotonic()))


if __name__ == "__main__":
    main()
