"""The live fleet report: what each vLLM host runs, what it was planned to run, what the load balancers
see of it, and what it serves, as one Markdown and one self-contained HTML page (inline SVG bar charts,
no script, nothing fetched when the page is opened).

Pure functions over what playbooks/report.yml collected (the standard library, and Jinja2 for the pages):

- parse_exposition(): Prometheus text exposition (an instance's /metrics) into samples;
- instance_figures() / sampled_figures(): an instance's figures from one or two reads of its /metrics;
- prometheus_figures(): the same figures from Prometheus' HTTP API answers (instant queries);
- lb_servers(): HAProxy's `show stat` CSV, read by its header (module_utils/vllm_lb_backends.py);
- build_report(): one row per host and instance from the plan, the host's live state
  (roles/vllm_service/files/vllm_fleet_state.py --format json), the load balancers' views and the figures;
- render_markdown() / render_html(): the pages, from the templates beside this file (vllm_fleet_report.md.j2 and
  vllm_fleet_report.html.j2); svg_bars(): their charts. Every value in the HTML goes through html.escape.
"""

import base64
import functools
import html
import json
import math
import os
import re

import jinja2
from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_lb_backends import BackendError, stat_rows
from markupsafe import Markup

# The vLLM series the report reads, by figure. The first name an instance exposes wins (older releases
# called the KV cache gauge gpu_cache_usage_perc, also on CPU). kv_usage is a fraction (1 = full).
COUNTERS = {
    "prompt_tokens": ("vllm:prompt_tokens_total",),
    "generation_tokens": ("vllm:generation_tokens_total",),
}
GAUGES = {
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "vllm:cpu_cache_usage_perc"),
    "running": ("vllm:num_requests_running",),
    "waiting": ("vllm:num_requests_waiting",),
}
# Gauges summed over an instance's engines and models, except the KV cache's share (the fullest counts).
_MAX_GAUGES = {"kv_usage"}
# Prometheus only (a rate of histogram buckets or of the load balancers' answers, not one read of /metrics): the
# p95 time to the first token and to the last, and the share of the instance's answers through every load balancer
# that were 5xx (HAProxy's own 502/503/504 included), each over the rate window.
HISTOGRAMS = {"ttft_p95": "vllm:time_to_first_token_seconds", "e2e_p95": "vllm:e2e_request_latency_seconds"}
# HAProxy names a server <host>-<instance> (the planner's vllm-<n>); the query gives its answers those labels.
_LB_SERVER = '"(.+)-(vllm-[0-9]+)"'


def _by_instance(expr):
    """expr summed over the load balancers by server, with host and vllm_instance taken from the server's name (the
    load balancer's own host label goes first: two of them would give one server's two series the same labels)."""
    return (
        f'label_replace(label_replace(sum by (server) ({expr}), "host", "$1", "server", {_LB_SERVER}), '
        f'"vllm_instance", "$2", "server", {_LB_SERVER})'
    )


def prometheus_queries(window="2m"):
    """{figure: PromQL} for the report's instant queries, per (host, vllm_instance) (the labels the
    monitoring role's scrape configuration gives every vLLM target)."""
    by = "by (host, vllm_instance)"
    kv = " or ".join(GAUGES["kv_usage"])
    return {
        "prompt_tps": f"sum {by} (rate({COUNTERS['prompt_tokens'][0]}[{window}]))",
        "generation_tps": f"sum {by} (rate({COUNTERS['generation_tokens'][0]}[{window}]))",
        "kv_usage": f"max {by} ({kv})",
        "running": f"sum {by} ({GAUGES['running'][0]})",
        "waiting": f"sum {by} ({GAUGES['waiting'][0]})",
        **{
            figure: f"histogram_quantile(0.95, sum by (host, vllm_instance, le) (rate({name}_bucket[{window}])))"
            for figure, name in HISTOGRAMS.items()
        },
        "lb_error_share": (
            f"sum {by} ("
            + _by_instance(f'rate(haproxy_server_http_responses_total{{job="haproxy", code="5xx"}}[{window}])')
            + f") / sum {by} ("
            + _by_instance(f'rate(haproxy_server_http_responses_total{{job="haproxy"}}[{window}])')
            + ")"
        ),
        "up": f'max {by} (up{{job="vllm"}})',
        # What fires now (not per instance: read apart by firing_alerts()); the Watchdog always does.
        "alerts": 'ALERTS{alertstate="firing", severity!="none"}',
    }


_SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}


def firing_alerts(answer):
    """[{alert, severity, where}] of the ALERTS answer, the most severe first, then by name and where."""
    if not isinstance(answer, dict) or answer.get("status") != "success":
        return []
    found = []
    for series in (answer.get("data") or {}).get("result") or []:
        labels = series.get("metric") or {}
        where = " ".join(
            str(labels[key]) for key in ("host", "vllm_instance", "proxy", "server", "run") if labels.get(key)
        )
        found.append(
            {"alert": str(labels.get("alertname", "?")), "severity": str(labels.get("severity", "")), "where": where}
        )
    return sorted(found, key=lambda a: (_SEVERITY_ORDER.get(a["severity"], 3), a["alert"], a["where"]))


# ---------------------------------------------------------------- Prometheus text exposition

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+-?\d+)?\s*$")
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def _number(text):
    try:
        return float(text)  # float() reads NaN, +Inf, -Inf and exponents as Prometheus writes them
    except (TypeError, ValueError):
        return None


def parse_exposition(text, prefix="vllm:"):
    """{metric name: [(labels dict, value)]} of the samples whose name starts with prefix ('' for all).
    Comment lines (# HELP, # TYPE) and lines that are not samples are skipped."""
    samples = {}
    for line in (text or "").splitlines():
        line = line.strip()
        if not line or line.startswith("#") or not line.startswith(prefix):
            continue
        found = _SAMPLE.match(line)
        if not found:
            continue
        value = _number(found[3])
        if value is None:
            continue
        labels = {
            key: re.sub(r'\\[\\"n]', lambda m: _UNESCAPE[m[0]], raw) for key, raw in _LABEL.findall(found[2] or "")
        }
        samples.setdefault(found[1], []).append((labels, value))
    return samples


def _first(samples, names, combine):
    for name in names:
        values = [value for _labels, value in samples.get(name, []) if not math.isnan(value)]
        if values:
            return combine(values)
    return None


def instance_figures(text):
    """The counters and gauges of one read of an instance's /metrics:
    {prompt_tokens, generation_tokens, kv_usage, running, waiting}, None where the series is absent."""
    samples = parse_exposition(text)
    figures = {key: _first(samples, names, sum) for key, names in COUNTERS.items()}
    for key, names in GAUGES.items():
        figures[key] = _first(samples, names, max if key in _MAX_GAUGES else sum)
    return figures


def _rate(first, second, seconds):
    if first is None or second is None or not seconds or seconds <= 0 or second < first:
        return None  # a counter that went down: the instance restarted between the reads
    return (second - first) / seconds


def sampled_figures(first_text, second_text, seconds):
    """The report's figures from two reads of an instance's /metrics `seconds` apart: tokens/s from the
    counters' growth, the gauges from the second read (the first when there is no second)."""
    first = instance_figures(first_text)
    second = instance_figures(second_text) if second_text else None
    latest = second or first
    return {
        "prompt_tps": _rate(first["prompt_tokens"], second and second["prompt_tokens"], seconds),
        "generation_tps": _rate(first["generation_tokens"], second and second["generation_tokens"], seconds),
        "kv_usage": latest["kv_usage"],
        "running": latest["running"],
        "waiting": latest["waiting"],
    }


def prometheus_figures(answers):
    """{(host, vllm_instance): {figure: value}} from {figure: Prometheus API answer of an instant query}
    (the JSON of /api/v1/query). An answer that is not a success adds nothing."""
    figures = {}
    for figure, answer in (answers or {}).items():
        if not isinstance(answer, dict) or answer.get("status") != "success":
            continue
        for series in (answer.get("data") or {}).get("result") or []:
            metric = series.get("metric") or {}
            value = series.get("value") or [None, None]
            key = (metric.get("host"), metric.get("vllm_instance"))
            if None in key:
                continue
            number = _number(value[1] if len(value) > 1 else None)
            figures.setdefault(key, {})[figure] = None if number is None or math.isnan(number) else number
    return figures


# ---------------------------------------------------------------- HAProxy

_SUMMARY_ROWS = {"FRONTEND", "BACKEND"}


def lb_servers(stat_text, backend=None):
    """[{proxy, server, status, sessions}] of the servers in HAProxy's `show stat` answer (the FRONTEND and
    BACKEND summary rows left out; only backend `backend` when given). Read by header names."""
    servers = []
    for row in stat_rows(stat_text):
        if row["svname"] in _SUMMARY_ROWS or (backend and row["pxname"] != backend):
            continue
        try:
            sessions = int(row.get("scur") or 0)
        except ValueError:
            sessions = None
        servers.append(
            {"proxy": row["pxname"], "server": row["svname"], "status": row.get("status") or "?", "sessions": sessions}
        )
    return servers


def status_word(status):
    """The first word of an HAProxy status (UP, DOWN, DRAIN, MAINT, NOLB, no check), upper-cased, for styling."""
    word = (status or "?").split()[0].upper()
    return word if word in {"UP", "DOWN", "DRAIN", "MAINT", "NOLB"} else "OTHER"


# ---------------------------------------------------------------- collecting rows

_STATE_HELP = "run roles/vllm_service (site.yml) to install it"


def _get(mapping, key, default=None):
    try:
        value = mapping.get(key, default) if hasattr(mapping, "get") else default
    except Exception:  # an undefined or failing template behind a hostvar
        return default
    return default if value is None else value


def _result_problem(result, what):
    """Why a registered task result carries no usable output, or ''."""
    if not isinstance(result, dict) or not result:
        return f"{what} not read (host not in this run's play, or it failed earlier)"
    if result.get("unreachable"):
        return f"unreachable: {str(result.get('msg') or '').strip()[:200]}"
    if result.get("skipped"):
        return f"{what} not read ({result.get('skip_reason') or 'skipped'})"
    if result.get("failed") or result.get("rc", 0) != 0:
        detail = (result.get("stderr") or result.get("msg") or "").strip().splitlines()
        return f"{what} failed (rc {result.get('rc', '?')}): {detail[-1][:200] if detail else 'no message'}"
    return ""


def _json(text):
    if isinstance(text, dict):
        return text
    try:
        value = json.loads(text or "")
    except (TypeError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _slurped_json(result):
    """The JSON of a file ansible.builtin.slurp read (base64 content), or None."""
    if not isinstance(result, dict) or not result.get("content") or _result_problem(result, "file"):
        return None
    try:
        return _json(base64.b64decode(result["content"]).decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return None


def read_state(result, script_stat=None, script="the state reader"):
    """(state dict or None, problem text) from the registered results of the state reader's run and of the
    stat of its file."""
    if isinstance(script_stat, dict) and script_stat.get("unreachable"):
        return None, _result_problem(script_stat, "state")
    if isinstance(script_stat, dict) and script_stat.get("stat") and not script_stat["stat"].get("exists"):
        return None, f"state unknown ({script} is missing on the host: {_STATE_HELP})"
    problem = _result_problem(result, "state")
    if problem:
        return None, f"state unknown ({problem})"
    state = _json(result.get("stdout"))
    if state is None or not isinstance(state.get("instances"), list):
        return None, "state unknown (the state reader's output is not its JSON)"
    return state, ""


def _plan_columns(facts, plan):
    """The plan columns the report has always shown (Markdown cells of the first table)."""
    cpu_nodes = [node for node in facts.get("numa_nodes") or [] if node.get("cpus")]
    cores = sum(len(node.get("cores") or []) for node in cpu_nodes)
    instances = (plan or {}).get("instances") or []
    build = (plan or {}).get("build") or {}
    return {
        "model": facts.get("model", "?"),
        "isa_class": facts.get("isa_class", "?"),
        "topology": f"{facts.get('sockets', '?')} / {len(facts.get('numa_nodes') or [])} / {cores} "
        f"x{facts.get('threads_per_core', '?')}",
        "memory": f"{round((facts.get('memory_mib') or 0) / 1024, 1)} GiB",
        "plan_instances": ", ".join(f"{i.get('name')}:{i.get('port')}" for i in instances) if plan else "no plan",
        "tp": ", ".join(str(i.get("tp")) for i in instances) if plan else "",
        "bind": " ; ".join(str(i.get("omp_threads_bind")) for i in instances) if plan else "",
        "reserved": " ; ".join(str(i.get("reserved_cpus")) for i in instances) if plan else "",
        "kvcache": (", ".join(str(i.get("kvcache_gib")) for i in instances) + " GiB") if plan else "",
        "build": f"{build.get('build_class')}, MAX_JOBS={build.get('max_jobs')}" if plan else "",
    }


def _duration(seconds):
    if seconds is None or seconds < 0:
        return ""
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    return f"{minutes}m {seconds}s" if minutes else f"{seconds}s"


def _sampled(host_vars):
    """{instance name: figures or {'error': text}} from the loopback sampler's registered result, and a problem."""
    result = _get(host_vars, "fleet_report_metrics")
    if not result:
        return {}, ""
    problem = _result_problem(result, "/metrics")
    if problem:
        return {}, problem
    answer = _json(result.get("stdout")) or {}
    found = {}
    for name, read in (answer.get("instances") or {}).items():
        if read.get("error"):
            found[name] = {"error": read["error"]}
        else:
            found[name] = sampled_figures(
                read.get("first"), read.get("second"), read.get("seconds") or answer.get("seconds")
            )
    return found, ""


def _lb_views(loadbalancers, hostvars):
    """[{name, problem, servers}] from each load balancer's registered `show stat` result."""
    views = []
    for lb in loadbalancers:
        host_vars = _get(hostvars, lb, {})
        result = _get(host_vars, "fleet_report_lb_stat")
        backend = _get(host_vars, "loadbalancer_backend_name", "vllm")
        problem = _result_problem(result, "show stat")
        servers = []
        if not problem:
            try:
                servers = lb_servers(result.get("stdout"), backend)
            except BackendError as err:
                problem = f"show stat unreadable: {err}"
        views.append({"name": lb, "backend": backend, "problem": problem, "servers": servers, "matched": set()})
    return views


def _prometheus(monitoring, hostvars):
    """(figures by (host, instance), source text, problem, firing alerts or None) from the monitoring host's
    registered queries."""
    if not monitoring:
        return {}, "", "", None
    mon = monitoring[0]
    result = _get(_get(hostvars, mon, {}), "fleet_report_prometheus")
    address = _get(_get(hostvars, mon, {}), "fleet_report_prometheus_asked", "")
    source = f"Prometheus on {mon}" + (f" ({address})" if address else "")
    if not isinstance(result, dict) or not result:
        return {}, source, f"Prometheus on {mon} not asked (host not in this run's play, or it failed earlier)", None
    if result.get("unreachable"):
        return {}, source, f"{mon} unreachable: {str(result.get('msg') or '')[:200]}", None
    answers, failures = {}, []
    for item in result.get("results") or []:
        figure = (item.get("item") or {}).get("key")
        if item.get("failed") or item.get("status") not in (200, None) or not isinstance(item.get("json"), dict):
            failures.append(f"{figure}: {str(item.get('msg') or item.get('status') or 'no answer')[:160]}")
            continue
        answers[figure] = item["json"]
    problem = f"Prometheus queries failed: {'; '.join(failures)}" if failures else ""
    alerts = firing_alerts(answers.pop("alerts")) if "alerts" in answers else None
    return prometheus_figures(answers), source, problem, alerts


def _scraped(figures, planned):
    """Prometheus's figures of an instance it scrapes; else why there are none: an instance that answers no scrape
    (`up` 0) or is no target has no load to show, not a load of 0."""
    up = (figures or {}).get("up")
    if up == 0:
        return {"error": "Prometheus cannot scrape its /metrics (up 0): down, or closed to the monitoring host"}
    if up is None and planned:
        return {"error": "not a Prometheus target (the monitoring host's scrape configuration lacks it)"}
    return figures


def _host_class(host_vars, plan, facts):
    cls = _get(host_vars, "monitoring_host_class")
    if cls in (None, ""):
        cls = (plan or {}).get("isa_class") or (facts or {}).get("isa_class") or "unplanned"
    return str(cls)


def build_report(hosts, hostvars, loadbalancers=None, monitoring=None, options=None):
    """The report as one dict (render_markdown, render_html): hosts with their plan columns and instances
    (plan, unit, versions, load balancer views, figures), load balancers, host classes, benchmark, notes."""
    options = dict(options or {})
    loadbalancers = list(loadbalancers or [])
    monitoring = list(monitoring or [])
    lb_views = _lb_views(loadbalancers, hostvars)
    prom, prom_source, prom_problem, alerts = _prometheus(monitoring, hostvars)
    script = options.get("state_script") or "the state reader"
    rows = []
    for host in sorted(hosts or [], key=str):
        host_vars = _get(hostvars, host, {})
        facts = _get(_get(host_vars, "ansible_facts", {}), "vllm_cpu")
        plan = _get(host_vars, "vllm_plan")
        plan_source = "this run"
        if not plan:
            plan = _slurped_json(_get(host_vars, "fleet_report_plan_file"))
            plan_source = "plan.json on the host" if plan else ""
        plan = plan if isinstance(plan, dict) else None
        state, state_problem = read_state(
            _get(host_vars, "fleet_report_state"), _get(host_vars, "fleet_report_state_stat"), script
        )
        sampled, sample_problem = _sampled(host_vars) if not monitoring else ({}, "")
        row = {
            "host": str(host),
            "class": _host_class(host_vars, plan, facts),
            "missing": "" if facts else "no facts in this run (unreachable, failed, or the run had no preflight)",
            "plan_source": plan_source,
            "state_problem": state_problem,
            "figures_problem": sample_problem,
            "target_version": str((plan or {}).get("vllm_version") or _get(host_vars, "vllm_version", "")),
            "mode": (plan or {}).get("mode", ""),
            "installed": [],
            "firewall": None,
            "converged": None,
            "instances": [],
        }
        if facts:
            row.update(_plan_columns(facts, plan))
        if state:
            row["installed"] = [
                {
                    "version": str(i.get("version") or "?"),
                    "venv": str(i.get("venv") or ""),
                    "active": bool(i.get("active")),
                }
                for i in state.get("installed") or []
            ]
            row["firewall"] = state.get("firewall")
            row["converged"] = state.get("converged")
        planned = {i.get("name"): i for i in (plan or {}).get("instances") or [] if isinstance(i, dict)}
        live = {i.get("name"): i for i in (state or {}).get("instances") or [] if isinstance(i, dict)}
        now = (state or {}).get("time")
        for name in list(planned) + [n for n in live if n not in planned]:
            p, s = planned.get(name) or {}, live.get(name)
            server = f"{host}-{name}"
            views = {}
            for view in lb_views:
                match = next((srv for srv in view["servers"] if srv["server"] == server), None)
                if match:
                    view["matched"].add(server)
                views[view["name"]] = (
                    {"status": "?", "sessions": None, "note": view["problem"]}
                    if view["problem"]
                    else match or {"status": "not listed", "sessions": None}
                )
            figures = prom.get((str(host), name)) if monitoring else sampled.get(name)
            if monitoring and not prom_problem:
                figures = _scraped(figures, bool(p))
            since = s.get("active_since") if s else None
            row["instances"].append(
                {
                    "name": str(name),
                    "planned": bool(p),
                    "port": p.get("port", ""),
                    "cpus": str(p.get("cpus", "")),
                    "bind": str(p.get("omp_threads_bind", "")),
                    "reserved": str(p.get("reserved_cpus", "")),
                    "kvcache_gib": p.get("kvcache_gib", ""),
                    "tp": p.get("tp", ""),
                    "dp": len(planned) if (plan or {}).get("mode") == "dp" else 1,
                    "unit": f"{s.get('active', '?')}/{s.get('sub', '?')}" if s else "",
                    "active": bool(s and s.get("active") == "active"),
                    "restarts": s.get("restarts") if s else None,
                    "uptime": _duration(now - since) if s and since and now else "",
                    "version": str(s.get("version") or "") if s else "",
                    "lb": views,
                    "figures": figures if isinstance(figures, dict) and "error" not in figures else None,
                    "figures_error": (figures or {}).get("error", "") if isinstance(figures, dict) else "",
                }
            )
        rows.append(row)
    lbs = [
        {
            "name": view["name"],
            "backend": view["backend"],
            "problem": view["problem"],
            "servers": len(view["servers"]),
            "up": sum(status_word(srv["status"]) == "UP" for srv in view["servers"]),
            "sessions": sum(srv["sessions"] or 0 for srv in view["servers"]),
            "unplanned": [srv for srv in view["servers"] if srv["server"] not in view["matched"]],
        }
        for view in lb_views
    ]
    notes = []
    if monitoring:
        figures_source = prom_source + ": tokens/s are rates over " + str(options.get("rate_window") or "2m")
        if prom_problem:
            notes.append(prom_problem)
    else:
        seconds = options.get("sample_seconds")
        figures_source = "each instance's /metrics, read on its host over loopback" + (
            f", twice {seconds} s apart (tokens/s over that interval)" if seconds else ""
        )
    return {
        "title": options.get("title") or "vLLM CPU fleet report",
        "generated": str(options.get("generated") or ""),
        "figures_source": figures_source,
        "hosts": rows,
        "loadbalancers": lbs,
        "classes": class_summary(rows),
        "benchmark": benchmark_summary(options.get("benchmark"), rows),
        "notes": notes,
        # None: not asked (no monitoring host, or its answer failed); []: none firing.
        "alerts": alerts,
    }


def class_summary(rows):
    """[{name, hosts, instances, prompt_tps, generation_tps, kv_mean, kv_max, with_figures, members}] per class."""
    classes = {}
    for row in rows:
        entry = classes.setdefault(
            row["class"], {"name": row["class"], "hosts": 0, "instances": 0, "active": 0, "members": []}
        )
        entry["hosts"] += 1
        for instance in row["instances"]:
            entry["instances"] += 1
            entry["active"] += instance["active"]
            entry["members"].append({"name": f"{row['host']}/{instance['name']}", "figures": instance["figures"] or {}})
    for entry in classes.values():
        figures = [member["figures"] for member in entry["members"] if member["figures"]]
        entry["with_figures"] = len(figures)
        for key in ("prompt_tps", "generation_tps"):
            values = [f[key] for f in figures if f.get(key) is not None]
            entry[key] = sum(values) if values else None
        kv = [f["kv_usage"] for f in figures if f.get("kv_usage") is not None]
        entry["kv_mean"] = sum(kv) / len(kv) if kv else None
        entry["kv_max"] = max(kv) if kv else None
    return [classes[name] for name in sorted(classes)]


def benchmark_summary(result, rows):
    """The load generator's answer (playbooks/files/fleet_report_bench.py) with the host classes it reached,
    or None when no benchmark ran."""
    if not result:
        return None
    answer = result if isinstance(result, dict) and "levels" in result else None
    problem = ""
    if answer is None:
        problem = _result_problem(result, "benchmark") if isinstance(result, dict) else "benchmark not run"
        answer = _json(result.get("stdout")) if isinstance(result, dict) and not problem else None
        if answer is None and not problem:
            problem = "benchmark output is not its JSON"
    answer = answer or {}
    return {
        "through": str(answer.get("through") or (result.get("through") if isinstance(result, dict) else "") or ""),
        "model": str(answer.get("model") or ""),
        "max_tokens": answer.get("max_tokens"),
        "prompts": answer.get("prompts"),
        "levels": answer.get("levels") or [],
        "problem": problem or str(answer.get("error") or ""),
        "classes": sorted({row["class"] for row in rows if row["instances"]}),
    }


# ---------------------------------------------------------------- formatting


def fmt(value, digits=1, unit=""):
    if value is None or value == "":
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}f}{unit}"
    return f"{value}{unit}"


def latency_text(figures):
    """"0.12 s / 2.3 s" of the p95 time to the first token and to the whole answer; "-" where there is none (no
    monitoring host: one read of /metrics has no rate; an idle instance: no request in the window)."""
    parts = [figures.get(name) for name in HISTOGRAMS]
    if all(part is None for part in parts):
        return "-"
    return " / ".join(fmt(part, 2, " s") for part in parts)


def pct(value):
    return "n/a" if value is None else f"{100 * value:.1f} %"


def _lb_text(view):
    if view.get("note"):
        return "?"
    sessions = view.get("sessions")
    return view["status"] + (f" ({sessions} cur)" if sessions is not None else "")


def host_problems(row):
    """What could not be read on a host with instances: its state, its /metrics (each text once)."""
    found = [row["state_problem"], row["figures_problem"]]
    found += [f"{i['name']}: {i['figures_error']}" for i in row["instances"] if i["figures_error"]]
    return [text for text in dict.fromkeys(found) if text]


def _installed_text(row):
    return ", ".join(i["version"] + (" (active)" if i["active"] else "") for i in row["installed"])


# ---------------------------------------------------------------- Markdown and HTML pages


def _md(value):
    """A Markdown table cell: no line breaks, pipes escaped, HTML special characters as entities."""
    text = html.escape(str(value if value is not None else ""), quote=False)
    return text.replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def _mdcode(value):
    text = str(value).replace("`", "'").replace("|", "\\|").replace("\n", " ")
    return f"`{text}`" if text else ""


def benchmark_caption(bench):
    if bench["problem"]:
        return f"The benchmark through {bench['through'] or 'the load balancer'} failed: {bench['problem']}"
    return (
        f"Through {bench['through']} ({bench['model']}, {bench['prompts']} fixed prompts, up to {bench['max_tokens']} "
        f"output tokens each, streamed): one fleet-wide run reaching the host classes {', '.join(bench['classes'])}. "
        "HAProxy balances over every server of its backend, so a run cannot be held to one host class; per-class "
        "serving figures are in the instance table and the charts above."
    )


# ---------------------------------------------------------------- SVG charts

_COLOURS = {"prompt": "#4c78a8", "generation": "#f58518", "kv": "#54a24b", "kv_high": "#e45756"}


def _short(label, limit=34):
    label = str(label)
    return label if len(label) <= limit else "\u2026" + label[-(limit - 1) :]


def svg_bars(title, bars, unit="", maximum=None, width=640):
    """A horizontal bar chart as inline SVG. bars is [(label, value, colour key)], a value None (drawn as
    'n/a') or a number, or [(label, [(value, colour key), ...], None)] for thinner bars side by side in one row
    (prompt and generation tokens/s). Long labels are shortened from the left (the full one is the tooltip).
    Every text is escaped."""
    e = html.escape
    row_h, label_w, top, bar_h = 24, 230, 28, 18
    plot_w = width - label_w - 130
    rows = [(label, value if isinstance(value, list) else [(value, colour)]) for label, value, colour in bars]
    values = [v for _label, parts in rows for v, _c in parts if v is not None]
    top_value = maximum if maximum is not None else max([*values, 0.0])
    top_value = top_value or 1.0
    height = top + row_h * max(1, len(rows)) + 6
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{e(title)}">',
        f'<text x="0" y="16" class="chart-title">{e(title)}</text>',
    ]
    if not rows:
        out.append(f'<text x="0" y="{top + 14}" class="na">no instances</text>')
    for index, (label, parts) in enumerate(rows):
        y = top + index * row_h
        out.append(
            f'<text x="{label_w - 6}" y="{y + 15}" text-anchor="end"><title>{e(str(label))}</title>'
            f"{e(_short(label))}</text>"
        )
        out.append(f'<rect x="{label_w}" y="{y + 2}" width="{plot_w}" height="{bar_h}" class="track"/>')
        if all(value is None for value, _c in parts):
            out.append(f'<text x="{label_w + 6}" y="{y + 15}" class="na">n/a</text>')
            continue
        thin = bar_h / len(parts)
        longest = 0.0
        for number, (value, colour) in enumerate(parts):
            if value is None:
                continue
            bar_w = max(1.0, min(1.0, value / top_value) * plot_w) if value > 0 else 0.0
            longest = max(longest, bar_w)
            out.append(
                f'<rect x="{label_w}" y="{y + 2 + number * thin:.1f}" width="{bar_w:.1f}" height="{thin:g}" '
                f'fill="{_COLOURS.get(colour, "#888")}"><title>{e(str(label))}: {e(fmt(value, 2, " " + unit))}'
                "</title></rect>"
            )
        shown = " / ".join("n/a" if v is None else pct(v) if unit == "%" else fmt(v) for v, _c in parts) + (
            "" if unit == "%" else f" {unit}"
        )
        out.append(f'<text x="{label_w + longest + 6:.1f}" y="{y + 15}">{e(shown.strip())}</text>')
    out.append("</svg>")
    return "".join(out)


def class_charts(cls):
    """The two charts of a host class: tokens/s (prompt and generation) and KV cache use, per instance."""
    tps, kv = [], []
    for member in cls["members"]:
        name, figures = member["name"], member["figures"]
        tps.append((name, [(figures.get("prompt_tps"), "prompt"), (figures.get("generation_tps"), "generation")], None))
        usage = figures.get("kv_usage")
        kv.append((name, usage, "kv_high" if usage is not None and usage >= 0.9 else "kv"))
    return (
        svg_bars(f"{cls['name']}: tokens/s per instance (prompt / generated)", tps, "tok/s"),
        svg_bars(f"{cls['name']}: KV cache used per instance", kv, "%", maximum=1.0),
    )


def _benchmark_chart(bench):
    bars = [(f"concurrency {lv.get('concurrency')}", lv.get("tokens_per_s"), "generation") for lv in bench["levels"]]
    return svg_bars("Benchmark: output tokens/s", bars, "tok/s")


def _versions(hosts):
    """The vLLM versions the hosts are planned to run, sorted."""
    return sorted({row["target_version"] for row in hosts if row["target_version"]})


def _views(instance, lb_names):
    """An instance's load balancer views in the order of the table's columns."""
    return [instance["lb"][name] for name in lb_names]


def _unread(hosts):
    """[(host, text)] of what could not be read on the hosts with instances."""
    return [(row["host"], text) for row in hosts if row["instances"] for text in host_problems(row)]


# ---------------------------------------------------------------- the templates

_TEMPLATES = os.path.dirname(os.path.abspath(__file__))


@jinja2.pass_eval_context
def _escaped(eval_ctx, value):
    """What a template writes of a value: in an autoescaped template (the HTML page) html.escape of its text (quotes
    as &quot; and &#x27;, as the page always had them; markupsafe would write &#34; and &#39;), markup as it is."""
    if eval_ctx.autoescape and not hasattr(value, "__html__"):
        return Markup(html.escape(str(value)))
    return value


@functools.cache
def _environment():
    """The templates beside this file: vllm_fleet_report.html.j2 autoescaped, vllm_fleet_report.md.j2 not (its cells
    go through the md and mdcode filters)."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(_TEMPLATES),
        autoescape=jinja2.select_autoescape(enabled_extensions=("html.j2",), default_for_string=False),
        finalize=_escaped,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters.update(md=_md, mdcode=_mdcode, lb_text=_lb_text)
    env.globals.update(
        fmt=fmt,
        pct=pct,
        latency_text=latency_text,
        installed_text=_installed_text,
        status_word=status_word,
        benchmark_caption=benchmark_caption,
        class_charts=class_charts,
        benchmark_chart=_benchmark_chart,
        colours=_COLOURS,
        versions=_versions,
        views=_views,
        unread_items=_unread,
    )
    return env


def render_markdown(report):
    """The report as Markdown (vllm_fleet_report.md.j2)."""
    return _environment().get_template("vllm_fleet_report.md.j2").render(report=report)


def render_html(report):
    """The report as one self-contained HTML page (vllm_fleet_report.html.j2)."""
    return _environment().get_template("vllm_fleet_report.html.j2").render(report=report)
