"""roles/vllm_service/files/smoke_completion.py against a local HTTP server that
answers like vLLM's /v1/completions: concurrency, API key, failures."""

import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "roles" / "vllm_service" / "files" / "smoke_completion.py"
spec = importlib.util.spec_from_file_location("smoke_completion", SCRIPT)
smoke = importlib.util.module_from_spec(spec)
spec.loader.exec_module(smoke)


@pytest.fixture
def server():
    state = {"in_flight": 0, "most": 0, "requests": [], "status": 200, "tokens": 3, "lock": threading.Lock()}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with state["lock"]:
                state["in_flight"] += 1
                state["most"] = max(state["most"], state["in_flight"])
                state["requests"].append((self.path, self.headers.get("Authorization"), body))
            time.sleep(0.3)  # long enough for the other requests to arrive
            with state["lock"]:
                state["in_flight"] -= 1
            answer = {"choices": [{"text": " Paris"}], "usage": {"completion_tokens": state["tokens"]}}
            data = json.dumps(answer).encode()
            self.send_response(state["status"])
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd.server_address[1], state
    httpd.shutdown()


def run(port, capsys, concurrency=4):
    rc = smoke.main(port, "tiny-llama", 4, concurrency, 10)
    return rc, json.loads(capsys.readouterr().out)


def test_sends_all_requests_at_once_with_the_key(server, capsys, monkeypatch):
    port, state = server
    monkeypatch.setenv("VLLM_SERVICE_API_KEY", "k3y")
    monkeypatch.setenv("VLLM_SMOKE_PROMPT", "The capital of France is")
    rc, out = run(port, capsys)
    assert rc == 0 and out["ok"] and out["completed"] == 4 and out["text"] == " Paris"
    assert state["most"] == 4
    assert {(path, auth) for path, auth, _unused in state["requests"]} == {("/v1/completions", "Bearer k3y")}
    assert all(
        body["prompt"] == "The capital of France is" and body["max_tokens"] == 4 for *_unused, body in state["requests"]
    )


def test_no_key_sends_no_header(server, capsys, monkeypatch):
    port, state = server
    monkeypatch.delenv("VLLM_SERVICE_API_KEY", raising=False)
    rc, _unused = run(port, capsys, concurrency=1)
    assert rc == 0 and state["requests"][0][1] is None


def test_an_error_status_fails_the_gate(server, capsys):
    port, state = server
    state["status"] = 500
    rc, out = run(port, capsys, concurrency=2)
    assert rc == 1 and not out["ok"] and out["completed"] == 0
    assert out["errors"][0].startswith("HTTP 500")


def test_an_answer_without_tokens_fails_the_gate(server, capsys):
    port, state = server
    state["tokens"] = 0
    rc, out = run(port, capsys, concurrency=2)
    assert rc == 1 and out["errors"] == ["answer without generated tokens"] * 2


def test_nobody_listening_fails_the_gate(capsys):
    rc = smoke.main(1, "m", 4, 2, 2)
    out = json.loads(capsys.readouterr().out)
    assert rc == 1 and len(out["errors"]) == 2 and "Connection refused" in out["errors"][0]


def script(port, env, *argv):
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(port), *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_the_script_reads_the_key_from_the_units_secrets_file(server, tmp_path):
    port, state = server
    # As secrets.env.j2 writes it: the value JSON-quoted.
    secrets = tmp_path / "secrets.env"
    secrets.write_text(
        '# managed\nHF_TOKEN="x"\nVLLM_SERVICE_API_KEY="s3cret \\"quoted\\""\nVLLM_SERVICE_PREVIOUS_API_KEY="p"\n'
    )
    env = {**os.environ, "VLLM_SMOKE_SECRETS_FILE": str(secrets), "VLLM_SERVICE_API_KEY": "not-this-one"}
    result = script(port, env, "tiny-llama", "4", "2", "10")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["completed"] == 2
    assert {auth for _unused, auth, _unused in state["requests"]} == {'Bearer s3cret "quoted"'}


def test_a_rolled_back_secrets_file_of_an_earlier_version_gives_its_key(tmp_path):
    # A snapshot taken before the keys were kept from vLLM: the key under the name vLLM reads.
    secrets = tmp_path / "secrets.env"
    secrets.write_text('VLLM_API_KEY="earlier"\n')
    assert smoke.key_from_secrets(str(secrets)) == "earlier"
    secrets.write_text('VLLM_API_KEY="earlier"\nVLLM_SERVICE_API_KEY="current"\n')
    assert smoke.key_from_secrets(str(secrets)) == "current"


def test_the_script_exits_1_on_an_error_status(server):
    port, state = server
    state["status"] = 500
    result = script(port, {**os.environ, "VLLM_SERVICE_API_KEY": ""}, "tiny-llama", "4", "1", "10")
    assert result.returncode == 1
    assert json.loads(result.stdout)["ok"] is False
