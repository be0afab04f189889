"""The fleet scenario's stand-in vLLM (tools/standin_vllm, tools/standin_wheelhouse.py), as its hosts run it.

The wheelhouse is built as the scenario's prepare builds it and installed with the vllm_install role's own pip
arguments; the install check's reader (roles/vllm_install/files/inspect_venv.py) must see vLLM 0.32.0 on a CPU
torch; then `vllm serve` runs behind the real key middleware (roles/vllm_service/files/vllm_service_auth.py),
as the units start it, and must behave as the rollout expects vLLM to: no port before the start-up time, the
key required, completions streamed or not, vLLM's metric names, and a SIGTERM that cuts a generation in flight.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from conftest import REPO

KEY = "standin-test-key"


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    work = tmp_path_factory.mktemp("standin")
    house = work / "wheelhouse"
    built = subprocess.run(
        [sys.executable, str(REPO / "tools" / "standin_wheelhouse.py"), "--dest", str(house), "--vllm", "0.32.0"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    again = subprocess.run(
        [sys.executable, str(REPO / "tools" / "standin_wheelhouse.py"), "--dest", str(house), "--vllm", "0.32.0"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "up to date" in again.stdout, again.stdout
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    manifest = json.loads((house / tag / "vllm-0.32.0.json").read_text())
    assert manifest["vllm_dist"] == "vllm" and manifest["torch_wheel"].startswith("torch-")
    env_dir = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(env_dir)], check=True)
    requirements = work / "requirements.txt"
    requirements.write_text("".join(f"{d['name']}=={d['version']}\n" for d in manifest["deps"]) + "vllm==0.32.0\n")
    # The role's offline arguments (roles/vllm_install/tasks/install.yml).
    subprocess.run(
        [
            str(env_dir / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-cache-dir",
            "--disable-pip-version-check",
            "--isolated",
            "--no-index",
            "--find-links",
            str(house / tag),
            "--no-deps",
            "-r",
            str(requirements),
        ],
        check=True,
    )
    return env_dir


def test_install_check_sees_the_release_on_a_cpu_torch(venv):
    found = subprocess.run(
        [str(venv / "bin" / "python"), str(REPO / "roles/vllm_install/files/inspect_venv.py"), ""],
        capture_output=True,
        text=True,
        check=True,
    )
    data = json.loads(found.stdout)
    assert data["vllm_dist"] == "vllm" and data["vllm_version"] == "0.32.0"
    assert data["torch_cuda"] is None and data["torch_version"].startswith("2.")
    if os.uname().machine == "x86_64":
        assert (venv / "lib" / "libiomp5.so").is_file()


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _call(url, body=None, key=None, timeout=30):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers=headers, method="POST" if data else "GET")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


@pytest.fixture
def server(venv, tmp_path):
    port = _free_port()
    model = tmp_path / "model"
    model.mkdir()
    shutil.copy(REPO / "roles/vllm_service/files/vllm_service_auth.py", tmp_path)
    env = dict(
        os.environ,
        PYTHONPATH=str(tmp_path),
        VLLM_SERVICE_API_KEY=KEY,
        VLLM_SERVICE_OPEN_PATHS="/health /metrics",
        VLLM_STANDIN_STARTUP_SECONDS="1.5",
        VLLM_STANDIN_TOKEN_SECONDS="0.02",
    )
    started = time.monotonic()
    process = subprocess.Popen(
        [
            str(venv / "bin" / "vllm"),
            "serve",
            str(model),
            "--served-model-name",
            "standin",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--dtype",
            "bfloat16",
            "--block-size",
            "128",
            "--middleware",
            "vllm_service_auth.RequireApiKey",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    refused_early = False
    while time.monotonic() - started < 20:
        try:
            if _call(base + "/health", timeout=2)[0] == 200:
                break
        except (urllib.error.URLError, ConnectionError):
            refused_early = refused_early or time.monotonic() - started < 1.0
        time.sleep(0.1)
    yield {"base": base, "process": process, "refused_early": refused_early, "up_after": time.monotonic() - started}
    process.kill()
    process.wait()


def test_no_port_before_the_start_up_time_then_health(server):
    assert server["refused_early"], "the port answered before the stand-in's start-up time"
    assert server["up_after"] >= 1.5
    assert _call(server["base"] + "/health")[0] == 200


def test_the_key_middleware_guards_every_route_but_the_open_ones(server):
    base = server["base"]
    assert _call(base + "/v1/completions", {"prompt": "x", "max_tokens": 2})[0] == 401
    assert _call(base + "/invocations", {"prompt": "x"})[0] == 401
    assert _call(base + "/v1/completions", {"prompt": "x", "max_tokens": 2}, key="wrong")[0] == 401
    status, body = _call(base + "/v1/completions", {"prompt": "x", "max_tokens": 3}, key=KEY)
    answer = json.loads(body)
    assert status == 200 and answer["usage"]["completion_tokens"] == 3 and answer["choices"][0]["text"]
    status, body = _call(base + "/metrics")
    assert status == 200
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:generation_tokens_total",
        "vllm:kv_cache_usage_perc",
        "vllm:time_to_first_token_seconds_bucket",
    ):
        assert f"{name}{{" in body.decode(), name
    assert 'model_name="standin"' in body.decode()


def test_a_stream_sends_each_token_then_done(server):
    status, body = _call(server["base"] + "/v1/completions", {"prompt": "x", "max_tokens": 4, "stream": True}, key=KEY)
    events = [line for line in body.decode().splitlines() if line.startswith("data: ")]
    assert status == 200 and len(events) == 5 and events[-1] == "data: [DONE]"
    assert json.loads(events[-2][6:])["choices"][0]["finish_reason"] == "length"


def test_sigterm_cuts_a_generation_in_flight(server):
    """As vLLM's shutdown does: the answer never completes (the scenario's negative control rests on it)."""
    outcome = {}

    def long_request():
        try:
            outcome["answer"] = _call(server["base"] + "/v1/completions", {"prompt": "x", "max_tokens": 300}, key=KEY)
        except Exception as err:  # the cut, whatever its form
            outcome["error"] = type(err).__name__

    import threading

    thread = threading.Thread(target=long_request)
    thread.start()
    time.sleep(1.0)
    server["process"].send_signal(signal.SIGTERM)
    thread.join(30)
    assert server["process"].wait(10) == 0
    assert "error" in outcome, f"the generation completed through a SIGTERM: {outcome}"
