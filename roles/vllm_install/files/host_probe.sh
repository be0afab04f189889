#!/bin/sh
# Read-only look at a host before installing vLLM: prints one JSON object.
# Usage: host_probe.sh PYTHON VENV_DIR HOST_WHEELHOUSE_DIR
python="$1"
venv="$2"
wheelhouse="$3"

# The nearest existing directory of a path that may not exist yet.
existing() {
  d="$1"
  while [ ! -d "$d" ]; do d="$(dirname "$d")"; done
  printf '%s' "$d"
}

free_bytes() { df -P -k "$1" | awk 'NR == 2 { printf "%.0f", $4 * 1024 }'; }
mount_of() { df -P -k "$1" | awk 'NR == 2 { printf "%s", $6 }'; }

venv_dir="$(existing "$venv")"
wh_dir="$(existing "$wheelhouse")"
venv_mount="$(mount_of "$venv_dir")"
wh_mount="$(mount_of "$wh_dir")"
same_fs=false
[ "$venv_mount" = "$wh_mount" ] && same_fs=true
marker=false
[ -f "$venv/vllm-install.json" ] && marker=true
glibc="$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{ print $2 }')"

# The version even when venv/ensurepip are missing (python3-venv comes later
# from the toolchain role): preflight judges the two separately.
py_info="$("$python" -c 'import sys; print("%d.%d cp%d%d" % (sys.version_info[:2] * 2))' 2>&1)"
if [ $? -eq 0 ]; then
  python_version="${py_info% *}"
  python_tag="${py_info#* }"
else
  python_version=""
  python_tag=""
fi
venv_check="$("$python" -c 'import venv, ensurepip' 2>&1)"
if [ $? -eq 0 ] && [ -n "$python_version" ]; then
  python_ok=true
  python_error=""
else
  python_ok=false
  python_error="$(printf '%s' "${venv_check:-$py_info}" | tail -n 1 | tr -d '"\\')"
fi

printf '{"python_ok": %s, "python_version": "%s", "python_tag": "%s", "python_error": "%s", ' \
  "$python_ok" "$python_version" "$python_tag" "$python_error"
printf '"glibc": "%s", "marker_exists": %s, "venv_mount": "%s", "venv_free_bytes": %s, ' \
  "$glibc" "$marker" "$venv_mount" "$(free_bytes "$venv_dir")"
printf '"wheelhouse_mount": "%s", "wheelhouse_free_bytes": %s, "same_fs": %s}\n' \
  "$wh_mount" "$(free_bytes "$wh_dir")" "$same_fs"
