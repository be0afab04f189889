"""The container scenario (vllm_service_mode: container, issue 30): each planned instance runs in a podman
container of the fleet's own image under its Quadlet unit vllm@<instance>.service, bound to the plan's CPUs and
NUMA nodes, with SYS_NICE only and the derived seccomp profile, the model read-only, and the key a podman secret
that no unit, env file or podman inspect shows; through HAProxy a completion needs the key."""

import json
import re
import ssl
import urllib.error
import urllib.request
from pathlib import Path

import pytest

testinfra_hosts = ["ansible://vllm_hosts"]

PROJECT = Path(__file__).resolve().parents[3]
CA_FILE = PROJECT / ".cache/tls/ca.crt"
LB_URL = "https://10.88.250.60:8080"
MODEL = "tiny-llama"
CAP_SYS_NICE = 23


def cpus(text):
    found = []
    for part in filter(None, text.strip().split(",")):
        first, _dash, last = part.partition("-")
        found.extend(range(int(first), int(last or first) + 1))
    return found


@pytest.fixture(scope="module")
def plan(host):
    return json.loads(host.file("/etc/vllm/plan.json").content_string)


@pytest.fixture(scope="module")
def api_key(host):
    secrets = host.file("/etc/vllm/secrets.env").content_string
    return json.loads(re.search(r"^VLLM_SERVICE_API_KEY=(.*)$", secrets, re.M).group(1))


def status(host, instance, pid="self"):
    """/proc/<pid>/status inside the instance's container, as a dict."""
    text = host.check_output(f"podman exec vllm-{instance['name']} cat /proc/{pid}/status")
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


def test_each_instance_is_a_quadlet_unit_of_the_fleets_image(host, plan):
    image = host.file("/etc/vllm/image").content_string.strip()
    assert re.fullmatch(r"localhost/vllm-cpu-fleet/vllm:0\.\d+\.\d+-[A-Za-z0-9_.-]+-[0-9a-f]{16}", image), image
    # The units run the image by the ID its name has (a name can later be given to other bits; an ID cannot).
    image_id = host.check_output(f"podman image inspect --format '{{{{.Id}}}}' {image}")
    assert host.file("/etc/vllm/image-id").content_string == f"sha256:{image_id}\n"
    for instance in plan["instances"]:
        name = instance["name"]
        unit = host.file(f"/etc/containers/systemd/vllm@{name}.container").content_string
        assert f"Image=sha256:{image_id}" in unit.splitlines()
        fragment = host.check_output(f"systemctl show -p FragmentPath --value vllm@{name}.service")
        assert fragment == f"/run/systemd/generator/vllm@{name}.service"
        assert host.service(f"vllm@{name}.service").is_running
        # The container runs the image the unit names, nothing pulled.
        assert host.check_output(f"podman inspect --format '{{{{.Image}}}}' vllm-{name}") == image_id
    # No venv mode left: no drop-in would replace Quadlet's ExecStart=, no version link.
    assert host.run("ls -d /etc/systemd/system/vllm@*").stdout == ""
    assert not host.file("/opt/vllm/current").exists


def test_the_image_is_the_builders_by_id_on_a_patched_signed_base(host):
    image = host.file("/etc/vllm/image").content_string.strip()
    tag = image.rsplit(":", 1)[1]
    (manifest_path,) = PROJECT.glob(f".cache/images/*/vllm-image-{tag}.json")
    manifest = json.loads(manifest_path.read_text())
    # The bits under the name are the builder's: the ID the manifest recorded is this host's image's.
    assert host.check_output(f"podman image inspect --format '{{{{.Id}}}}' {image}") == manifest["image_id"]
    for key in ("image_id", "base_packages_sha256"):
        assert re.fullmatch(r"[0-9a-f]{64}", manifest[key]), manifest
    # The base of this run's refresh period, with the suite's updates and security fixes among its sources.
    assert re.fullmatch(r"localhost/vllm-cpu-fleet/debian:bookworm-r\d+-20\d{6}", manifest["base"]), manifest["base"]
    run = f"podman run --rm --pull=never --network=none {image}"
    sources = host.check_output(f"{run} cat /etc/apt/sources.list.d/debian.sources")
    assert "bookworm-updates" in sources and "bookworm-security" in sources
    assert sources.count("Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg") == 2


def test_the_planned_binds_are_the_containers_cpuset(host, plan):
    for instance in plan["instances"]:
        found = status(host, instance)
        assert cpus(found["Cpus_allowed_list"]) == cpus(instance["cpus"]), found["Cpus_allowed_list"]
        assert cpus(found["Mems_allowed_list"]) == sorted(instance["numa_nodes"]), found["Mems_allowed_list"]


def test_vllm_binds_its_memory_without_a_seccomp_refusal(host, plan):
    """podman's default profile denies migrate_pages; the derived one allows exactly vLLM's NUMA calls, and vLLM says
    the binding it made (csrc/cpu/utils.cpp init_cpu_memory_env, 0.20.0 and later)."""
    journal = host.check_output("journalctl --no-pager -o cat -u 'vllm@*'")
    assert "numa_migrate_pages failed" not in journal
    assert "numa_set_membind failed" not in journal and "numa_set_interleave_mask failed" not in journal
    for instance in plan["instances"]:
        nodes = ",".join(map(str, sorted(instance["numa_nodes"])))
        policy = "MEMBIND" if len(instance["numa_nodes"]) == 1 else "INTERLEAVE"
        assert f"NUMA binding: Using {policy} policy for memory allocation" in journal
        assert f"({nodes})" in journal or f"(nodes: {nodes})" in journal


def test_the_container_has_sys_nice_only_no_new_privileges_and_seccomp(host, plan):
    for instance in plan["instances"]:
        found = status(host, instance, pid=1)
        assert int(found["CapEff"].strip(), 16) == 1 << CAP_SYS_NICE
        assert int(found["CapBnd"].strip(), 16) == 1 << CAP_SYS_NICE
        assert found["NoNewPrivs"].strip() == "1"
        assert found["Seccomp"].strip() == "2"
        assert found["Uid"].split()[0] == str(host.user("vllm").uid)


def test_the_model_the_middleware_and_the_root_are_read_only(host, plan):
    instance = plan["instances"][0]
    model = host.check_output("ls -d /var/lib/vllm/models/*")
    for path in (f"{model}/probe", "/usr/local/lib/vllm-service/probe", "/opt/vllm/probe"):
        result = host.run(f"podman exec vllm-{instance['name']} touch {path}")
        assert result.rc != 0 and "Read-only file system" in result.stderr, (path, result.stderr)


def test_the_key_is_in_no_unit_env_file_or_podman_inspect(host, plan, api_key):
    shown = []
    for instance in plan["instances"]:
        name = instance["name"]
        shown += [
            host.file(f"/etc/containers/systemd/vllm@{name}.container").content_string,
            host.file(f"/etc/vllm/{name}.env").content_string,
            host.check_output(f"systemctl cat vllm@{name}.service"),
            host.check_output(f"systemctl show -p Environment vllm@{name}.service"),
            host.check_output(f"podman inspect vllm-{name}"),
        ]
    shown.append(host.check_output("podman image inspect $(cat /etc/vllm/image)"))
    assert not [text for text in shown if api_key in text]


def test_the_hosts_service_user_reads_no_file_that_holds_the_key(host, api_key):
    # docs/container-mode.md, "What each mode exposes": in container mode only root reads the key at rest.
    for path in ("/etc/vllm/secrets.env", "/etc/vllm/podman-secrets.json"):
        stat = host.file(path)
        assert (stat.user, stat.mode & 0o077) == ("root", 0), (path, stat.user, oct(stat.mode))
        assert host.run(f"runuser -u vllm -- cat {path}").rc != 0, path
    assert api_key not in host.file("/etc/vllm/podman-secrets.json").content_string


def _request(path, key, body=None):
    context = ssl.create_default_context(cafile=str(CA_FILE))
    context.check_hostname = False
    request = urllib.request.Request(
        LB_URL + path,
        data=json.dumps(body).encode() if body else None,
        headers={"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=120, context=context) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, None


def test_a_completion_needs_the_key(api_key):
    body = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 4}
    code, answer = _request("/v1/completions", api_key, body)
    assert code == 200 and answer["choices"][0]["text"]
    assert _request("/v1/completions", "", body)[0] == 401
    assert _request("/v1/completions", "not-the-key", body)[0] == 401
