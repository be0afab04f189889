"""The Grafana dashboard and the Prometheus console page of the monitoring role.

Every PromQL expression in them must parse (promtool check rules, each expression written as a
recording rule) and use only metric names the fleet exports (the contract in the role's rules
and docs): a typo in a metric name fails here instead of drawing an empty panel. The console page
is also rendered by a real Prometheus, the distribution's binary beside promtool, once with no
series at all and once with a small backfilled fleet. promtool must be on PATH: without it these
tests fail, they never skip.
"""

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import jinja2
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "roles/monitoring/files/grafana/vllm-fleet.json"
CONSOLES = ROOT / "roles/monitoring/files/consoles"
CONSOLE = CONSOLES / "vllm-fleet.html"
RULES = ROOT / "roles/monitoring/templates/vllm-fleet.rules.yml.j2"
DEFAULTS = ROOT / "roles/monitoring/defaults/main.yml"

# The metric contract: what the programs the fleet runs export, read from /metrics recorded from the real
# programs (tests/fixtures/metrics/README.md says how), the state timer's textfile series (its own exposition of a
# full state), the recording rules' outputs and what Prometheus makes itself. A renamed metric is in no recording.
METRICS = ROOT / "tests/fixtures/metrics"
RECORDINGS = {
    "vllm": ["vllm-0.32.0.prom"],
    "haproxy": ["haproxy-2.6.12.prom", "haproxy-3.0.11.prom"],
    "node": ["node-exporter-1.5.0.prom", "node-exporter-1.9.0.prom"],
    "prometheus": ["prometheus-2.42.0.prom"],
    "alertmanager": ["alertmanager-0.25.0.prom"],
}
# Prometheus's own series (synthetic: in no /metrics).
PROMETHEUS_OWN = {"up", "ALERTS", "ALERTS_FOR_STATE"}
# vLLM's V0 engine named its KV cache gauge otherwise (vllm/engine/metrics.py, releases of the table before the V1
# engine); no release of that era runs here, so these come from its source, and only the report's fallback reads them.
OLDER_VLLM = {"vllm:gpu_cache_usage_perc", "vllm:cpu_cache_usage_perc"}


def exposition_names(text):
    """The sample names of Prometheus text exposition (a histogram's _bucket, _sum and _count among them)."""
    return {m[1] for m in re.finditer(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{|\s)", text, re.M)}


def exported(job):
    """What every recorded release of a job's program exports (the fleet runs Debian 12's and 13's alike)."""
    found = [exposition_names((METRICS / name).read_text()) for name in RECORDINGS[job]]
    return set.intersection(*found)


def state_names():
    """The node exporter's textfile series: the state timer's exposition of a state with every family present, and
    the certificate timer's."""
    import importlib.util

    path = ROOT / "roles/vllm_service/files/vllm_fleet_state.py"
    spec = importlib.util.spec_from_file_location("vllm_fleet_state_names", path)
    state = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(state)
    full = {
        "time": 1,
        "instances": [{"name": "vllm-0", "active": "active", "restarts": 0, "version": "0.32.0", "venv": "/v"}],
        "firewall": {"expected": True, "present": True},
        "converged": {"present": True, "inputs_digest": "d", "time": 1},
        "cpu_nodes": {"0": "0"},
        "run_lock": {"present": True, "held": True, "run": "r", "lease_end": 2},
        "rollout": {"present": True, "phase": "drain", "time": 1},
    }
    names = exposition_names(state.exposition(full))
    # The certificate timer's series (roles/monitoring/files/vllm_certificates.py), every host's textfile too.
    path = ROOT / "roles/monitoring/files/vllm_certificates.py"
    spec = importlib.util.spec_from_file_location("vllm_certificates_names", path)
    certificates = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(certificates)
    read = {"ok": True, "error": "", "certificates": [{"not_before": 1, "not_after": 2, "subject": "s"}]}
    return names | exposition_names(certificates.exposition({("ca", "/etc/ca.crt"): read}, 1))


def contract():
    return set().union(*(exported(job) for job in RECORDINGS)) | state_names() | PROMETHEUS_OWN | OLDER_VLLM


CONTRACT = contract()

# Grafana's variables, replaced by values valid where they stand.
GRAFANA_VARIABLES = {
    "$__rate_interval": "1m",
    "$__interval": "15s",
    "$__range": "1h",
    "$host_class": "avx512|neon",
    "${host_class}": "avx512|neon",
}

KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}


def promtool():
    path = shutil.which("promtool")
    assert path, "promtool is not on PATH: run scripts/bootstrap.sh and put .cache/tools/bin on PATH"
    return path


def rendered_rules():
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, trim_blocks=True, keep_trailing_newline=True)
    knobs = yaml.safe_load(DEFAULTS.read_text())
    return env.from_string(RULES.read_text()).render(ansible_managed="Ansible managed", **knobs)


def recorded_names():
    groups = yaml.safe_load(rendered_rules())["groups"]
    return {rule["record"] for group in groups for rule in group["rules"] if "record" in rule}


def metric_names(expr):
    """The metric names an expression selects: what is left once strings, label matchers,
    ranges, grouping clauses and function calls are taken out."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)
    expr = re.sub(r"\{[^}]*\}", " ", expr)
    expr = re.sub(r"\[[^\]]*\]", " ", expr)
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    expr = re.sub(r"\b(?:group_left|group_right)\b", " ", expr)
    names = set()
    for match in re.finditer(r"(?<![\w:.])[A-Za-z_:][\w:]*", expr):
        called = expr[match.end() :].lstrip().startswith("(")
        if not called and match.group().lower() not in KEYWORDS:
            names.add(match.group())
    return names


def check_expressions(tmp_path, exprs):
    """promtool check rules on every expression, each one a recording rule."""
    rules = {
        "groups": [
            {"name": "expressions", "rules": [{"record": f"check:expr_{i}", "expr": e} for i, e in enumerate(exprs)]}
        ]
    }
    path = tmp_path / "expressions.rules.yml"
    path.write_text(yaml.safe_dump(rules, sort_keys=False))
    done = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def unknown_names(exprs):
    known = CONTRACT | recorded_names()
    return {e: sorted(metric_names(e) - known) for e in exprs if metric_names(e) - known}


def misplaced_names(exprs):
    """Names selected with a job their program does not export: {expr: [(name, job)]} (the node job carries the
    state timer's textfile series too)."""
    found = {}
    for expr in exprs:
        for name, job in re.findall(r'([A-Za-z_:][A-Za-z0-9_:]*)\{[^}]*\bjob="([a-z]+)"', expr):
            known = exported(job) | (state_names() if job == "node" else set()) if job in RECORDINGS else set()
            if name not in known | PROMETHEUS_OWN | OLDER_VLLM:
                found.setdefault(expr, []).append((name, job))
    return found


# ---- the metric-name reader itself ----


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        (
            'sum by (host) (rate(vllm:prompt_tokens_total{job="vllm", host_class=~"a|b"}[1m]))',
            {"vllm:prompt_tokens_total"},
        ),
        (
            '1 - avg by (host, numa_node) (rate(node_cpu_seconds_total{mode="idle"}[1m]) '
            "* on (host, cpu) group_left (numa_node) vllm_fleet_cpu_numa_node)",
            {"node_cpu_seconds_total", "vllm_fleet_cpu_numa_node"},
        ),
        ("count(ALERTS{alertstate='firing'}) or vector(0)", {"ALERTS"}),
        (
            "histogram_quantile(0.95, sum by (le) (rate(vllm:inter_token_latency_seconds_bucket[5m])))",
            {"vllm:inter_token_latency_seconds_bucket"},
        ),
        ("vllm:kv_cache_usge_perc > 0.9", {"vllm:kv_cache_usge_perc"}),
    ],
)
def test_metric_names_are_read_from_expressions(expr, names):
    assert metric_names(expr) == names


# ---- Grafana ----


def dashboard():
    return json.loads(DASHBOARD.read_text())


def panels():
    for panel in dashboard()["panels"]:
        yield panel
        yield from panel.get("panels", [])


def dashboard_expressions():
    exprs = []
    for panel in panels():
        for target in panel.get("targets", []):
            expr = target["expr"]
            for variable in sorted(GRAFANA_VARIABLES, key=len, reverse=True):
                expr = expr.replace(variable, GRAFANA_VARIABLES[variable])
            assert "$" not in expr.replace("$1", ""), f"a Grafana variable is not substituted: {expr}"
            exprs.append(expr)
    return exprs


def test_the_dashboard_is_a_grafana_dashboard_with_its_variables():
    board = dashboard()
    assert 36 <= board["schemaVersion"] <= 41
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert variables["host_class"]["type"] == "query"
    ids = [p["id"] for p in panels()]
    assert len(ids) == len(set(ids)), "two panels share an id"


def test_every_panel_has_a_target_on_the_datasource_variable():
    for panel in panels():
        if panel["type"] == "row":
            continue
        assert panel.get("targets"), f"panel {panel['title']!r} has no target"
        for target in panel["targets"]:
            assert target["expr"].strip(), panel["title"]
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]


def test_every_dashboard_expression_is_valid_promql(tmp_path):
    check_expressions(tmp_path, dashboard_expressions())


def test_every_dashboard_expression_uses_known_metric_names():
    exprs = dashboard_expressions()
    assert exprs
    assert unknown_names(exprs) == {}


def test_the_dashboard_covers_what_operators_look_at():
    used = set().union(*(metric_names(e) for e in dashboard_expressions()))
    for name in (
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:kv_cache_usage_perc",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm_fleet_cpu_numa_node",
        "haproxy_server_status",
        "vllm_fleet_instance_info",
    ):
        assert name in used, name


# ---- the console page ----

# The PromQL of the page: the first string of `query`, `args` (prom_query_drilldown) and
# `printf` feeding them, and the PromConsole.Graph `expr:` strings.
CONSOLE_QUERY = re.compile(r'\b(?:query|args)\s+\(?\s*(?:printf\s+)?"((?:[^"\\]|\\.)*)"')
CONSOLE_GRAPH = re.compile(r'^\s*expr:\s*"((?:[^"\\]|\\.)*)"', re.M)


def console_expressions():
    text = CONSOLE.read_text()
    exprs = CONSOLE_QUERY.findall(text) + CONSOLE_GRAPH.findall(text)
    # printf's verbs stand for label matchers (`{job='vllm',%s}`, $sel) or for label values.
    exprs = [re.sub(r"(?<=[{,])%s(?=[},])", "host='x'", e) for e in exprs]
    return [re.sub(r"%[sdv]", "x", e).replace("%%", "%") for e in exprs]


def test_every_console_expression_is_found_valid_and_known(tmp_path):
    exprs = console_expressions()
    # every `query`, `args` and graph of the page is read (a new kind of call would be missed)
    text = CONSOLE.read_text()
    assert len(exprs) == len(re.findall(r"\b(?:query|args)\s", text)) + text.count("new PromConsole.Graph")
    check_expressions(tmp_path, exprs)
    assert unknown_names(exprs) == {}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stock_console_libraries():
    """The distribution's prometheus binary and console libraries, beside promtool."""
    bindir = Path(promtool()).resolve().parent
    binary = bindir / "prometheus"
    libraries = bindir.parent / "share/doc/prometheus/examples/console_libraries"
    assert binary.is_file(), f"no prometheus beside promtool ({bindir}): the console page cannot be rendered"
    assert (libraries / "prom.lib").is_file(), f"no stock console libraries in {libraries}"
    return binary, libraries


def get(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def render_console(tmp_path, openmetrics=None):
    """Start Prometheus on the page and the rules (and backfilled series) and fetch the page."""
    binary, libraries = stock_console_libraries()
    data = tmp_path / "data"
    data.mkdir()
    if openmetrics is not None:
        source = tmp_path / "fleet.om"
        source.write_text(openmetrics)
        done = subprocess.run(
            [promtool(), "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
    (tmp_path / "vllm-fleet.rules.yml").write_text(rendered_rules())
    config = tmp_path / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {"global": {"evaluation_interval": "1s"}, "rule_files": [str(tmp_path / "vllm-fleet.rules.yml")]}
        )
    )
    address = f"127.0.0.1:{free_port()}"
    log = (tmp_path / "prometheus.log").open("w")
    server = subprocess.Popen(
        [
            str(binary),
            f"--config.file={config}",
            f"--storage.tsdb.path={data}",
            f"--web.listen-address={address}",
            f"--web.console.templates={CONSOLES}",
            f"--web.console.libraries={libraries}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, (tmp_path / "prometheus.log").read_text()
            try:
                if get(f"http://{address}/-/ready")[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "Prometheus did not get ready in 60 s"
            time.sleep(0.2)
        if openmetrics is not None:
            # the recording rules have been evaluated once
            deadline = time.monotonic() + 30
            while (
                '"result":[]' in get(f"http://{address}/api/v1/query?query=vllm_fleet:cpu_busy:ratio_by_numa_node")[1]
            ):
                assert time.monotonic() < deadline, "the recording rules gave nothing in 30 s"
                time.sleep(0.5)
        return get(f"http://{address}/consoles/{CONSOLE.name}")
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


def cells(page):
    """The page's table rows as lists of cell texts, links and whitespace dropped."""
    rows = []
    for row in re.findall(r"<tr>(.*?)</tr>", page, re.S):
        texts = [re.sub(r"<[^>]+>", "", c).split() for c in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row, re.S)]
        rows.append([" ".join(t) for t in texts])
    return rows


def test_the_console_page_renders_an_empty_fleet(tmp_path):
    status, page = render_console(tmp_path)
    assert status == 200, page
    assert "No vLLM instance is scraped yet." in page
    assert "No load balancer is scraped yet." in page
    assert "No node exporter is scraped yet." in page
    assert page.count("new PromConsole.Graph") == 3


def fleet_openmetrics(now):
    """Ten minutes of a small fleet: h1 serves two instances (vllm-1 on an old version and
    drained), h2's instance is down and its firewall table missing, lb1 balances them."""
    times = [now - 600 + 15 * i for i in range(41)]
    families = {}

    def add(name, labels, value):
        text = ",".join(f'{k}="{v}"' for k, v in labels.items())
        families.setdefault(name, []).extend(f"{name}{{{text}}} {value(i)} {t}" for i, t in enumerate(times))

    target = {"host_class": "avx512", "fleet_target_version": "0.32.0"}
    for host, instance, up in (("h1", "vllm-0", 1), ("h1", "vllm-1", 1), ("h2", "vllm-0", 0)):
        labels = {"job": "vllm", "instance": f"{host}:8000", "host": host, "vllm_instance": instance, **target}
        add("up", labels, lambda i, up=up: up)
        if up:
            add("vllm:kv_cache_usage_perc", labels, lambda i: 0.42)
            add("vllm:num_requests_running", labels, lambda i: 3)
            add("vllm:num_requests_waiting", labels, lambda i: 1)
            add("vllm:generation_tokens_total", labels, lambda i: 150 * i)
            add("vllm:prompt_tokens_total", labels, lambda i: 600 * i)
    for host in ("h1", "h2", "lb1"):
        labels = {"job": "node", "instance": f"{host}:9100", "host": host, **(target if host != "lb1" else {})}
        add("up", labels, lambda i: 1)
        if host == "lb1":
            continue
        add("vllm_fleet_firewall_table_present", labels, lambda i, h=host: int(h == "h1"))
        add("vllm_fleet_converged_record_present", labels, lambda i: 1)
        for cpu in (0, 1):
            add("vllm_fleet_cpu_numa_node", {**labels, "cpu": cpu, "numa_node": cpu}, lambda i: 1)
            add("node_cpu_seconds_total", {**labels, "cpu": cpu, "mode": "idle"}, lambda i: 15 * i)
    for instance, version in (("vllm-0", "0.32.0"), ("vllm-1", "0.27.1")):
        labels = {"job": "node", "instance": "h1:9100", "host": "h1", "vllm_instance": instance, **target}
        add("vllm_fleet_instance_info", {**labels, "version": version, "venv": f"/opt/vllm/{version}"}, lambda i: 1)
    lb = {"job": "haproxy", "instance": "lb1:8405", "host": "lb1"}
    add("up", lb, lambda i: 1)
    for server, state in (("h1-vllm-0", "UP"), ("h1-vllm-1", "DRAIN"), ("h2-vllm-0", "DOWN")):
        for each in ("UP", "DOWN", "DRAIN", "MAINT"):
            add(
                "haproxy_server_status",
                {**lb, "proxy": "vllm", "server": server, "state": each},
                lambda i, v=int(each == state): v,
            )
        add("haproxy_server_current_sessions", {**lb, "proxy": "vllm", "server": server}, lambda i: 2)
    return "\n".join(line for lines in families.values() for line in lines) + "\n# EOF\n"


def test_the_console_page_renders_a_fleet(tmp_path):
    status, page = render_console(tmp_path, fleet_openmetrics(int(time.time()) - 5))
    assert status == 200, page
    rows = cells(page)
    instances = {tuple(r[:2]): r for r in rows if len(r) == 12 and r[0] != "host"}
    assert set(instances) == {("h1", "vllm-0"), ("h1", "vllm-1"), ("h2", "vllm-0")}
    # up, running version, target, KV cache, running, waiting, ..., load balancer state
    assert instances["h1", "vllm-0"][3:9] == ["yes", "0.32.0", "0.32.0", "42.0 %", "3", "1"]
    assert instances["h1", "vllm-0"][11] == "lb1: UP"
    assert instances["h1", "vllm-1"][4] == "0.27.1" and instances["h1", "vllm-1"][11] == "lb1: DRAIN"
    assert instances["h2", "vllm-0"][3:5] == ["no", "-"] and instances["h2", "vllm-0"][11] == "lb1: DOWN"
    servers = {r[2]: r[3] for r in rows if len(r) == 5 and r[0] == "lb1"}
    assert servers == {"h1-vllm-0": "UP", "h1-vllm-1": "DRAIN", "h2-vllm-0": "DOWN"}
    hosts = {r[0]: r for r in rows if len(r) == 6 and r[0] != "host"}
    assert hosts["h1"][3:5] == ["loaded", "present"] and hosts["h2"][3] == "missing"
    assert hosts["lb1"][3:] == ["-", "-", "-"]
    assert re.fullmatch(r"node 0: \d+% node 1: \d+%", hosts["h1"][5]), hosts["h1"][5]


# ---- every name the monitoring reads, against the recordings (issue 42) ----


def rule_expressions():
    return [rule["expr"] for group in yaml.safe_load(rendered_rules())["groups"] for rule in group["rules"]]


def report_expressions():
    from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils import vllm_fleet_report as report

    names = [name for names in (*report.COUNTERS.values(), *report.GAUGES.values()) for name in names]
    return list(report.prometheus_queries().values()) + names


@pytest.mark.parametrize(
    "where", ["rules", "dashboard", "console", "report"], ids=["rules", "dashboard", "console", "report"]
)
def test_every_name_the_monitoring_reads_is_exported_by_the_job_it_names(where):
    exprs = {
        "rules": rule_expressions,
        "dashboard": dashboard_expressions,
        "console": console_expressions,
        "report": report_expressions,
    }[where]()
    assert exprs
    assert unknown_names(exprs) == {}
    assert misplaced_names(exprs) == {}


def test_a_renamed_or_misplaced_metric_is_caught():
    """The negative control: what a rename in every file at once (the hand list let 22 of 22 tests pass) looks like."""
    assert unknown_names(["sum(vllm:num_requests_queued{job='vllm'})"]) == {
        "sum(vllm:num_requests_queued{job='vllm'})": ["vllm:num_requests_queued"]
    }
    assert unknown_names(['haproxy_server_state{job="haproxy"}'])
    assert misplaced_names(['haproxy_server_status{job="node"} == 1']) == {
        'haproxy_server_status{job="node"} == 1': [("haproxy_server_status", "node")]
    }
    # A name one Debian release's program lacks is not exported (both are run by the fleet).
    only_3 = exposition_names((METRICS / "haproxy-3.0.11.prom").read_text()) - exported("haproxy")
    for name in sorted(only_3)[:3]:
        assert misplaced_names([f'{name}{{job="haproxy"}}'])


def test_every_recording_is_described():
    """Each recording's program and version, and how it was made, are in the fixtures' README."""
    readme = (METRICS / "README.md").read_text()
    for files in RECORDINGS.values():
        for name in files:
            assert (METRICS / name).stat().st_size > 1000, name
            assert name in readme, f"{name} is not described in {METRICS / 'README.md'}"
