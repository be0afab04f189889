"""Thin Jinja2 filters over the live fleet report (plugin_utils/vllm_fleet_report.py)."""

from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_fleet_report import (
    build_report,
    prometheus_queries,
    render_html,
    render_markdown,
)


def vllm_fleet_report(hosts, hostvars, loadbalancers=None, monitoring=None, options=None):
    """The report as one dict: a row per host and instance from the plan, the host's live state, the load
    balancers' views and the figures playbooks/report.yml registered on each host."""
    return build_report(hosts, hostvars, loadbalancers or [], monitoring or [], options or {})


def vllm_fleet_report_queries(window="2m"):
    """{figure: PromQL instant query} the report asks Prometheus, per host and vllm_instance."""
    return prometheus_queries(window)


def vllm_fleet_report_markdown(report):
    """The report as Markdown."""
    return render_markdown(report)


def vllm_fleet_report_html(report):
    """The report as one self-contained HTML page with inline SVG charts (no script)."""
    return render_html(report)


class FilterModule:
    def filters(self):
        return {
            "vllm_fleet_report": vllm_fleet_report,
            "vllm_fleet_report_queries": vllm_fleet_report_queries,
            "vllm_fleet_report_markdown": vllm_fleet_report_markdown,
            "vllm_fleet_report_html": vllm_fleet_report_html,
        }
