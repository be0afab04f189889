"""The command an instance serves with (plugin_utils/vllm_cpu_serve.py), per era and distribution.

`vllm serve` wherever the release has it and the venv holds the distribution its CLI
looks itself up as (`vllm`: every release's vllm/entrypoints/cli/main.py calls
importlib.metadata.version("vllm")); the module form for the prebuilt `vllm-cpu`.
ExecStart= quoting is checked against systemd's own parser rules, and against
systemd-analyze where it is installed.
"""

import copy
import re
import shutil
import subprocess

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_releases import RELEASES, UnknownReleaseError
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_serve import (
    MODULE,
    ServeCommandError,
    canonical_distribution,
    serve_command,
    systemd_exec_start,
)
from ansible_collections.vllm.cpu_fleet.tests.conftest import REPO

VENV = "/opt/vllm/current"
MODEL = "/var/lib/vllm/models/tiny-llama"
ARGS = ["--served-model-name", "tiny-llama", "--port", "8000", "--middleware", "vllm_service_auth.RequireApiKey"]
# One release of each era the table distinguishes: per-rank reserved CPUs and the
# 50 %-of-RAM KV default (0.13.0), the total-reserved era with torch +cpu on aarch64
# (0.20.0), and 0.32.0, whose module form warns it is deprecated.
ERAS = ["0.13.0", "0.20.0", "0.32.0"]


def _override(**change):
    row = copy.deepcopy(RELEASES["0.33.0"])
    del row["gcc_workarounds"]
    row.update(version="0.34.0", git_tag="v0.34.0", **change)
    return {"0.34.0": row}


@pytest.mark.parametrize("version", ERAS)
@pytest.mark.parametrize("distribution", ["vllm", "VLLM"])
def test_the_vllm_distribution_serves_with_the_releases_own_cli(version, distribution):
    assert serve_command(version, distribution, VENV, MODEL, ARGS) == [
        f"{VENV}/bin/vllm", "serve", MODEL, *ARGS,
    ]  # fmt: skip


@pytest.mark.parametrize("version", ERAS)
@pytest.mark.parametrize("distribution", ["vllm-cpu", "vllm_cpu", "Vllm.CPU"])
def test_the_prebuilt_vllm_cpu_serves_with_the_module_form(version, distribution):
    # Its `vllm` CLI dies with "No package metadata was found for vllm" (docs/install.md).
    assert serve_command(version, distribution, VENV + "/", MODEL, ARGS) == [
        f"{VENV}/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", MODEL, *ARGS,
    ]  # fmt: skip


def test_every_release_serves_both_distributions():
    for version in RELEASES:
        assert serve_command(version, "vllm", VENV, MODEL)[:2] == [f"{VENV}/bin/vllm", "serve"]
        module_form = [f"{VENV}/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
        assert serve_command(version, "vllm-cpu", VENV, MODEL)[:3] == module_form


def test_an_override_row_decides_for_its_release():
    # A release whose CLI no longer looks itself up serves any distribution with `vllm serve`.
    free = _override(serve_cli_distribution=None)
    assert serve_command("0.34.0", "vllm-cpu", VENV, MODEL, [], free)[1] == "serve"
    # One without the module form cannot serve a vllm-cpu venv: named, with the fix.
    gone = _override(api_server_module=False)
    assert serve_command("0.34.0", "vllm", VENV, MODEL, [], gone)[1] == "serve"
    with pytest.raises(ServeCommandError) as err:
        serve_command("0.34.0", "vllm-cpu", VENV, MODEL, [], gone)
    assert str(err.value).startswith("vllm_service_distribution: vLLM 0.34.0's `vllm serve` needs the 'vllm'")
    assert "fix: install vLLM as the 'vllm' distribution (vllm_install_source: wheel" in str(err.value)
    # A release with only the module form.
    module_only = _override(serve_entrypoint="python -m vllm.entrypoints.openai.api_server")
    assert serve_command("0.34.0", "vllm", VENV, MODEL, [], module_only)[1:3] == ["-m", MODULE]


@pytest.mark.parametrize(
    ("arguments", "words"),
    [
        ({"distribution": ""}, "vllm_service_distribution: '' names no distribution; fix: run the vllm_install role"),
        ({"distribution": None}, "vllm_service_distribution: None names no distribution"),
        ({"venv": "opt/vllm"}, "vllm_service_active_link: 'opt/vllm' is not an absolute path without spaces; fix:"),
        ({"venv": "/opt/my vllm"}, "vllm_service_active_link: '/opt/my vllm' is not an absolute path"),
        ({"model": ""}, "vllm_service_model_path / vllm_service_model_id: '' is not a model; fix:"),
        ({"model": "--model"}, "vllm_service_model_path / vllm_service_model_id: '--model' is not a model"),
        ({"model": None}, "vllm_service_model_path / vllm_service_model_id: None is not a string or number; fix:"),
        ({"args": "--enable-prefix-caching"}, "vllm_service_extra_args: '--enable-prefix-caching' is not a list; fix:"),
        ({"args": ["--x", {"a": 1}]}, "vllm_service_extra_args[1]: {'a': 1} is not a string or number; fix:"),
        ({"args": ["--flag", True]}, "vllm_service_extra_args[1]: True is not a string or number"),
    ],
)
def test_bad_input_names_the_variable_and_the_fix(arguments, words):
    call = {"distribution": "vllm", "venv": VENV, "model": MODEL, "args": [], **arguments}
    with pytest.raises(ServeCommandError) as err:
        serve_command("0.32.0", call["distribution"], call["venv"], call["model"], call["args"])
    assert str(err.value).startswith(words)


def test_numbers_from_yaml_become_words():
    assert serve_command("0.32.0", "vllm", VENV, MODEL, ["--port", 8000, "--x", 0.5])[-3:] == ["8000", "--x", "0.5"]


def test_an_unknown_release_names_the_probe():
    with pytest.raises(UnknownReleaseError, match=r"release_probe -e vllm_release_probe_version=0\.99\.0 "):
        serve_command("0.99.0", "vllm", VENV, MODEL)


def test_canonical_distribution():
    assert {canonical_distribution(n) for n in ("vllm-cpu", "vllm_cpu", "VLLM.cpu", "vllm__cpu")} == {"vllm-cpu"}


# ----------------------------------------------------------------- ExecStart= quoting


def _systemd_split(line):
    """systemd's reading of an ExecStart= value (systemd.service(5), "Command lines"): specifiers and
    variables first (%% -> %, $$ -> $), then words split at unquoted whitespace, C escapes resolved."""
    assert not re.search(r"%[^%]|%$", line.replace("%%", "")), f"an unescaped specifier in {line}"
    assert not re.search(r"\$[^$]|\$$", line.replace("$$", "")), f"an unescaped variable in {line}"
    line = line.replace("%%", "%").replace("$$", "$")
    words, word, quote, i, started = [], "", None, 0, False
    escapes = {"n": "\n", "t": "\t", "\\": "\\", '"': '"', "'": "'"}
    while i < len(line):
        char = line[i]
        if char == "\\":
            word += escapes[line[i + 1]]
            i += 2
            started = True
            continue
        if quote:
            if char == quote:
                quote = None
            else:
                word += char
        elif char in "\"'":
            quote, started = char, True
        elif char.isspace():
            if started:
                words.append(word)
            word, started = "", False
        else:
            word += char
            started = True
        i += 1
    assert quote is None, f"unbalanced quotes in {line}"
    if started:
        words.append(word)
    return words


TRICKY = ["a b", "100%", "$HOME", "${X}", 'say "hi"', "it's", "back\\slash", ";", "", "tab\there", "line\nbreak", "-"]


def test_exec_start_gives_systemd_every_word_unchanged():
    argv = [f"{VENV}/bin/vllm", "serve", MODEL, "--json", '{"a": 1}', *TRICKY]
    line = systemd_exec_start(argv)
    assert _systemd_split(line) == argv
    # Plain words stay readable: what operators grep for in the unit.
    assert line.startswith(f"{VENV}/bin/vllm serve {MODEL} --json ")


def test_a_plain_command_is_left_as_it_was():
    argv = serve_command("0.32.0", "vllm-cpu", VENV, MODEL, [*ARGS, "--host", "10.0.0.5", "--dtype", "bfloat16"])
    assert systemd_exec_start(argv) == " ".join(argv)


def test_exec_start_needs_an_absolute_executable():
    with pytest.raises(ServeCommandError, match="not an absolute executable path"):
        systemd_exec_start(["vllm", "serve"])
    with pytest.raises(ServeCommandError):
        systemd_exec_start([])


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_accepts_the_quoted_line(tmp_path):
    unit = tmp_path / "quoted.service"
    unit.write_text(f"[Service]\nExecStart={systemd_exec_start(['/bin/echo', *TRICKY])}\n")
    verify = ["systemd-analyze", "verify", str(unit)]
    result = subprocess.run(verify, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0 and "quoted.service" not in result.stderr, result.stderr


def test_the_filter_names_the_host():
    import importlib.util

    spec = importlib.util.spec_from_file_location("vllm_cpu_filters", REPO / "plugins/filter/vllm_cpu.py")
    filters = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(filters)
    found = filters.vllm_serve_command("0.32.0", "vllm", VENV, MODEL, ["--port", "8000"])
    assert found == {"argv": [f"{VENV}/bin/vllm", "serve", MODEL, "--port", "8000"],
                     "exec_start": f"{VENV}/bin/vllm serve {MODEL} --port 8000"}  # fmt: skip
    with pytest.raises(AnsibleFilterError, match=r"^web-1: vllm_service_distribution: '' names no distribution"):
        filters.vllm_serve_command("0.32.0", "", VENV, MODEL, [], {}, "web-1")
    with pytest.raises(AnsibleFilterError, match=r"^web-1: vllm_release_overrides\['0.34.0'\].api_server_module"):
        filters.vllm_serve_command("0.34.0", "vllm", VENV, MODEL, [], _override(api_server_module="yes"), "web-1")
