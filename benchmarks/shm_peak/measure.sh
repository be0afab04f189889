#!/usr/bin/env bash
# Usage: measure.sh NAME TP OMP_BIND [extra vllm args...]
# Measures /dev/shm while one vLLM server starts, serves and stops (docs/benchmarks.md, "/dev/shm of a vLLM instance").
# SHM_MEASURE_DIR: where runs/ go (/tmp/shm-measure); VLLM_PYTHON: a venv with vLLM; MODEL: the tiny model.
# e.g.   measure.sh tp1 1 0
#        measure.sh tp2 2 '0|1' --distributed-executor-backend mp
# env: DTYPE (bfloat16), LOAD_CONC (3), LOAD_N (20)
# Writes runs/NAME/{server.log,samples.jsonl,load.json,meta.txt,leftover.txt}
set -u
HERE=${SHM_MEASURE_DIR:-/tmp/shm-measure}
PY=${VLLM_PYTHON:-$HERE/venv/bin/python}
MODEL=${MODEL:-$(cd "$(dirname "$0")/../.." && pwd)/.cache/models/tiny-llama}
NAME=$1; TP=$2; BIND=$3; shift 3
DTYPE=${DTYPE:-bfloat16}
RUN=$HERE/runs/$NAME
# keep vLLM's / inductor's caches under /tmp/shm-measure (the runs tp1..lim256m_tp2 ran before this was added,
# with vLLM's defaults /root/.cache/vllm and /tmp/torchinductor_root; that changes nothing on /dev/shm)
export VLLM_CACHE_ROOT=${VLLM_CACHE_ROOT:-$HERE/cache/vllm} TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$HERE/cache/inductor}
rm -rf "$RUN"; mkdir -p "$RUN"
PORT=$($PY -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
PHASE=$RUN/phase; STOP=$RUN/stop; PIDF=$RUN/server.pid; STAMP=$RUN/stamp
echo baseline > "$PHASE"

{
  echo "date: $(date -u +%FT%TZ)"
  echo "baseline df: $(df -B1 /dev/shm | tail -1)"
  echo "baseline files:"; ls -la --time-style=full-iso /dev/shm
} > "$RUN/meta.txt"

touch "$STAMP"; sleep 1.1   # mtime granularity margin: anything newer than STAMP was created after it
"$PY" "$(dirname "$0")/sample.py" "$STAMP" "$RUN/samples.jsonl" "$PHASE" "$STOP" "$PIDF" 0.2 &
SAMPLER=$!
sleep 2   # 10 baseline samples

ARGS=(-m vllm.entrypoints.openai.api_server --model "$MODEL" --served-model-name tiny-llama
      --max-model-len 512 --port "$PORT" --dtype "$DTYPE")
[ "$TP" != 1 ] && ARGS+=(--tensor-parallel-size "$TP")
ARGS+=("$@")
CMD="env VLLM_CACHE_ROOT=$VLLM_CACHE_ROOT TORCHINDUCTOR_CACHE_DIR=$TORCHINDUCTOR_CACHE_DIR VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND='$BIND' $PY ${ARGS[*]}"
echo "command: $CMD" >> "$RUN/meta.txt"
echo "load: concurrency=${LOAD_CONC:-3} requests=${LOAD_N:-20}; /dev/shm: $(df -B1 /dev/shm | tail -1)" >> "$RUN/meta.txt"
echo starting > "$PHASE"
T_START=$(date +%s.%N)
# setsid: own process group, so the cleanup can target exactly this server's group
VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND="$BIND" setsid "$PY" "${ARGS[@]}" > "$RUN/server.log" 2>&1 &
SPID=$!
echo $SPID > "$PIDF"

ok=0
for _ in $(seq 1 900); do   # up to 180 s
  if ! kill -0 $SPID 2>/dev/null; then break; fi
  if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; then ok=1; break; fi
  sleep 0.2
done
T_READY=$(date +%s.%N)
echo "ready: $ok after $(echo "$T_READY - $T_START" | bc) s" >> "$RUN/meta.txt"

if [ $ok = 1 ]; then
  echo load > "$PHASE"
  "$PY" "$(dirname "$0")/load.py" "$PORT" "$RUN/load.json" "${LOAD_CONC:-3}" "${LOAD_N:-20}" > "$RUN/load.out" 2>&1; echo "load rc: $?" >> "$RUN/meta.txt"
  echo post > "$PHASE"
  sleep 20
fi

echo stopping > "$PHASE"
T_STOP=$(date +%s.%N)
kill -INT $SPID 2>/dev/null
how=SIGINT
for _ in $(seq 1 300); do kill -0 $SPID 2>/dev/null || break; sleep 0.2; done   # 60 s
if kill -0 $SPID 2>/dev/null; then how="SIGINT+SIGTERM"; kill -TERM $SPID; sleep 15; fi
if kill -0 $SPID 2>/dev/null; then how="SIGINT+SIGTERM+SIGKILL(group)"; kill -KILL -- -$SPID; fi
wait $SPID 2>/dev/null; RC=$?
T_EXIT=$(date +%s.%N)
# any process left in the server's process group?
left=$(pgrep -a -g "$SPID" 2>/dev/null || true)
echo "stopped: $how rc=$RC after $(echo "$T_EXIT - $T_STOP" | bc) s; leftover procs: ${left:-none}" >> "$RUN/meta.txt"
echo stopped > "$PHASE"
sleep 5
touch "$STOP"; wait $SAMPLER
{
  echo "after df: $(df -B1 /dev/shm | tail -1)"
  echo "after files:"; ls -la --time-style=full-iso /dev/shm
  echo "files newer than stamp still present:"; find /dev/shm -newer "$STAMP" -type f -printf '%s %p\n'
} > "$RUN/leftover.txt"
cat "$RUN/meta.txt" "$RUN/leftover.txt"
