"""Preflight's checks and the install decision, as pure functions (the action plugin vllm_preflight runs them).

Each section takes the host's effective variables (``v``: already templated and typed by the roles'
argument specs), what the host told (``vllm_cpu_facts``'s facts and ``vllm_host_probe`` answer) and
returns ``(problems, facts)``: every problem as "<host>: <variable>: <problem>; fix: <fix>" (all of
them, not the first), and the facts later tasks consume. Controller files (the model directory, the
artifact store, the wheelhouse) are read by the checks: they are on the controller, where these run.

This module is the facade: each section's checks live in a file of their own, and a new check goes into its
section's file, not here.

- preflight/common.py: the helpers the sections share, and the checks every host's inputs get (types as
  written, host paths, one-line texts, bounds, names, versions, the converged record)
- preflight/toolchain.py: toolchain()
- preflight/build.py: build_host()
- preflight/install.py: install() and the install decision (install_directory(), wanted_digest())
- preflight/service.py: service()
- preflight/container.py: container(), mode_knobs() (vllm_service_mode: container)
- preflight/rollout.py: rollout()
- preflight/loadbalancer.py: loadbalancer()
- preflight/monitoring.py: monitoring(), monitoring_platform()

The destination rules the sections apply (say(), host_path(), url_path()...) are vllm_syntax.py's.
"""

from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_common import file_sha256
from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_cpu_cpulist import kind_of
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.preflight.build import build_host
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.preflight.common import (
    BOOL_WORDS,
    BOUND_FLOATS,
    BOUNDS,
    CONTROL,
    GROUP_OPTIONS,
    HOST_NAME,
    HOST_PATHS,
    MULTI_LINE_OPTIONS,
    OWNED_DIRECTORIES,
    PLAY_GROUPS,
    ROLE_VERSIONS,
    WHOLE_NUMBER,
    bounds,
    converged_record,
    host_directories,
    host_paths,
    names,
    networks,
    one_line,
    owned_overlaps,
    pip_indexes,
    play_groups,
    versions,
    written_types,
)
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.preflight.container import (
    CONTAINER_ONLY,
    VENV_ONLY,
    container,
    mode_knobs,
)
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.preflight.container import (
    probe_spec as container_probe_spec,
)
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.preflight.install import (
    GIB,
    NAME,
    WHEELHOUSE_SLACK_BYTES,
    install,
    install_directory,
    wanted_digest,
)
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.preflight.loadbalancer import (
    CIPHER_LIST,
    HAPROXY_NAME,
    HAPROXY_RUNTIME_DIR,
    HAPROXY_TIME,
    LB_TIMES,
    TLS_VERSIONS,
    backend_addresses,
    loadbalancer,
)
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.preflight.monitoring import (
    MONITORING_DURATIONS,
    MONITORING_OS_FAMILIES,
    MONITORING_THRESHOLDS,
    PROMETHEUS_DURATION,
    PROMETHEUS_SIZE,
    SYSTEMD_SPAN,
    SYSTEMD_SPAN_PART,
    SYSTEMD_SPAN_SECONDS,
    SYSTEMD_SPAN_UNITS,
    auto_retention_size,
    monitoring,
    monitoring_hosts,
    monitoring_platform,
    webhook,
)
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.preflight.rollout import rollout
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.preflight.service import (
    CAP_NET_ADMIN,
    LOCAL_ONLY,
    LOOPBACK,
    MEMORY_FLAGS,
    SERVICE_ENV,
    SERVICE_FLAGS,
    model_room,
    service,
    service_sources,
)
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.preflight.toolchain import toolchain
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_releases import (
    build_class,
    compiler_verdict,
    normalize_version,
    release_info,
    torch_pin,
)
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_serve import serve_command
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_wheel import select_wheels
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_rollout_serial import parse_serial
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_syntax import (
    account_name,
    bearer_token,
    env_file_value,
    env_name,
    haproxy_word,
    haproxy_words,
    host_path,
    number,
    owned_directory,
    say,
    url_path,
)

__all__ = [
    "BOOL_WORDS",
    "BOUNDS",
    "BOUND_FLOATS",
    "CAP_NET_ADMIN",
    "CIPHER_LIST",
    "CONTAINER_ONLY",
    "CONTROL",
    "GIB",
    "GROUP_OPTIONS",
    "HAPROXY_NAME",
    "HAPROXY_RUNTIME_DIR",
    "HAPROXY_TIME",
    "HOST_NAME",
    "HOST_PATHS",
    "LB_TIMES",
    "LOCAL_ONLY",
    "LOOPBACK",
    "MEMORY_FLAGS",
    "MONITORING_DURATIONS",
    "MONITORING_OS_FAMILIES",
    "MONITORING_THRESHOLDS",
    "MULTI_LINE_OPTIONS",
    "NAME",
    "OWNED_DIRECTORIES",
    "PLAY_GROUPS",
    "PROMETHEUS_DURATION",
    "PROMETHEUS_SIZE",
    "ROLE_VERSIONS",
    "SERVICE_ENV",
    "SERVICE_FLAGS",
    "SYSTEMD_SPAN",
    "SYSTEMD_SPAN_PART",
    "SYSTEMD_SPAN_SECONDS",
    "SYSTEMD_SPAN_UNITS",
    "TLS_VERSIONS",
    "VENV_ONLY",
    "WHEELHOUSE_SLACK_BYTES",
    "WHOLE_NUMBER",
    "account_name",
    "auto_retention_size",
    "backend_addresses",
    "bearer_token",
    "bounds",
    "build_class",
    "build_host",
    "compiler_verdict",
    "container",
    "container_probe_spec",
    "converged_record",
    "env_file_value",
    "env_name",
    "file_sha256",
    "haproxy_word",
    "haproxy_words",
    "host_directories",
    "host_path",
    "host_paths",
    "install",
    "install_directory",
    "kind_of",
    "loadbalancer",
    "mode_knobs",
    "model_room",
    "monitoring",
    "monitoring_hosts",
    "monitoring_platform",
    "names",
    "networks",
    "normalize_version",
    "number",
    "one_line",
    "owned_directory",
    "owned_overlaps",
    "parse_serial",
    "pip_indexes",
    "play_groups",
    "release_info",
    "rollout",
    "say",
    "select_wheels",
    "serve_command",
    "service",
    "service_sources",
    "toolchain",
    "torch_pin",
    "url_path",
    "versions",
    "wanted_digest",
    "webhook",
    "written_types",
]
