"""Preflight's monitoring section: the durations, sizes, URL, ports, thresholds and networks Prometheus, Alertmanager,
systemd and nftables read as written, and the platforms the monitoring role installs on."""

import ipaddress
import math
import re
from urllib.parse import urlsplit

from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.preflight.common import (
    HOST_NAME,
    _is_address,
    networks,
)

# Prometheus' durations (model/time.go, 2.42): whole numbers with units from the largest to the smallest, each at
# most once (1h30m, 2w3d); "0" alone is zero.
PROMETHEUS_DURATION = re.compile(
    r"^(?:([0-9]+)y)?(?:([0-9]+)w)?(?:([0-9]+)d)?(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?(?:([0-9]+)ms)?\Z"
)
# --storage.tsdb.retention.size: a whole number and a unit (Prometheus' documented ones), or 0 for no limit.
PROMETHEUS_SIZE = re.compile(r"^[0-9]+(B|KB|MB|GB|TB|PB|EB)\Z")
# monitoring_prometheus_retention_size: auto: this share of the size of the file system that holds the storage
# (Prometheus' units are powers of 1024: GB is GiB), in whole GB, at least 1. The file system's size, not its free
# space: a value that moves with the samples it keeps would change the unit (and restart Prometheus) on every run.
AUTO_RETENTION_SHARE = 0.7


def auto_retention_size(filesystem_bytes):
    """The retention size `auto` gives on a file system of that many bytes, as Prometheus' flag reads it."""
    return f"{max(1, int(filesystem_bytes * AUTO_RETENTION_SHARE) // 2**30)}GB"


# The common subset of systemd's time spans (systemd.time(7)): numbers with units, blanks between them allowed;
# a number without a unit is seconds.
SYSTEMD_SPAN_SECONDS = {
    **dict.fromkeys(("usec", "us"), 1e-6),
    **dict.fromkeys(("msec", "ms"), 1e-3),
    **dict.fromkeys(("seconds", "second", "sec", "s"), 1),
    **dict.fromkeys(("minutes", "minute", "min", "m"), 60),
    **dict.fromkeys(("hours", "hour", "hr", "h"), 3600),
    **dict.fromkeys(("days", "day", "d"), 86400),
    **dict.fromkeys(("weeks", "week", "w"), 604800),
    **dict.fromkeys(("months", "month", "M"), 2629800),
    **dict.fromkeys(("years", "year", "y"), 31557600),
}
# Longest first: "min" before "m", "ms" before "m" and "s".
SYSTEMD_SPAN_UNITS = "|".join(sorted(SYSTEMD_SPAN_SECONDS, key=len, reverse=True))
SYSTEMD_SPAN = re.compile(rf"^\s*(?:[0-9]+(?:\.[0-9]+)?\s*(?:{SYSTEMD_SPAN_UNITS})?\s*)+\Z")
SYSTEMD_SPAN_PART = re.compile(rf"([0-9]+(?:\.[0-9]+)?)\s*({SYSTEMD_SPAN_UNITS})?")
# The durations the monitoring role writes into Prometheus' and Alertmanager's files and flags, and whether zero
# is a value they take: a zero retention keeps nothing, a zero scrape or evaluation interval becomes Prometheus'
# default (1m) silently, Alertmanager refuses a zero group or repeat interval; a zero group_wait sends at once
# and a zero `for` fires at the first failed scrape.
MONITORING_DURATIONS = {
    "monitoring_prometheus_retention_time": False,
    "monitoring_scrape_interval": False,
    "monitoring_evaluation_interval": False,
    "monitoring_alert_group_wait": True,
    "monitoring_alert_group_interval": False,
    "monitoring_alert_repeat_interval": False,
    "monitoring_instance_down_for": True,
    "monitoring_alert_watchdog_interval": False,
}
# The alert thresholds, all above 0, and what to write instead.
MONITORING_THRESHOLDS = {
    "monitoring_drained_alert_minutes": "a whole number of minutes above 0, such as 30",
    "monitoring_ttft_p95_seconds": "a number of seconds above 0, such as 5",
    "monitoring_restarts_alert_count": "a whole number above 0, such as 3",
    "monitoring_rollout_turn_minutes": "a whole number of minutes above 0, such as 90",
}


def _prometheus_duration(value):
    """The duration in milliseconds, or None where Prometheus would not read it."""
    if not isinstance(value, str):
        return None
    if value == "0":
        return 0
    match = PROMETHEUS_DURATION.match(value)
    if not value or not match:
        return None
    scales = (31536000000, 604800000, 86400000, 3600000, 60000, 1000, 1)
    return sum(int(part) * scale for part, scale in zip(match.groups(), scales, strict=True) if part)


def _systemd_span(value):
    """The time span in seconds, or None where it is not in the common subset of systemd's spans."""
    if not isinstance(value, str) or not SYSTEMD_SPAN.match(value):
        return None
    return sum(float(number) * SYSTEMD_SPAN_SECONDS[unit or "s"] for number, unit in SYSTEMD_SPAN_PART.findall(value))


def _http_url(value):
    """Whether value is an http(s) URL with a host, on one line."""
    if not isinstance(value, str) or re.search(r"[\s\x00-\x1f\x7f]", value):
        return False
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError for a port that is no number or out of range
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def webhook(host, url, allow_http=False, variable="monitoring_alert_webhook_url"):
    """The receiver Alertmanager posts every alert to. Its URL is never repeated, whole or in part beyond its scheme:
    receivers take their token in the path or query (a chat hook's URL is its secret). https, unless the receiver is
    on this host (loopback) or the inventory opts in; never a link-local address (the cloud's metadata service)."""
    if not url:
        return []
    name = f"{host}: {variable}"
    if not _http_url(url):
        return [
            f"{name}: is no http or https URL with a host (the value is not shown: a webhook URL may carry its token);"
            " fix: a URL such as https://alerts.example.com/hook (on one line), or empty to keep the alerts in"
            " Alertmanager."
        ]
    parts = urlsplit(url)
    hostname = parts.hostname.strip("[]")
    try:
        address = ipaddress.ip_address(hostname.split("%")[0])
    except ValueError:
        address = None
    if address is not None and address.is_link_local:
        return [
            f"{name}: names a link-local address, where cloud instances serve their metadata (and credentials), not a"
            " receiver; fix: the receiver's own address or name."
        ]
    loopback = hostname.lower() == "localhost" or (address is not None and address.is_loopback)
    if parts.scheme == "http" and not loopback and allow_http is not True:
        return [
            f"{name}: is an http:// URL to another host: every alert, and the URL's token, would cross the network in"
            " clear text; fix: https, or set monitoring_alert_webhook_allow_http: true for a receiver on a network"
            " you trust."
        ]
    return []


def monitoring(host, v, monitoring_host=True, loadbalancer=False):
    """The monitoring role's inputs Prometheus, Alertmanager, systemd and nftables read as written: durations,
    sizes, the webhook URL, ports (in range, and not shared by two listeners of one host), thresholds and the UI's
    allowed networks. Checks what v holds: on a fleet host the exporters' knobs (monitoring_host=False: no
    Prometheus or Alertmanager there), on a monitoring host every knob. loadbalancer: the host runs HAProxy (its
    exporter's port and loadbalancer_port are taken there)."""
    # The instance firewall, the exporters' table and HAProxy's exporter ACL admit these on every watched host.
    problems = networks(host, "monitoring_sources", v)
    if monitoring_host:
        for name, zero_ok in MONITORING_DURATIONS.items():
            value = v.get(name)
            if value is None:
                continue
            millis = _prometheus_duration(value)
            if millis is None or (millis == 0 and not zero_ok):
                above = "" if zero_ok else " above 0"
                problems.append(
                    f"{host}: {name}: is {value!r}, not a Prometheus duration{above}; fix: whole numbers with units"
                    " y, w, d, h, m, s, ms from the largest to the smallest, such as 15s, 5m, 1h30m or 15d."
                )
        size = v.get("monitoring_prometheus_retention_size")
        if size is not None and not (str(size) in ("0", "auto") or PROMETHEUS_SIZE.match(str(size))):
            problems.append(
                f"{host}: monitoring_prometheus_retention_size: is {size!r}, not a size Prometheus reads; fix: auto"
                f" ({AUTO_RETENTION_SHARE:.0%} of the storage's file system), 0 (no size limit) or a whole number with"
                " a unit B, KB, MB, GB, TB, PB or EB, such as 10GB or 512MB."
            )
        allow_http = v.get("monitoring_alert_webhook_allow_http")
        problems += webhook(host, v.get("monitoring_alert_webhook_url"), allow_http)
        problems += webhook(host, v.get("monitoring_alert_watchdog_url"), allow_http, "monitoring_alert_watchdog_url")
        for name, wanted in MONITORING_THRESHOLDS.items():
            value = v.get(name)
            if value is None:
                continue
            number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
            if number is None or not math.isfinite(number) or number <= 0:
                problems.append(f"{host}: {name}: is {value!r}, not a positive number; fix: set it to {wanted}.")
        warning, critical = v.get("monitoring_certificate_warning_days"), v.get("monitoring_certificate_critical_days")
        if isinstance(warning, int) and isinstance(critical, int) and critical >= warning:
            problems.append(
                f"{host}: monitoring_certificate_critical_days: is {critical}, not below"
                f" monitoring_certificate_warning_days ({warning}): the warning would never fire before the critical"
                " alert; fix: fewer critical days than warning days, such as 3 and 21."
            )
        problems += networks(host, "monitoring_ui_allow", v)
        listen = v.get("monitoring_prometheus_listen_address")
        if isinstance(listen, str) and listen and not (_is_address(listen) or HOST_NAME.match(listen)):
            problems.append(
                f"{host}: monitoring_prometheus_listen_address: {listen!r} is no address Prometheus can listen on;"
                " fix: 0.0.0.0 or :: (every address), or one IPv4 or IPv6 address (without brackets) or host name."
            )
    span = v.get("monitoring_state_interval")
    if span is not None:
        seconds = _systemd_span(span)
        if seconds is None or seconds <= 0:
            problems.append(
                f"{host}: monitoring_state_interval: is {span!r}, not a systemd time span above 0; fix: a number and"
                " a unit (s, min, h; us, ms, d, w), such as 30s, 1min or 2min 30s."
            )
    problems += _monitoring_ports(host, v, monitoring_host, loadbalancer)
    return problems


def _monitoring_ports(host, v, monitoring_host, loadbalancer):
    """The listeners' ports of this host in 1-65535, none shared by two of them."""
    names = ["monitoring_node_exporter_port"]
    if loadbalancer:
        names += ["monitoring_haproxy_exporter_port", "loadbalancer_port"]
    if monitoring_host:
        names += ["monitoring_prometheus_port", "monitoring_alertmanager_port"]
    problems, seen = [], {}
    for name in names:
        port = v.get(name)
        if not isinstance(port, int) or isinstance(port, bool):
            continue
        if not 1 <= port <= 65535:
            problems.append(f"{host}: {name}: is {port}, outside 1-65535; fix: set it to a free port in that range.")
        elif port in seen and name != "loadbalancer_port":
            problems.append(
                f"{host}: {name}: is {port}, the port of {seen[port]} on this host too; fix: give each of them"
                " a port of its own."
            )
        elif port in seen:
            problems.append(
                f"{host}: {seen[port]}: is {port}, the load balancer's port (loadbalancer_port) on this host; fix:"
                f" move {seen[port]}."
            )
        else:
            seen[port] = name
    return problems


# The monitoring role installs Debian's prometheus, prometheus-alertmanager and prometheus-node-exporter (apt).
MONITORING_OS_FAMILIES = ("Debian",)


def monitoring_hosts(host, group, watchers):
    """One monitoring host: each host of the group would run a stack of its own (its own Prometheus and
    Alertmanager, not clustered), so every alert would be sent once per host, a silence made on one would not hold
    on the other, and the report reads the first host only. Said on each host of the group."""
    if len(watchers) < 2 or host not in watchers:
        return []
    return [
        f"{host}: monitoring_group: {group!r} holds {len(watchers)} hosts ({', '.join(watchers)}), and the monitoring"
        " role runs one unclustered stack per host: every alert would reach the receiver once per host, a silence"
        " made on one would not hold on the others, and the fleet report reads the first only; fix: keep one host"
        f" in group {group!r} (a second one as a cold standby outside it, converged when it takes over)."
    ]


def monitoring_platform(host, facts, monitoring_host):
    """A host the monitoring role would change (exporters on every fleet host, Prometheus on a monitoring host) must be
    of a family whose packages the role installs; an empty os_family (facts not read) is not judged."""
    family = facts.get("os_family")
    if not family or family in MONITORING_OS_FAMILIES:
        return []
    what = "Prometheus and Alertmanager" if monitoring_host else "the node exporter"
    return [
        f"{host}: monitoring_group: the role monitoring installs {what} from Debian's packages and this host is"
        f" {family}; fix: keep monitoring hosts on Debian or Ubuntu, and leave the monitoring group empty while the"
        " fleet has hosts of another family (their exporters are not supported yet)."
    ]
