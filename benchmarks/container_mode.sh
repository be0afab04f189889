#!/usr/bin/env bash
# Container mode vs venv mode (issue 30), from scratch, inside one privileged "nest" container that runs systemd
# and podman 5.4 (Debian 13), as a host of the fleet would:
#
#   1. image      debootstrap a Debian 12 base from the archive, podman import it, build the vLLM image from the
#                 wheelhouse (no network, no secret, no model), and a second tag (a label change) for the upgrade;
#   2. units      plan the nest's own CPU facts and write the units with container_unit(), the seccomp profile with
#                 seccomp_profile(), the env file with podman_env_file(); quadlet -dryrun; the podman secret;
#   3. checks     the unit is active, the binding inside the container equals the plan, vLLM logs it, 200 with the
#                 key and 401 without, where the key shows, numa_migrate_pages with the fleet's profile and with
#                 podman's default, --cpuset-cpus of a narrower plan, the podman-run style (podman 4.3.1's);
#   4. measures   cold and warm start (unit start -> /health 200), RSS/PSS, image size, tokens/s with
#                 tools/loadgen.py, for the container and for the venv mode (the same files run by systemd from
#                 RootDirectory=, the venv unit's hardening and CPUAffinity=), sessions alternating C V C V.
#
# Usage, from the repository root, as root (podman rootful):
#   nice -n 10 benchmarks/container_mode.sh
# Environment (defaults):
#   WHEELHOUSE=.cache/wheelhouse/cp311   the cp311 wheelhouse of scripts/wheelhouse.sh (vllm-0.32.0.json and wheels)
#   MODEL=.cache/models/tiny-llama       the model directory (tools/make_tiny_model.py)
#   NEST_IMAGE=localhost/vllm-fleet/debian:13   the nest's image (scripts/build-images.sh); podman and crun are
#                                        installed from the Debian archive when it has none
#   NEST=nest-cm                         the nest container's name (its storage volume is $NEST-storage)
#   OUT=/tmp/container-mode-<time>       where every figure, log and generated file is kept
#   PAIRS=5                              sessions per mode (each a start, a 10 s warm-up and the rounds), alternating
#   ROUNDS=1 LOAD_SECONDS=60 CONCURRENCY=4 TOKENS=64   the load of a session (every request generates TOKENS)
#   KEEP=0                               1 keeps the nest container and its volume
#   EXPORT_IMAGE=0                       1 loads the built image into this host's podman storage at the end
# Prints the figures at the end (also $OUT/summary.json). Takes about 40 minutes on 2 shared CPUs.
#
# The nest is privileged only because it nests a container runtime (namespaces, mounts, cgroups, seccomp filter
# installation by the inner crun); the vLLM container inside runs with exactly the production options. Harness
# settings that production does not need are marked "harness" below.
# shellcheck disable=SC2016  # the nest's scripts are single-quoted on purpose: they expand in the nest
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
VERSION=0.32.0
WHEELHOUSE=$(realpath "${WHEELHOUSE:-$REPO/.cache/wheelhouse/cp311}")
MODEL=$(realpath "${MODEL:-$REPO/.cache/models/tiny-llama}")
NEST_IMAGE=${NEST_IMAGE:-localhost/vllm-fleet/debian:13}
NEST=${NEST:-nest-cm}
OUT=${OUT:-/tmp/container-mode-$(date -u +%Y%m%dT%H%M%SZ)}
ROUNDS=${ROUNDS:-1}
LOAD_SECONDS=${LOAD_SECONDS:-60}
PAIRS=${PAIRS:-5}
CONCURRENCY=${CONCURRENCY:-4}
TOKENS=${TOKENS:-64}
KEEP=${KEEP:-0}
EXPORT_IMAGE=${EXPORT_IMAGE:-0}
CTR=vllm-vllm-0

manifest=$WHEELHOUSE/vllm-$VERSION.json
[ -f "$manifest" ] || { echo "container_mode: no $manifest (run scripts/wheelhouse.sh)" >&2; exit 1; }
[ -f "$MODEL/config.json" ] || { echo "container_mode: no model in $MODEL (tools/make_tiny_model.py)" >&2; exit 1; }
if podman container exists "$NEST"; then
  echo "container_mode: a container $NEST exists; remove it or set NEST" >&2
  exit 1
fi
mkdir -p "$OUT/build"
echo "container_mode: results in $OUT"

# The image's tag, <version>-<build class>-<inputs key> (docs/container-mode.md), and its pip requirements: the
# manifest's exact pins and the vLLM wheel, installed with --no-index --no-deps as roles/vllm_install does.
KEY_FULL=$(python3 -c '
import json, sys
m = json.load(open(sys.argv[1]))
print(m["inputs_key"])
with open(sys.argv[2], "w") as out:
    out.writelines("%s==%s\n" % (d["name"], d["version"]) for d in m["deps"])
    out.write("/wheels/" + m["vllm_wheel"] + "\n")
' "$manifest" "$OUT/build/requirements.txt")
IMAGE=localhost/vllm-cpu:$VERSION-$(uname -m)-${KEY_FULL:0:8}
IMAGE2=$IMAGE-r2
BASE=localhost/vllm-fleet/vllm-base:bookworm
cat > "$OUT/build/Containerfile" <<'EOF'
# The container mode's vLLM image (docs/container-mode.md "The image"): Debian 12 from the archive (debootstrap,
# podman import), the venv at /opt/vllm/venv from the wheelhouse, no entrypoint, no secret, no model, no account.
ARG BASE
FROM ${BASE}
COPY requirements.txt /opt/vllm/requirements.txt
# The wheels come from a build-time volume (podman build -v WHEELHOUSE:/wheels:ro): none stays in a layer.
RUN python3 -m venv /opt/vllm/venv \
 && /opt/vllm/venv/bin/python -m pip install --no-cache-dir --disable-pip-version-check --isolated \
      --no-index --find-links /wheels --no-deps -r /opt/vllm/requirements.txt \
 && /opt/vllm/venv/bin/python -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" \
 && test -e /opt/vllm/venv/lib/libiomp5.so \
 && /opt/vllm/venv/bin/python -m pip uninstall --yes --disable-pip-version-check pip >/dev/null
ENV PATH=/opt/vllm/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8 \
    PYTHONDONTWRITEBYTECODE=1
# The version, inputs key and revision come as `podman build --label`: buildah 1.39 reuses a cached LABEL step
# whose ARG changed (a revision 2 built after revision 1 carried revision 1's label).
EOF

# Run a bash script (stdin) in the nest, after /out/harness.sh (below): nx [args...]
nx() {
  { echo 'source /out/harness.sh'; cat; } |
    podman exec -i -e PODMAN_IGNORE_CGROUPSV1_WARNING=1 -e PYTHONPATH=/src/collections -e "TASKSET=${TASKSET:-}" \
      "$NEST" bash -euo pipefail -s -- "$@"
}
now() { date +%s.%N; }
since() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$(now)"; }
record() { printf '%s=%s\n' "$1" "$2" | tee -a "$OUT/figures.env"; }
loadavg() { cut -d' ' -f1-3 /proc/loadavg; }

cat > "$OUT/harness.sh" <<'EOF'
# harness (cgroup v1 hosts such as this test machine): the nest's systemd makes no cpu cgroup per unit, while crun
# puts the container in one. On v1 a cpu cgroup weighs as much as all its tasks together, so the container would
# get more CPU than the niced client beside it, and the venv mode's processes less. Both the client and the venv
# mode's vLLM get a cpu cgroup of their own (bench-client, bench-vllm), as the container has one.
cpu_group() {  # cpu_group NAME PID...
  [ -d /sys/fs/cgroup/cpu ] || return 0
  mkdir -p "/sys/fs/cgroup/cpu/$1"
  local pid
  for pid in "${@:2}"; do echo "$pid" > "/sys/fs/cgroup/cpu/$1/cgroup.procs"; done
}
# harness (cgroup v1): crun leaves the container's devices cgroups behind (libpod-payload-*), so the unit's
# devices cgroup outlives the unit; a venv unit (PrivateDevices=yes) writes its short device list there and the
# next container's crun fails: "write file `devices.allow`: Operation not permitted". cgroup v2 has no such file.
clean_devices_cgroup() {
  local unit
  [ -d /sys/fs/cgroup/devices ] || return 0
  find /sys/fs/cgroup/devices -type d -name vllm@vllm-0.service | while read -r unit; do
    find "$unit" -mindepth 1 -depth -type d -exec rmdir {} + 2>/dev/null || true
    rmdir "$unit" 2>/dev/null || echo a > "$unit/devices.allow"
  done
}
# CPU seconds of the service account's processes (every thread), for CPU time per token.
service_cpu_seconds() {
  python3 -c '
import os, pwd
uid, ticks, total = pwd.getpwnam("vllm").pw_uid, os.sysconf("SC_CLK_TCK"), 0
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        if os.stat(f"/proc/{pid}").st_uid == uid:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    except OSError:
        pass
print(total / ticks)'
}
EOF

cleanup() {
  local status=$?
  if [ "$status" != 0 ]; then
    echo "container_mode: failed (status $status); the nest $NEST is kept for a look (podman rm -f $NEST;" \
      "podman volume rm $NEST-storage)" >&2
  elif [ "$KEEP" != 1 ]; then
    podman rm -f "$NEST" >/dev/null 2>&1 || true
    podman volume rm -f "$NEST-storage" >/dev/null 2>&1 || true
  fi
}
trap cleanup EXIT

# ------------------------------------------------------------------------------------------------ the nest
t=$(now)
record run_started "$(date -u +%FT%TZ)"
record loadavg_start "$(loadavg)"
podman volume create "$NEST-storage" >/dev/null
# harness: the sandbox drops CAP_SYS_RESOURCE, so no limit may go above what podman got; /dev/shm of 1 GiB for
# the venv mode (it uses the host's /dev/shm, the nest's); an empty volume (nocopy) for the nested storage, so
# podman uses the kernel's overlay on ext4, not fuse-overlayfs.
podman run -d --name "$NEST" --hostname "$NEST" --systemd=always --privileged \
  --ulimit nofile=20000:20000 --ulimit nproc=4096:4096 --shm-size=1g \
  -v "$NEST-storage:/var/lib/containers:nocopy" \
  -v "$WHEELHOUSE:/wheels:ro" -v "$MODEL:/model:ro" -v "$REPO:/src:ro" -v "$OUT:/out" \
  "$NEST_IMAGE" /sbin/init >/dev/null
nx <<'EOF'
systemctl is-system-running --wait >/dev/null || true
# harness: the nested containers may not raise their limits above the nest's either.
mkdir -p /etc/containers
printf '[containers]\ndefault_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]\n' > /etc/containers/containers.conf
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
need=(debootstrap curl)
command -v podman >/dev/null || need+=(podman)
command -v crun >/dev/null || need+=(crun)
apt-get install -y -qq "${need[@]}" >/dev/null
podman --version
podman info --format '{{.Host.OCIRuntime.Name}} cgroups {{.Host.CgroupsVersion}} {{.Store.GraphDriverName}} native-diff={{index .Store.GraphStatus "Native Overlay Diff"}}'
EOF
record nest_seconds "$(since "$t")"

# ------------------------------------------------------------------------------------------------ 1. the image
t=$(now)
nx "$BASE" <<'EOF'
root=/var/tmp/bookworm
rm -rf "$root"
# python3-dev and g++: vLLM's CPU backend compiles with torch inductor at warm-up ("No working C++ compiler found"
# without them); the toolchain role installs the same on a venv host (toolchain_runtime_packages).
debootstrap --variant=minbase \
  --include=python3,python3-venv,python3-dev,g++,libnuma1,libgomp1,libtcmalloc-minimal4 \
  bookworm "$root" http://deb.debian.org/debian > /out/debootstrap.log 2>&1
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
tar -C "$root" -c . | podman import --quiet --change 'ENV LANG=C.UTF-8' - "$1" >/dev/null
rm -rf "$root"
EOF
record base_seconds "$(since "$t")"
build() {  # build TAG REVISION
  nx "$BASE" "$1" "$2" "$VERSION" "$KEY_FULL" <<'EOF'
podman build --network none --pull=never -v /wheels:/wheels:ro --build-arg "BASE=$1" \
  --label "org.opencontainers.image.version=$4" --label "vllm-fleet.inputs-key=$5" \
  --label "vllm-fleet.image-revision=$3" -t "$2" /out/build > "/out/build-r$3.log" 2>&1
EOF
}
t=$(now); build "$IMAGE" 1; record build_seconds "$(since "$t")"
t=$(now); build "$IMAGE2" 2; record build_r2_seconds "$(since "$t")"
record image_bytes "$(nx "$IMAGE" <<<'podman image inspect --format "{{.Size}}" "$1"')"
record base_image_bytes "$(nx "$BASE" <<<'podman image inspect --format "{{.Size}}" "$1"')"
t=$(now)
record image_archive_bytes "$(nx "$IMAGE" <<<'podman save -q -o /var/tmp/image.tar "$1"; stat -c %s /var/tmp/image.tar; rm /var/tmp/image.tar')"
record image_save_seconds "$(since "$t")"
nx "$IMAGE" > "$OUT/image-inspect.txt" <<'EOF'
podman image inspect --format 'id {{.Id}}
entrypoint {{.Config.Entrypoint}} cmd {{.Config.Cmd}} user "{{.Config.User}}"
env {{.Config.Env}}
labels {{.Config.Labels}}' "$1"
podman history "$1"
podman run --rm --pull=never --network none "$1" sh -c 'python --version; ls /opt/vllm/venv/lib/libiomp5.so; getent passwd vllm || echo "no vllm account"; ls /run/secrets 2>/dev/null || echo "no /run/secrets"; du -sh /opt/vllm/venv'
EOF
cat "$OUT/image-inspect.txt"

# ------------------------------------------------------------------------------------------------ 2. the host
nx <<'EOF'
id vllm >/dev/null 2>&1 || useradd --system --home-dir /var/lib/vllm --shell /usr/sbin/nologin vllm
install -d -o vllm -g vllm -m 0750 /var/lib/vllm
install -d -m 0755 /var/lib/vllm/models /usr/local/lib/vllm-service /etc/vllm
cp -r /model /var/lib/vllm/models/tiny-llama
install -m 0644 /src/roles/vllm_service/files/vllm_service_auth.py /usr/local/lib/vllm-service/
( umask 077; head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > /root/api-key )
podman secret create vllm-api-key /root/api-key >/dev/null
# The venv mode's secrets.env, as roles/vllm_service/templates/secrets.env.j2 writes it (root:vllm 0640).
( umask 027; printf 'VLLM_SERVICE_API_KEY="%s"\n' "$(cat /root/api-key)" > /etc/vllm/secrets.env )
chgrp vllm /etc/vllm/secrets.env
EOF

use_container() {  # use_container IMAGE [units options...]: the Quadlet file instead of whatever unit was there
  nx "$@" <<'EOF'
systemctl stop vllm@vllm-0.service 2>/dev/null || true
clean_devices_cgroup
rm -rf /etc/systemd/system/vllm@.service /etc/systemd/system/vllm@vllm-0.service.d
rm -f /etc/containers/systemd/vllm@vllm-0.container
image=$1; shift
${TASKSET:-} python3 /src/benchmarks/container_mode_nest.py units --mode container --image "$image" "$@" > /out/units-container.json
systemctl daemon-reload
EOF
}
use_venv() {
  nx "$IMAGE" <<'EOF'
systemctl stop vllm@vllm-0.service 2>/dev/null || true
clean_devices_cgroup
rm -f /etc/containers/systemd/vllm@vllm-0.container
root=/srv/vllm-image-root
if [ ! -d "$root/opt/vllm/venv" ]; then
  # The same image's files, unpacked: systemd runs them from RootDirectory= (the wheelhouse is cp311 and the
  # nest's Debian 13 has Python 3.13, so no venv of the nest's own Python can hold these wheels).
  mkdir -p "$root"
  podman create --name nest-rootfs --pull=never "$1" true >/dev/null
  podman export nest-rootfs | tar -C "$root" -x
  podman rm nest-rootfs >/dev/null
  mkdir -p "$root/var/lib/vllm" "$root/usr/local/lib/vllm-service"
fi
python3 /src/benchmarks/container_mode_nest.py units --mode venv --root-directory "$root" > /out/units-venv.json
systemctl daemon-reload
EOF
}
cold() {  # the home as a new host has it: no compile cache
  nx <<<'find /var/lib/vllm -mindepth 1 -maxdepth 1 ! -name models -exec rm -rf {} +'
}
start() {  # start LABEL [restart]: seconds from systemctl start (or restart) to /health 200
  local label=$1 verb=${2:-start}
  nx "$label" "$verb" <<'EOF'
label=$1 verb=$2
t0=$(date +%s.%N)
systemctl "$verb" vllm@vllm-0.service
t1=$(date +%s.%N)
if [ -e /etc/systemd/system/vllm@.service ]; then  # the venv mode: its vLLM into a cpu cgroup (harness.sh)
  cpu_group bench-vllm "$(systemctl show -p MainPID --value vllm@vllm-0.service)"
fi
until [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 http://127.0.0.1:8000/health)" = 200 ]; do
  if ! systemctl is-active -q vllm@vllm-0.service && [ "$(systemctl show -p NRestarts --value vllm@vllm-0.service)" -gt 3 ]; then
    echo "start $label: the unit keeps failing" >&2; exit 1
  fi
  if python3 -c "import sys,time; sys.exit(time.time() - $t0 < 900)"; then echo "start $label: no /health in 900 s" >&2; exit 1; fi
  sleep 0.25
done
t2=$(date +%s.%N)
journalctl -u vllm@vllm-0.service --no-pager -o short-iso --since "@${t0%.*}" > "/out/journal-$label.txt"
python3 -c "print(f'{$t1 - $t0:.1f} {$t2 - $t0:.1f}')"
EOF
}
until_log() {  # until_log LABEL PATTERN: start, wait for a journal line, keep the journal
  nx "$@" <<'EOF'
label=$1 pattern=$2
t0=$(date +%s)
systemctl start vllm@vllm-0.service
until journalctl -u vllm@vllm-0.service --no-pager --since "@$t0" | grep -q -- "$pattern"; do
  [ $(($(date +%s) - t0)) -lt 900 ] || { echo "$label: no '$pattern' in 900 s" >&2; exit 1; }
  sleep 1
done
sleep 2
journalctl -u vllm@vllm-0.service --no-pager -o short-iso --since "@$t0" > "/out/journal-$label.txt"
EOF
}
load() {  # load LABEL: a 10 s warm-up, then ROUNDS x LOAD_SECONDS of tools/loadgen.py; memory at mid-round
  nx "$1" "$ROUNDS" "$LOAD_SECONDS" "$CONCURRENCY" "$TOKENS" <<'EOF'
label=$1 rounds=$2 seconds=$3 concurrency=$4 tokens=$5
cpu_group bench-client $$
gen() {
  python3 /src/tools/loadgen.py --url http://127.0.0.1:8000 --model tiny-llama --api-key-file /root/api-key \
    --concurrency "$concurrency" --max-tokens "$tokens" --long-max-tokens "$tokens" --long-every 1 \
    --expect-in-flight "$concurrency" --duration "$1" --out "$2"
}
python3 /src/benchmarks/container_mode_nest.py memory > "/out/memory-$label-idle.json"
gen 10 "/out/load-$label-warmup.json" >/dev/null
for round in $(seq 1 "$rounds"); do
  ( sleep $((seconds / 2)); python3 /src/benchmarks/container_mode_nest.py memory > "/out/memory-$label-load$round.json" ) &
  echo "$(cut -d' ' -f1-3 /proc/loadavg)" > "/out/loadavg-$label-$round.txt"
  before=$(service_cpu_seconds)
  gen "$seconds" "/out/load-$label-$round.json"
  echo "$before $(service_cpu_seconds)" > "/out/cpu-$label-$round.txt"
  wait
done
EOF
}

# ------------------------------------------------------------------------------------------------ 3. container, cold
use_container "$IMAGE"
nx > "$OUT/quadlet-dryrun.txt" 2>&1 <<<'/usr/libexec/podman/quadlet -dryrun'
cold
times=$(start container-cold); read -r active health <<<"$times"
record container_cold_active_seconds "$active"
record container_cold_health_seconds "$health"
nx "$CTR" > "$OUT/checks-container.txt" 2>&1 <<'EOF'
ctr=$1 key=$(cat /root/api-key)
echo "unit: $(systemctl is-active vllm@vllm-0.service)"
echo "plan: $(python3 -c 'import json; i = json.load(open("/out/units-container.json"))["plan_instance"]; print(i["cpus"], i["numa_nodes"], i["omp_threads_bind"])')"
echo "inside (podman exec, /proc/self/status):"; podman exec "$ctr" grep -E '^(Cpus|Mems)_allowed_list|^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status
echo "inside, vLLM's PID 1:"; podman exec "$ctr" grep -E '^(Cpus|Mems)_allowed_list' /proc/1/status
echo "podman inspect: $(podman inspect "$ctr" --format 'cpuset-cpus={{.HostConfig.CpusetCpus}} cpuset-mems={{.HostConfig.CpusetMems}} shm={{.HostConfig.ShmSize}} caps={{.HostConfig.CapAdd}} secopt={{.HostConfig.SecurityOpt}} readonly={{.HostConfig.ReadonlyRootfs}} user={{.Config.User}} image={{.ImageName}}')"
echo "id inside: $(podman exec "$ctr" id)"
echo "processes visible inside: $(podman exec "$ctr" sh -c 'ls -d /proc/[0-9]* | wc -l')"
echo "host paths inside: /etc/vllm $(podman exec "$ctr" test -e /etc/vllm && echo present || echo absent), /var/lib/containers $(podman exec "$ctr" test -e /var/lib/containers && echo present || echo absent)"
echo "root file system writable: $(podman exec "$ctr" sh -c 'touch /x 2>/dev/null && echo yes || echo no')"
echo "vLLM's log:"; grep -E 'core ids|NUMA binding|numa_migrate_pages|KV cache on node' /out/journal-container-cold.txt | cut -c1-240
body='{"model":"tiny-llama","prompt":"Hello","max_tokens":5}'
echo "completion with the key: $(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $key" -H 'Content-Type: application/json' -d "$body" http://127.0.0.1:8000/v1/completions)"
echo "completion without: $(curl -s -o /dev/null -w '%{http_code}' -H 'Content-Type: application/json' -d "$body" http://127.0.0.1:8000/v1/completions)"
echo "completion with a wrong key: $(curl -s -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer wrong' -H 'Content-Type: application/json' -d "$body" http://127.0.0.1:8000/v1/completions)"
echo "/tokenize without: $(curl -s -o /dev/null -w '%{http_code}' -H 'Content-Type: application/json' -d '{"model":"tiny-llama","prompt":"Hello"}' http://127.0.0.1:8000/tokenize)"
echo "/health, /metrics without: $(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8000/health) $(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8000/metrics)"
echo "the key's value appears in (count of lines):"
echo "  podman inspect: $(podman inspect "$ctr" | grep -c "$key" || true) (Config.Env shows $(podman inspect "$ctr" --format '{{range .Config.Env}}{{println .}}{{end}}' | grep -i 'api-key\|API_KEY' | tr '\n' ' '))"
echo "  systemctl cat: $(systemctl cat vllm@vllm-0.service | grep -c "$key" || true)"
echo "  systemctl show: $(systemctl show vllm@vllm-0.service | grep -c "$key" || true)"
echo "  /etc/containers/systemd, /run/systemd/generator, env file: $(grep -rl "$key" /etc/containers/systemd /run/systemd/generator /etc/vllm/vllm-0.podman.env 2>/dev/null | wc -l)"
echo "  the unit's journal: $(journalctl -u vllm@vllm-0.service --no-pager | grep -c "$key" || true)"
echo "  podman exec env (the container's environment): $(podman exec "$ctr" env | grep -c "$key" || true)"
echo "  /proc/<vLLM>/environ read by the host's vllm user: $(runuser -u vllm -- cat "/proc/$(podman inspect "$ctr" --format '{{.State.Pid}}')/environ" 2>/dev/null | tr '\0' '\n' | grep -c "$key" || true)"
echo "  podman's secret store: $(stat -c '%U:%G %a %n' /var/lib/containers/storage/secrets/filedriver/secretsdata.json)"
EOF
cat "$OUT/checks-container.txt"
nx > "$OUT/binding-container.json" <<<'python3 /src/benchmarks/container_mode_nest.py binding'
load container-1

# ------------------------------------------------------------------------------------------------ venv, cold
use_venv
cold
times=$(start venv-cold); read -r active health <<<"$times"
record venv_cold_active_seconds "$active"
record venv_cold_health_seconds "$health"
nx > "$OUT/checks-venv.txt" 2>&1 <<'EOF'
key=$(cat /root/api-key) pid=$(systemctl show -p MainPID --value vllm@vllm-0.service)
echo "unit: $(systemctl is-active vllm@vllm-0.service)"
grep -E '^(Cpus|Mems)_allowed_list|^(CapEff|NoNewPrivs|Seccomp):' "/proc/$pid/status"
echo "vLLM's log:"; grep -E 'core ids|NUMA binding|numa_migrate_pages|KV cache on node' /out/journal-venv-cold.txt | cut -c1-240
body='{"model":"tiny-llama","prompt":"Hello","max_tokens":5}'
echo "completion with the key: $(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $key" -H 'Content-Type: application/json' -d "$body" http://127.0.0.1:8000/v1/completions)"
echo "completion without: $(curl -s -o /dev/null -w '%{http_code}' -H 'Content-Type: application/json' -d "$body" http://127.0.0.1:8000/v1/completions)"
echo "the key's value appears in (count of lines):"
echo "  systemctl cat: $(systemctl cat vllm@vllm-0.service | grep -c "$key" || true)"
echo "  systemctl show: $(systemctl show vllm@vllm-0.service | grep -c "$key" || true)"
echo "  the unit's journal: $(journalctl -u vllm@vllm-0.service --no-pager | grep -c "$key" || true)"
echo "  /proc/<vLLM>/environ read by the host's vllm user: $(runuser -u vllm -- cat "/proc/$pid/environ" 2>/dev/null | tr '\0' '\n' | grep -c "$key" || true)"
echo "  secrets.env: $(stat -c '%U:%G %a %n' /etc/vllm/secrets.env), read by the vllm user: $(runuser -u vllm -- grep -c "$key" /etc/vllm/secrets.env || true)"
EOF
cat "$OUT/checks-venv.txt"
nx > "$OUT/binding-venv.json" <<<'python3 /src/benchmarks/container_mode_nest.py binding'
load venv-1

# ------------------------------------------------------------------------------------------------ container: upgrade
use_container "$IMAGE2"
times=$(start container-upgrade); read -r active health <<<"$times"
record container_upgrade_health_seconds "$health"
record container_upgrade_image "$(nx "$CTR" <<<'podman inspect "$1" --format "{{.ImageName}} revision {{index .Config.Labels \"vllm-fleet.image-revision\"}}"')"
load container-2

# ------------------------------------------------------------------------------------------------ venv, warm
use_venv
times=$(start venv-warm-2); read -r active health <<<"$times"
record venv_warm_health_seconds_2 "$health"
load venv-2

# ------------------------------------------------------------------------------------------------ container: rollback
use_container "$IMAGE"
times=$(start container-rollback); read -r active health <<<"$times"
record container_rollback_health_seconds "$health"
record container_rollback_image "$(nx "$CTR" <<<'podman inspect "$1" --format "{{.ImageName}} revision {{index .Config.Labels \"vllm-fleet.image-revision\"}}"')"
load container-3

# ------------------------------------------------------------------------------------------------ more pairs, warm
# The machine is shared: the modes alternate, one session each per pair, so that a busy minute of the machine
# does not fall on one mode only.
for pair in $(seq 3 "$PAIRS"); do
  if [ "$pair" -gt 3 ]; then
    use_container "$IMAGE"
    times=$(start "container-warm-$pair"); read -r active health <<<"$times"
    record "container_warm_health_seconds_$pair" "$health"
    load "container-$pair"
  fi
  use_venv
  times=$(start "venv-warm-$pair"); read -r active health <<<"$times"
  record "venv_warm_health_seconds_$pair" "$health"
  load "venv-$pair"
done

# ------------------------------------------------------------------------------------------------ negative control
# podman's own seccomp profile: vLLM's numa_migrate_pages is refused (EPERM).
use_container "$IMAGE" --seccomp default
nx > "$OUT/quadlet-dryrun-default-seccomp.txt" 2>&1 <<<'/usr/libexec/podman/quadlet -dryrun'
until_log container-default-seccomp "NUMA binding:"
record fleet_profile_migrate_failures "$(grep -c 'numa_migrate_pages failed' "$OUT/journal-container-cold.txt" || true)"
record default_profile_migrate_failures "$(grep -c 'numa_migrate_pages failed' "$OUT/journal-container-default-seccomp.txt" || true)"
record venv_migrate_failures "$(grep -c 'numa_migrate_pages failed' "$OUT/journal-venv-cold.txt" || true)"

# ------------------------------------------------------------------------------------------------ a narrower plan
# The facts read under taskset -c 1 (one CPU, no reserved one): --cpuset-cpus=1, and every process inside on CPU 1.
TASKSET="taskset -c 1" use_container "$IMAGE" --plan-option reserved_cpus=0
nx "$CTR" > "$OUT/checks-narrow.txt" 2>&1 <<'EOF'
grep -E 'PodmanArgs' /etc/containers/systemd/vllm@vllm-0.container
systemctl start vllm@vllm-0.service
t0=$(date +%s)
until journalctl -u vllm@vllm-0.service --no-pager --since "@$t0" | grep -q 'NUMA binding:'; do
  [ $(($(date +%s) - t0)) -lt 900 ] || { echo "narrow: no NUMA binding line in 900 s" >&2; exit 1; }
  sleep 1
done
echo "inside: $(podman exec "$1" grep -E '^Cpus_allowed_list' /proc/self/status)"
python3 /src/benchmarks/container_mode_nest.py binding | python3 -c 'import json, sys; print("processes:", sorted({(p["comm"], p["cpus"], p["mems"]) for p in json.load(sys.stdin)["processes"]}))'
journalctl -u vllm@vllm-0.service --no-pager --since "@$t0" | grep -E 'core ids|NUMA binding' | cut -c1-200
systemctl stop vllm@vllm-0.service
EOF
cat "$OUT/checks-narrow.txt"
# ------------------------------------------------------------------------------------------------ the podman-run style
# container_unit() for podman 4.3.1 (Debian 12: no Quadlet), run by this podman: vllm@.service and its drop-in.
# Below 5.3 the key is a file (/run/secrets), which the middleware does not read yet: every route but the open
# paths answers 401, even with the key (it fails closed).
use_container "$IMAGE" --podman-version "podman version 4.3.1"
nx "$CTR" > "$OUT/checks-podman-run.txt" 2>&1 <<'EOF'
ctr=$1 key=$(cat /root/api-key)
python3 -c 'import json; u = json.load(open("/out/units-container.json")); print(u["style"], u["secret_style"], u["files"])'
systemd-analyze verify vllm@vllm-0.service && echo "systemd-analyze verify: no complaint"
t0=$(date +%s)
systemctl start vllm@vllm-0.service
until [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 http://127.0.0.1:8000/health)" = 200 ]; do
  [ $(($(date +%s) - t0)) -lt 900 ] || { echo "podman-run: no /health in 900 s" >&2; exit 1; }
  sleep 1
done
echo "/health 200 after $(($(date +%s) - t0)) s"
echo "the container's cgroup: $(grep -E ':name=systemd:|^0::' "/proc/$(podman inspect "$ctr" --format '{{.State.Pid}}')/cgroup" | head -1)"
echo "inside: $(podman exec "$ctr" sh -c 'ls -ln /run/secrets | tail -1; echo "_FILE: $VLLM_SERVICE_API_KEY_FILE"')"
echo "the key in podman inspect: $(podman inspect "$ctr" | grep -c "$key" || true)"
echo "with the key: $(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $key" http://127.0.0.1:8000/v1/models), without: $(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8000/v1/models)"
t=$(date +%s.%N)
systemctl stop vllm@vllm-0.service
echo "stop: $(python3 -c "print(f'{$(date +%s.%N) - $t:.1f}')") s, $(systemctl show -p Result --value vllm@vllm-0.service)"
EOF
cat "$OUT/checks-podman-run.txt"

record loadavg_end "$(loadavg)"
record run_ended "$(date -u +%FT%TZ)"

if [ "$EXPORT_IMAGE" = 1 ]; then
  nx "$IMAGE" <<<'podman save -q "$1"' | podman load -q
fi

# ------------------------------------------------------------------------------------------------ the figures
python3 - "$OUT" "$TOKENS" <<'EOF'
import glob, json, os, sys
out, tokens = sys.argv[1], int(sys.argv[2])
figures = dict(line.rstrip("\n").split("=", 1) for line in open(os.path.join(out, "figures.env")))
def load(mode):
    rows = []
    for path in sorted(glob.glob(os.path.join(out, f"load-{mode}-[0-9]*-[0-9]*.json"))):
        result = json.load(open(path))
        name = os.path.basename(path)[5:-5]
        before, after = map(float, open(os.path.join(out, f"cpu-{name}.txt")).read().split())
        rows.append({"round": os.path.basename(path)[5:-5], "tokens_per_s": round(result["answered"] * tokens / result["seconds"], 1),
                     "requests_per_s": round(result["answered"] / result["seconds"], 2), "failed": result["failed"],
                     "server_cpu_s_per_1k_tokens": round((after - before) / (result["answered"] * tokens / 1000), 3),
                     "p50_s": result["latency_p50_s"], "p95_s": result["latency_p95_s"],
                     "loadavg": open(os.path.join(out, f"loadavg-{name}.txt")).read().strip()})
    return rows
def memory(mode, when):
    rows = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(out, f"memory-{mode}-{when}*.json")))]
    assert rows, (mode, when)
    return [{k: r[k] for k in ("service_processes", "service_rss_mib", "service_pss_mib", "unit_rss_mib")} | {"other": r["other_in_unit"]} for r in rows]
import statistics
summary = {"figures": figures}
for mode in ("container", "venv"):
    rows = load(mode)
    summary[mode] = {"load": rows, "memory_idle": memory(mode, "*-idle"), "memory_load": memory(mode, "*-load")}
    summary[mode]["median"] = {key: statistics.median(row[key] for row in rows)
                               for key in ("tokens_per_s", "requests_per_s", "p50_s", "p95_s", "server_cpu_s_per_1k_tokens")}
    summary[mode]["median"]["failed"] = sum(row["failed"] for row in rows)
    for key in ("service_rss_mib", "service_pss_mib"):
        summary[mode]["median"][key + "_idle"] = statistics.median(row[key] for row in summary[mode]["memory_idle"])
        summary[mode]["median"][key + "_load"] = statistics.median(row[key] for row in summary[mode]["memory_load"])
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=1)
print(json.dumps(figures, indent=1))
for mode in ("container", "venv"):
    print(mode, "sessions:", " ".join(f"{row['round']}={row['tokens_per_s']}" for row in summary[mode]["load"]))
    print(mode, "median:", json.dumps(summary[mode]["median"]))
EOF
