"""The monitoring role's alert and recording rules, checked and unit-tested with promtool.

The rule file is a Jinja2 template for its thresholds only: it is rendered here with the role's
defaults (and with other values) and handed to `promtool check rules` and `promtool test rules`.
tests/unit/monitoring/vllm-fleet.rules.test.yml holds, for every alert, a case where it fires
and one where it must not. promtool must be on PATH (scripts/test.sh puts .cache/tools/bin
there): without it these tests fail, they never skip.
"""

import json
import re
import shutil
import subprocess
from pathlib import Path

import jinja2
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "roles/monitoring/templates/vllm-fleet.rules.yml.j2"
DEFAULTS = ROOT / "roles/monitoring/defaults/main.yml"
UNIT_TESTS = ROOT / "tests/unit/monitoring/vllm-fleet.rules.test.yml"
OPERATIONS = ROOT / "docs/operations.md"


def promtool():
    path = shutil.which("promtool")
    assert path, "promtool is not on PATH: run scripts/bootstrap.sh and put .cache/tools/bin on PATH"
    return path


def knobs(**overrides):
    values = yaml.safe_load(DEFAULTS.read_text())
    values.update(overrides)
    return values


def render(**overrides):
    # The template module's own settings: trim_blocks, undefined variables are errors.
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, trim_blocks=True, keep_trailing_newline=True)
    template = env.from_string(TEMPLATE.read_text())
    return template.render(ansible_managed="Ansible managed", **knobs(**overrides))


def run_promtool(*args):
    done = subprocess.run([promtool(), *map(str, args)], capture_output=True, text=True, timeout=120, check=False)
    return done.returncode, done.stdout + done.stderr


def write_rules(tmp_path, **overrides):
    path = tmp_path / "vllm-fleet.rules.yml"
    path.write_text(render(**overrides))
    return path


def alerts(text):
    return [rule for group in yaml.safe_load(text)["groups"] for rule in group["rules"] if "alert" in rule]


def test_promtool_is_on_path():
    code, out = run_promtool("--version")
    assert code == 0, out


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {
            "monitoring_instance_down_for": "90s",
            "monitoring_drained_alert_minutes": "45",
            "monitoring_ttft_p95_seconds": 0.5,
            "monitoring_restarts_alert_count": 1,
        },
    ],
    ids=["defaults", "other-knobs"],
)
def test_rules_pass_promtool_check(tmp_path, overrides):
    code, out = run_promtool("check", "rules", write_rules(tmp_path, **overrides))
    assert code == 0, out
    assert "SUCCESS" in out


def test_prometheus_templates_survive_jinja():
    text = render()
    assert "{{ $labels.host }}" in text
    assert "{{ $value | humanizePercentage }}" in text
    assert "{%" not in text and "{#" not in text


def test_every_alert_has_a_severity_and_says_what_to_do():
    for rule in alerts(render()):
        # info: planned work's notice, which Alertmanager's info route sends once per run (test_alertmanager_config).
        # none: the Watchdog, which only its own receiver gets.
        assert rule["labels"]["severity"] in ("critical", "warning", "info", "none"), rule["alert"]
        assert rule["annotations"]["summary"].strip(), rule["alert"]
        assert rule["annotations"]["description"].strip(), rule["alert"]


def test_promtool_unit_tests_pass_with_the_defaults(tmp_path):
    write_rules(tmp_path)
    tests = tmp_path / UNIT_TESTS.name
    shutil.copy(UNIT_TESTS, tests)
    code, out = run_promtool("test", "rules", tests)
    assert code == 0, out
    assert "SUCCESS" in out


def seconds(duration):
    """A promtool duration of one unit (30s, 7m, 2h) in seconds."""
    match = re.fullmatch(r"(\d+)([smh])", str(duration))
    assert match, f"a duration this test does not read: {duration!r}"
    return int(match.group(1)) * {"s": 1, "m": 60, "h": 3600}[match.group(2)]


def test_every_rule_evaluates_while_each_target_has_its_old_series_beside_the_new(tmp_path):
    """A run that relabels a target (fleet_inputs, fleet_target_version, a moved port) leaves the old target's series
    beside the new target's for about a scrape interval. No rule may fail to evaluate then: a failed group is
    PrometheusRuleEvaluationFailures, a critical page after every planned run. Every case of the unit tests again,
    each scraped series twice (one with an extra label), checked only for evaluation errors at every step."""
    write_rules(tmp_path)
    suite = yaml.safe_load(UNIT_TESTS.read_text())
    for case in suite["tests"]:
        doubled = []
        for series in case.get("input_series", []):
            doubled.append(series)
            if "job=" in series["series"]:
                doubled.append({**series, "series": re.sub(r"\}$", ', relabeled="old"}', series["series"])})
        case["input_series"] = doubled
        times = [check["eval_time"] for key in ("alert_rule_test", "promql_expr_test") for check in case.get(key, [])]
        end = max(times, key=seconds)
        case.pop("alert_rule_test", None)
        # promtool evaluates every rule at every step up to the last check's time.
        every_step = {"expr": "vector(1)", "eval_time": end, "exp_samples": [{"labels": "{}", "value": 1}]}
        case["promql_expr_test"] = [every_step]
    tests = tmp_path / "relabeled.test.yml"
    tests.write_text(yaml.safe_dump(suite, sort_keys=False))
    code, out = run_promtool("test", "rules", tests)
    assert code == 0, out


def test_every_alert_has_a_firing_and_a_quiet_case():
    names = {rule["alert"] for rule in alerts(render())}
    fires, quiet = set(), set()
    for case in yaml.safe_load(UNIT_TESTS.read_text())["tests"]:
        for check in case.get("alert_rule_test", []):
            (fires if check.get("exp_alerts") else quiet).add(check["alertname"])
    assert names - fires == set(), "alerts without a case where they fire"
    # The dead-man's switch fires always: that it never stops is what its receiver checks.
    assert names - quiet == {"Watchdog"}, "alerts without a case where they must not fire"
    assert (fires | quiet) - names == set(), "cases for alerts the rules do not have"


def firing(*series):
    return [{"labels": f'ALERTS{{alertstate="firing", {labels}}}', "value": 1} for labels in series]


def test_the_thresholds_follow_the_knobs(tmp_path):
    """Other values than the defaults move each threshold: 5m down, 10 min drained, p95 above 2 s, 5 restarts."""
    write_rules(
        tmp_path,
        monitoring_instance_down_for="5m",
        monitoring_drained_alert_minutes=10,
        monitoring_ttft_p95_seconds=2,
        monitoring_restarts_alert_count=5,
    )
    ttft = 'vllm:time_to_first_token_seconds_bucket{{job="vllm", host="h1", vllm_instance="vllm-0", le="{}"}}'
    restarts = 'vllm_fleet_instance_restarts_total{{job="node", host="h1", vllm_instance="{}"}}'
    down = 'alertname="VllmInstanceDown", severity="critical", job="vllm", host="h1", vllm_instance="vllm-0"'
    drained = 'alertname="VllmServerDrained", severity="warning", host="lb1", proxy="vllm", server="h1-vllm-0"'
    slow = 'alertname="VllmSlowFirstToken", severity="warning", host="h1", vllm_instance="vllm-0"'
    restarting = (
        'alertname="VllmInstanceRestarting", severity="critical", job="node", host="h1", vllm_instance="vllm-1"'
    )
    suite = {
        "rule_files": ["vllm-fleet.rules.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": 'up{job="vllm", host="h1", vllm_instance="vllm-0"}', "values": "0x20"},
                    {
                        "series": 'haproxy_server_status{job="haproxy", host="lb1", proxy="vllm", '
                        'server="h1-vllm-0", state="DRAIN"}',
                        "values": "1x20",
                    },
                    # p95 2.9 s: above 2, below the default 5
                    {"series": ttft.format("1.0"), "values": "0x20"},
                    {"series": ttft.format("3.0"), "values": "0+10x20"},
                    {"series": ttft.format("+Inf"), "values": "0+10x20"},
                    # 4 restarts (3 would fire with the default), and 5
                    {"series": restarts.format("vllm-0"), "values": "0 1 2 3 4x16"},
                    {"series": restarts.format("vllm-1"), "values": "0 1 2 3 4 5x15"},
                ],
                "promql_expr_test": [
                    {
                        "expr": 'ALERTS{alertstate="firing", alertname!="Watchdog"}',
                        "eval_time": "4m",
                        "exp_samples": [],
                    },
                    {
                        "expr": 'ALERTS{alertstate="firing", alertname!="Watchdog"}',
                        "eval_time": "6m",
                        "exp_samples": firing(down, slow, restarting),
                    },
                    {
                        "expr": 'ALERTS{alertstate="firing", alertname!="Watchdog"}',
                        "eval_time": "9m",
                        "exp_samples": firing(down, slow, restarting),
                    },
                    {
                        "expr": 'ALERTS{alertstate="firing", alertname!="Watchdog"}',
                        "eval_time": "11m",
                        "exp_samples": firing(down, drained, slow, restarting),
                    },
                ],
            }
        ],
    }
    tests = tmp_path / "knobs.test.yml"
    tests.write_text(yaml.safe_dump(suite, sort_keys=False))
    code, out = run_promtool("test", "rules", tests)
    assert code == 0, out


def documented_alerts():
    """The alert names in the first column of docs/operations.md's "## Alerts" table."""
    text = OPERATIONS.read_text()
    match = re.search(r"^## Alerts\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert match, 'docs/operations.md has no "## Alerts" section'
    return re.findall(r"^\| `(\w+)` \|", match.group(1), re.M)


def test_the_documented_alerts_are_the_rules_alerts():
    documented = documented_alerts()
    assert len(documented) == len(set(documented)), "an alert is documented twice"
    assert sorted(documented) == sorted(rule["alert"] for rule in alerts(render()))


ALERTMANAGER = ROOT / "roles/monitoring/templates/alertmanager.yml.j2"


def render_alertmanager(**overrides):
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, trim_blocks=True, keep_trailing_newline=True)
    env.filters["to_json"] = json.dumps
    return env.from_string(ALERTMANAGER.read_text()).render(ansible_managed="Ansible managed", **knobs(**overrides))


@pytest.mark.parametrize(
    ("webhook", "watchdog"), [("", ""), ("https://alerts.example.com/hook", "https://deadman.example.com/ping/x")]
)
def test_alertmanager_config_passes_amtool(tmp_path, webhook, watchdog):
    amtool = shutil.which("amtool")
    assert amtool, "amtool is not on PATH: run scripts/bootstrap.sh and put .cache/tools/bin on PATH"
    path = tmp_path / "alertmanager.yml"
    text = render_alertmanager(monitoring_alert_webhook_url=webhook, monitoring_alert_watchdog_url=watchdog)
    if watchdog:
        receivers = {r["name"]: r for r in yaml.safe_load(text)["receivers"]}
        assert receivers["watchdog"]["webhook_configs"][0]["url"] == watchdog
    path.write_text(text)
    done = subprocess.run([amtool, "check-config", str(path)], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_alertmanager_sends_planned_works_notice_once_per_run_and_groups_the_rest_by_class():
    """Every info alert of the rules (planned work's notice) takes the info route, grouped by run; the rest are grouped
    by alert and host class (not one notification per host), and a critical alert of an instance holds its warnings."""
    config = yaml.safe_load(render_alertmanager(monitoring_alert_webhook_url="https://alerts.example.com/hook"))
    assert config["route"]["group_by"] == ["alertname", "host_class"]
    watchdog, info = config["route"]["routes"]
    assert info["matchers"] == ['severity="info"'] and info["group_by"] == ["alertname", "run"]
    assert watchdog["matchers"] == ['alertname="Watchdog"'] and watchdog["receiver"] == "watchdog"
    assert [r["name"] for r in config["receivers"]] == ["fleet", "watchdog"]
    assert "webhook_configs" not in config["receivers"][1]  # no dead-man receiver set: nothing is posted
    for rule in alerts(render()):
        if rule["labels"]["severity"] == "info":
            assert "run" in rule["expr"], f"{rule['alert']}: an info alert is grouped by run"
    (inhibit,) = config["inhibit_rules"]
    assert inhibit["equal"] == ["host", "vllm_instance"]
    assert config["receivers"][0]["webhook_configs"][0]["send_resolved"] is True
