"""The live fleet report (plugin_utils/vllm_fleet_report.py): /metrics and show stat parsing, Prometheus answers,
rows for every host whatever could be read, escaping, one SVG chart pair per host class."""

import html
import re
import subprocess
import sys

import pytest
import yaml
from ansible_collections.vllm.cpu_fleet.plugins.filter import vllm_fleet_report as filters
from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_lb_backends import BackendError
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils import vllm_fleet_report as report
from conftest import REPO

sys.path.insert(0, str(REPO / "tests" / "fixtures"))
import fleet_report_fake as fake

HAPROXY = REPO / "tests" / "fixtures" / "haproxy"


# ---------------------------------------------------------------- /metrics


def test_exposition_keeps_vllm_samples_with_labels_and_skips_comments():
    samples = report.parse_exposition(fake.FIRST)
    assert samples["vllm:kv_cache_usage_perc"] == [({"engine": "0", "model_name": "tiny-llama"}, 0.0)]
    assert samples["vllm:generation_tokens_total"] == [({"engine": "0", "model_name": "tiny-llama"}, 24.0)]
    buckets = samples["vllm:time_to_first_token_seconds_bucket"]
    assert buckets[0] == ({"engine": "0", "le": "0.001", "model_name": "tiny-llama"}, 0.0)
    assert buckets[-1][0]["le"] == "+Inf" and buckets[-1][1] == 6.0
    assert not any(name.startswith(("python_", "process_", "http_")) for name in samples)
    assert "process_resident_memory_bytes" in report.parse_exposition(fake.FIRST, prefix="")


def test_exposition_reads_escaped_labels_exponents_special_values_and_timestamps():
    text = (
        '# TYPE vllm:x gauge\nvllm:x{a="q\\"uo\\\\te",b="line\\nbreak"} 1.5e+03 1700000000000\n'
        'vllm:y +Inf\nvllm:z NaN\nvllm:broken{a="1"}\nnot a sample\n'
    )
    samples = report.parse_exposition(text)
    assert samples["vllm:x"] == [({"a": 'q"uo\\te', "b": "line\nbreak"}, 1500.0)]
    assert samples["vllm:y"][0][1] == float("inf")
    assert "vllm:broken" not in samples


def test_one_read_gives_counters_and_gauges_summed_over_engines():
    two_engines = fake.FIRST + 'vllm:generation_tokens_total{engine="1",model_name="tiny-llama"} 6.0\n'
    figures = report.instance_figures(two_engines)
    assert figures == {
        "prompt_tokens": 120.0,
        "generation_tokens": 30.0,
        "kv_usage": 0.0,
        "running": 0.0,
        "waiting": 0.0,
    }
    # An older release's name for the KV cache gauge.
    old = 'vllm:gpu_cache_usage_perc{model_name="m"} 0.5\n'
    assert report.instance_figures(old)["kv_usage"] == 0.5
    assert report.instance_figures("")["generation_tokens"] is None


def test_two_reads_give_tokens_per_second_and_the_latest_gauges():
    figures = report.sampled_figures(fake.FIRST, fake.SECOND, 5.0)
    assert figures == {"prompt_tps": 20.0, "generation_tps": 32.0, "kv_usage": 0.0125, "running": 2.0, "waiting": 1.0}
    # A counter that went down (the instance restarted between the reads) is no rate; one read has none.
    assert report.sampled_figures(fake.SECOND, fake.FIRST, 5.0)["generation_tps"] is None
    assert report.sampled_figures(fake.FIRST, None, 5.0)["prompt_tps"] is None


def test_prometheus_answers_by_host_and_instance():
    answers = {key: fake.vector(samples) for key, samples in fake.PROMETHEUS.items()}
    answers["waiting"] = {"status": "error", "error": "parse error"}
    figures = report.prometheus_figures(answers)
    assert figures[("spr-1", "vllm-1")]["generation_tps"] == 35.5
    assert figures[("spr-1", "vllm-1")]["kv_usage"] == 0.95
    assert figures[("graviton-1", "vllm-0")]["kv_usage"] is None  # NaN
    assert "waiting" not in figures[("spr-1", "vllm-0")]


def test_the_queries_group_by_the_monitoring_roles_labels():
    queries = filters.vllm_fleet_report_queries("5m")
    assert queries["generation_tps"] == "sum by (host, vllm_instance) (rate(vllm:generation_tokens_total[5m]))"
    assert "vllm:kv_cache_usage_perc or vllm:gpu_cache_usage_perc" in queries["kv_usage"]


# ---------------------------------------------------------------- HAProxy show stat


def test_show_stat_recorded_answers_by_header():
    busy = report.lb_servers((HAPROXY / "show_stat_busy.csv").read_text(), "vllm")
    assert busy == [
        {"proxy": "vllm", "server": "h1-vllm-0", "status": "MAINT", "sessions": 0},
        {"proxy": "vllm", "server": "h1-vllm-1", "status": "DRAIN", "sessions": 2},
        {"proxy": "vllm", "server": "h2-vllm-0", "status": "DRAIN", "sessions": 0},
    ]
    states = {s["server"]: s["status"] for s in report.lb_servers((HAPROXY / "show_stat_drain_maint.csv").read_text())}
    assert states == {"h1-vllm-0": "UP", "h1-vllm-1": "MAINT", "h2-vllm-0": "DRAIN"}


def test_show_stat_summary_rows_and_other_backends_are_left_out_and_columns_found_by_name():
    text = fake.stat_csv([("a-vllm-0", "UP", 1)])
    assert [s["server"] for s in report.lb_servers(text, "vllm")] == ["a-vllm-0"]
    assert report.lb_servers(text, "other") == []
    # Columns in another order (a newer HAProxy) are found by their header names.
    shuffled = "# status,scur,svname,pxname\nUP,3,b-vllm-0,vllm\n"
    assert report.lb_servers(shuffled) == [{"proxy": "vllm", "server": "b-vllm-0", "status": "UP", "sessions": 3}]
    with pytest.raises(BackendError, match="no '# ' header"):
        report.lb_servers("Unknown command.\n")
    assert [report.status_word(s) for s in ("UP 1/2", "no check", "MAINT (resolution)", "DOWN")] == [
        "UP",
        "OTHER",
        "MAINT",
        "DOWN",
    ]


# ---------------------------------------------------------------- rows


@pytest.fixture
def built():
    hosts, hostvars, lbs, mon, options = fake.fake_fleet(benchmark=True)
    return filters.vllm_fleet_report(hosts, hostvars, lbs, mon, options)


def _row(built, host):
    return next(row for row in built["hosts"] if row["host"] == host)


def test_every_host_has_a_row_whatever_could_be_read(built):
    assert [row["host"] for row in built["hosts"]] == sorted(fake.fake_fleet()[0])
    assert _row(built, "gone")["missing"].startswith("no facts in this run")
    assert _row(built, "gone")["state_problem"].startswith("unreachable: Failed to connect")
    old = _row(built, "old-host")
    assert "vllm_fleet_state.py is missing on the host" in old["state_problem"]
    assert [i["name"] for i in old["instances"]] == ["vllm-0", "vllm-1", "vllm-2", "vllm-3"]  # from the plan
    assert all(i["figures"] is None and "Connection refused" in i["figures_error"] for i in old["instances"])


def test_instances_merge_plan_unit_versions_lb_views_and_figures(built):
    spr2 = {i["name"]: i for i in _row(built, "spr-2")["instances"]}
    assert spr2["vllm-0"]["version"] == "0.31.1" and spr2["vllm-0"]["uptime"] == "2h 3m"
    assert spr2["vllm-1"]["unit"] == "activating/auto-restart" and spr2["vllm-1"]["restarts"] == 4
    assert spr2["vllm-0"]["lb"]["lb-1"] == {"proxy": "vllm", "server": "spr-2-vllm-0", "status": "DRAIN", "sessions": 0}
    assert spr2["vllm-1"]["lb"]["lb-1"]["status"] == "DOWN"
    assert spr2["vllm-0"]["lb"]["lb-2"]["note"].startswith("unreachable: Failed to connect")
    spr1 = _row(built, "spr-1")
    assert spr1["instances"][0]["kvcache_gib"] == 399 and spr1["instances"][0]["bind"] == "1-55"
    assert spr1["instances"][0]["figures"]["generation_tps"] == 32.0
    assert [i["version"] for i in spr1["installed"]] == ["0.31.1", "0.32.0"]
    assert _row(built, "graviton-1")["class"] == "arm-c7g"  # monitoring_host_class wins over the ISA class


def test_load_balancers_count_states_and_name_unplanned_servers(built):
    lb1, lb2 = built["loadbalancers"]
    assert (lb1["up"], lb1["servers"], lb1["sessions"]) == (4, 8, 3)
    assert [s["server"] for s in lb1["unplanned"]] == ["retired-vllm-0"]
    assert lb2["problem"].startswith("unreachable")


def test_classes_sum_tokens_per_second(built):
    classes = {c["name"]: c for c in built["classes"]}
    amx = classes["x86_64-amx"]
    assert (amx["hosts"], amx["instances"], amx["active"]) == (2, 4, 3)
    assert amx["generation_tps"] == pytest.approx(32.0 * 2 + 16.0)
    assert classes["arm-c7g"]["generation_tps"] == pytest.approx(64.0)


def test_prometheus_figures_replace_the_loopback_reads():
    built = filters.vllm_fleet_report(*fake.fake_fleet(monitoring=True))
    spr1 = _row(built, "spr-1")["instances"]
    assert spr1[1]["figures"]["kv_usage"] == 0.95 and spr1[1]["figures"]["waiting"] == 5
    assert _row(built, "spr-2")["instances"][0]["figures"] is None  # Prometheus has no series for it
    assert built["figures_source"].startswith("Prometheus on mon-1 (http://10.0.0.9:9090)")
    assert not built["notes"]


def test_a_failed_prometheus_query_is_a_note_not_a_crash():
    hosts, hostvars, lbs, mon, options = fake.fake_fleet(monitoring=True)
    hostvars["mon-1"]["fleet_report_prometheus"]["results"][0] = {
        "item": {"key": "prompt_tps"},
        "failed": True,
        "status": -1,
        "msg": "Connection refused",
    }
    built = filters.vllm_fleet_report(hosts, hostvars, lbs, mon, options)
    assert built["notes"] == ["Prometheus queries failed: prompt_tps: Connection refused"]
    hostvars.pop("mon-1")
    assert "not asked" in filters.vllm_fleet_report(hosts, hostvars, lbs, mon, options)["notes"][0]


def test_the_plan_on_the_host_stands_in_when_the_run_has_none():
    hosts, hostvars, lbs, mon, options = fake.fake_fleet()
    plan = hostvars["spr-1"].pop("vllm_plan")
    hostvars["spr-1"]["fleet_report_plan_file"] = fake.slurped(plan)
    row = _row(filters.vllm_fleet_report(hosts, hostvars, lbs, mon, options), "spr-1")
    assert row["plan_source"] == "plan.json on the host" and row["instances"][0]["port"] == 8000
    hostvars["spr-1"]["fleet_report_plan_file"] = {"failed": False, "msg": "file not found"}
    row = _row(filters.vllm_fleet_report(hosts, hostvars, lbs, mon, options), "spr-1")
    assert row["plan_instances"] == "no plan" and [i["planned"] for i in row["instances"]] == [False, False]


def test_bad_state_output_and_a_failed_reader_say_so():
    hosts, hostvars, lbs, mon, options = fake.fake_fleet()
    hostvars["spr-1"]["fleet_report_state"] = fake.ran("Traceback (most recent call last):")
    hostvars["spr-2"]["fleet_report_state"] = {"rc": 1, "stdout": "", "stderr": "PermissionError: /proc/1/maps"}
    built = filters.vllm_fleet_report(hosts, hostvars, lbs, mon, options)
    assert _row(built, "spr-1")["state_problem"] == "state unknown (the state reader's output is not its JSON)"
    assert _row(built, "spr-2")["state_problem"] == "state unknown (state failed (rc 1): PermissionError: /proc/1/maps)"


# ---------------------------------------------------------------- rendering


def test_html_escapes_every_value(built):
    page = filters.vllm_fleet_report_html(built)
    assert "<script>" not in page and "<b>bold</b>" not in page
    assert html.escape(fake.EVIL) in page
    assert "&lt;b&gt;bold&lt;/b&gt;" in page
    # Nothing fetched or run when the page opens.
    assert not re.search(r"<script|src=|href=|@import|url\(", page, re.IGNORECASE)


def test_html_template_escapes_a_host_name_a_message_and_a_version():
    """The HTML page comes from an autoescaped template (issue 45): markup in a host name, in a message (a failed
    state reader's stderr) and in a version is text, escaped as html.escape does it (quotes as &quot; and &#x27;,
    never markupsafe's &#34; and &#39;), wherever it is written: a cell, a rowspan cell, a list item."""
    host = 'h<i>"&\'1'
    message = "<img src=x onerror=alert(1)> & \"quoted\" 'single'"
    version = "0.32.0<b>+cpu</b>&\"'"
    hosts, hostvars, lbs, mon, options = fake.fake_fleet()
    live = fake.state(host, [fake.running("vllm-0", version=version)], installed=(version,))
    hostvars[host] = {**fake.host_vars("spr-1"), "fleet_report_state": fake.ran(live)}
    hostvars["spr-2"]["fleet_report_state"] = {"rc": 1, "stdout": "", "stderr": message}
    page = filters.vllm_fleet_report_html(filters.vllm_fleet_report([*hosts, host], hostvars, lbs, mon, options))
    for text in (host, message, version):
        assert html.escape(text) in page, text
        assert text not in page, text
    assert f'<td rowspan="2">{html.escape(host)}</td>' in page
    assert f'<td class="bad">{html.escape(version)}</td>' in page  # not the version the plan wants
    assert f"<li>spr-2: state unknown (state failed (rc 1): {html.escape(message)})</li>" in page
    assert not re.search(r"<(i|b|img)[ >]", page) and "&#34;" not in page and "&#39;" not in page


def test_markdown_escapes_cells(built):
    markdown = filters.vllm_fleet_report_markdown(built)
    assert fake.EVIL not in markdown and "&lt;script&gt;alert(1)&lt;/script&gt;" in markdown
    hosts, hostvars, lbs, mon, options = fake.fake_fleet()
    hostvars["lb-1"]["fleet_report_lb_stat"] = fake.ran(fake.stat_csv([("x|y", "UP", 0)]))
    markdown = filters.vllm_fleet_report_markdown(filters.vllm_fleet_report(hosts, hostvars, lbs, mon, options))
    assert "x\\|y UP" in markdown


def test_every_host_and_instance_is_a_row_in_both_pages(built):
    markdown = filters.vllm_fleet_report_markdown(built)
    page = filters.vllm_fleet_report_html(built)
    for row in built["hosts"]:
        assert f"<td>{html.escape(row['host'])}</td>" in page
        assert f"| {html.escape(row['host'], quote=False)} |" in markdown
        for instance in row["instances"]:
            assert f"| {html.escape(row['host'], quote=False)} / {instance['name']} |" in markdown
    assert "| gone | unreachable: Failed to connect to the host via ssh |" in markdown
    assert '<span class="st st-DRAIN">DRAIN</span> 0 cur' in page


def test_one_chart_pair_per_host_class(built):
    page = filters.vllm_fleet_report_html(built)
    classes = [c["name"] for c in built["classes"]]
    # "gone" has neither facts nor plan: its class is unknown, and it has no instances to chart.
    assert classes == sorted(["x86_64-amx", "arm-c7g", "<b>bold</b>", "x86_64-avx512vnni", "unplanned"])
    for name in classes:
        block = re.search(rf'<div class="charts" data-class="{re.escape(html.escape(name))}">(.*?)</div>', page)
        assert (block is None) == (name == "unplanned"), name
        if block:
            assert block[1].count("<svg") == 2 and block[1].count("</svg>") == 2
    assert "<h3>unplanned</h3><p>No instances: 1 host(s) without a plan.</p>" in page
    # Bars are as long as their value: spr-1's generation (32 tok/s) is the class's longest.
    tps, kv = report.class_charts(next(c for c in built["classes"] if c["name"] == "x86_64-amx"))
    widths = [float(w) for w in re.findall(r'<rect x="230" y="[\d.]+" width="([\d.]+)" height="9" fill=', tps)]
    assert len(widths) == 6  # prompt and generation of the three instances with figures
    assert max(widths) == pytest.approx(640 - 230 - 130) and widths[0] == pytest.approx(280 * 20 / 32)
    assert "n/a" in kv  # the restarting instance has no figures
    assert 'fill="#e45756"' in kv  # spr-2/vllm-0 at 93 %: the "90 % or more" colour


def test_svg_bars_draw_nothing_outside_and_escape_labels():
    svg = report.svg_bars("t<", [("a&b", 2.0, "kv"), ("c", None, "kv"), ("d", 5.0, "kv")], "%", maximum=1.0)
    assert "t&lt;" in svg and "a&amp;b" in svg and "<svg" in svg and svg.endswith("</svg>")
    widths = [float(w) for w in re.findall(r'width="([\d.]+)" height="18" fill=', svg)]
    assert widths == [280.0, 280.0]  # above the maximum: clipped to the track
    long = report.svg_bars("t", [("x" * 50 + "-tail", 1.0, "kv")])
    assert "\u2026" in long and "x" * 50 + "-tail</title>" in long


def test_benchmark_is_labelled_fleet_wide_with_the_classes(built):
    bench = built["benchmark"]
    assert [level["concurrency"] for level in bench["levels"]] == [1, 4, 16]
    page = filters.vllm_fleet_report_html(built)
    assert "cannot be held to one host class" in page and "Benchmark: output tokens/s" in page
    markdown = filters.vllm_fleet_report_markdown(built)
    assert "| 16 | 32 (1) | 102.3 | 0.611 s | 1.402 s |" in markdown
    failed = report.benchmark_summary({"rc": 0, "stdout": '{"levels": [], "error": "HTTP 401 Unauthorized"}'}, [])
    assert failed["problem"] == "HTTP 401 Unauthorized"
    assert report.benchmark_summary(None, []) is None


def test_an_instance_prometheus_cannot_scrape_is_said_not_shown_idle():
    """`up` was queried and thrown away (issue 42): an instance that answers no scrape showed no load, as an idle one
    does. Now its figures are a problem the report names; an instance that is no target is named too."""
    hosts, hostvars, lbs, mon, options = fake.fake_fleet(monitoring=True)
    for item in hostvars["mon-1"]["fleet_report_prometheus"]["results"]:
        if item["item"]["key"] == "up":
            for series in item["json"]["data"]["result"]:
                if series["metric"]["vllm_instance"] == "vllm-1":
                    series["value"][1] = "0"
    built = filters.vllm_fleet_report(hosts, hostvars, lbs, mon, options)
    down = _row(built, "spr-1")["instances"][1]
    assert down["figures"] is None and "cannot scrape" in down["figures_error"]
    assert _row(built, "spr-1")["instances"][0]["figures"]["kv_usage"] == 0.42
    assert "not a Prometheus target" in _row(built, "spr-2")["instances"][0]["figures_error"]
    for page in (filters.vllm_fleet_report_markdown(built), filters.vllm_fleet_report_html(built)):
        assert "Prometheus cannot scrape its /metrics (up 0)" in page


def test_the_report_lists_what_fires_most_severe_first():
    """Issue 42: the report showed no firing alerts. ALERTS is asked with the figures and read apart (not as an
    instance's figure); the Watchdog (severity none) is left out by the query."""
    hosts, hostvars, lbs, mon, options = fake.fake_fleet(monitoring=True)
    firing = [
        {"alertname": "VllmKvCacheFull", "severity": "warning", "host": "spr-1", "vllm_instance": "vllm-1"},
        {"alertname": "VllmLoadBalancerNoServerUp", "severity": "critical", "host": "lb-1", "proxy": "vllm"},
        {"alertname": "VllmFleetRunInProgress", "severity": "info", "run": "r1"},
    ]
    answer = {
        "status": "success",
        "data": {"resultType": "vector", "result": [{"metric": m, "value": [1, "1"]} for m in firing]},
    }
    hostvars["mon-1"]["fleet_report_prometheus"]["results"].append(
        {"item": {"key": "alerts", "value": "..."}, "status": 200, "json": answer, "failed": False}
    )
    built = filters.vllm_fleet_report(hosts, hostvars, lbs, mon, options)
    assert [(a["severity"], a["alert"], a["where"]) for a in built["alerts"]] == [
        ("critical", "VllmLoadBalancerNoServerUp", "lb-1 vllm"),
        ("warning", "VllmKvCacheFull", "spr-1 vllm-1"),
        ("info", "VllmFleetRunInProgress", "r1"),
    ]
    assert "alerts" not in (_row(built, "spr-1")["instances"][1]["figures"] or {})
    markdown, html = filters.vllm_fleet_report_markdown(built), filters.vllm_fleet_report_html(built)
    assert "- critical VllmLoadBalancerNoServerUp: lb-1 vllm" in markdown
    assert "<b>VllmLoadBalancerNoServerUp</b>: lb-1 vllm" in html
    assert 'severity!="none"' in filters.vllm_fleet_report_queries()["alerts"]
    # None firing says so; no monitoring host, no section.
    answer["data"]["result"] = []
    assert "## Firing alerts\n\n- none" in filters.vllm_fleet_report_markdown(
        filters.vllm_fleet_report(hosts, hostvars, lbs, mon, options)
    )
    assert "Firing alerts" not in filters.vllm_fleet_report_markdown(filters.vllm_fleet_report(*fake.fake_fleet()))


def test_the_latency_and_load_balancer_error_queries_give_the_figures_a_real_prometheus_computes(tmp_path):
    """The report's p95 and 5xx-share queries, evaluated by promtool (Prometheus' own engine) on series shaped as the
    exporters give them: two load balancers' answers for h1-vllm-0 (1 of 10 a 5xx) and h1-vllm-1 (none), and one
    instance's first-token histogram (all requests under 0.5 s, so the p95 falls in the 0.25-0.5 bucket)."""
    import shutil

    queries = report.prometheus_queries(window="5m")
    rules = {"groups": [{"name": "report", "rules": [
        {"record": f"report:{name}", "expr": queries[name]} for name in ("ttft_p95", "lb_error_share")
    ]}]}  # fmt: skip
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
    series = []
    for lb in ("lb1", "lb2"):
        # per second per load balancer: h1-vllm-0 9 2xx + 1 5xx, h1-vllm-1 5 2xx
        for server, code, per_minute in (("h1-vllm-0", "2xx", 540), ("h1-vllm-0", "5xx", 60), ("h1-vllm-1", "2xx", 300),
                                         ("h1-vllm-1", "5xx", 0)):  # fmt: skip
            labels = f'job="haproxy", host="{lb}", proxy="vllm", server="{server}", code="{code}"'
            name = f"haproxy_server_http_responses_total{{{labels}}}"
            series.append({"series": name, "values": f"0+{per_minute}x10"})
    for le, per_minute in (("0.1", 0), ("0.25", 0), ("0.5", 60), ("+Inf", 60)):
        labels = f'job="vllm", host="h1", vllm_instance="vllm-0", model_name="m", le="{le}"'
        name = f"vllm:time_to_first_token_seconds_bucket{{{labels}}}"
        series.append({"series": name, "values": f"0+{per_minute}x10"})
    test = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": series,
            "promql_expr_test": [
                {"expr": "report:lb_error_share", "eval_time": "10m", "exp_samples": [
                    {"labels": 'report:lb_error_share{host="h1", vllm_instance="vllm-0"}', "value": 0.1},
                    {"labels": 'report:lb_error_share{host="h1", vllm_instance="vllm-1"}', "value": 0},
                ]},
                # histogram_quantile interpolates inside the bucket: 0.25 + 0.95 * 0.25
                {"expr": "report:ttft_p95", "eval_time": "10m", "exp_samples": [
                    {"labels": 'report:ttft_p95{host="h1", vllm_instance="vllm-0"}', "value": 0.4875},
                ]},
            ],
        }],
    }  # fmt: skip
    (tmp_path / "test.yml").write_text(yaml.safe_dump(test))
    done = subprocess.run(
        [shutil.which("promtool") or "promtool", "test", "rules", "test.yml"],
        cwd=tmp_path, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_instance_rows_show_latency_and_load_balancer_errors_where_prometheus_has_them():
    assert report.latency_text({}) == "-"
    assert report.latency_text({"ttft_p95": 0.4875, "e2e_p95": 2.5}) == "0.49 s / 2.50 s"
    assert report.latency_text({"e2e_p95": 2.5}) == "n/a / 2.50 s"
