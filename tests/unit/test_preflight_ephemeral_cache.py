"""A job of AWX / Automation Platform whose controller cache is removed with the job is warned about once per run."""

import pytest
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.preflight.common import ephemeral_cache_warning

JOB = {"awx_job_id": 42}


@pytest.mark.parametrize(
    ("cache", "cwd", "where"),
    [
        ("/runner/project/.cache", "/runner/project", "/runner/project"),  # the default in an execution environment
        (".cache", "/runner/project", "/runner/project"),  # relative: where ansible-playbook runs
        ("/runner/artifacts/cache", "/tmp/job", "/runner"),  # ansible-runner's private data directory
        ("/tmp/awx_42_x/project/.cache", "/tmp/awx_42_x/project", "/tmp/awx_42_x/project"),  # a job outside an EE
        ("/runner", "/runner/project", "/runner"),
    ],
)
def test_a_job_with_its_cache_inside_what_it_removes_is_warned(cache, cwd, where):
    warning = ephemeral_cache_warning(cache, JOB, cwd)
    assert warning and warning.startswith("vllm_fleet_controller_cache: ")
    assert f"is inside {where}, which job 42 removes" in warning
    assert "fix: set vllm_fleet_controller_cache to a persistent directory" in warning


@pytest.mark.parametrize(
    ("cache", "cwd", "job"),
    [
        ("/var/lib/vllm-fleet/cache", "/runner/project", JOB),  # a mounted persistent path
        ("/runnerx/cache", "/runner/project", JOB),  # only the directory itself and below, not a shared prefix
        ("/home/op/fleet/.cache", "/home/op/fleet", {}),  # ansible-playbook from a checkout: no job
        ("/home/op/fleet/.cache", "/home/op/fleet", {"awx_job_id": ""}),
        (None, "/runner/project", JOB),  # does not render: each host's checks say so
        ("", "/runner/project", JOB),
    ],
)
def test_no_warning_outside_a_job_or_with_a_persistent_cache(cache, cwd, job):
    assert ephemeral_cache_warning(cache, job, cwd) is None


def test_the_older_job_variable_counts_too():
    assert "job 7 removes" in ephemeral_cache_warning(".cache", {"tower_job_id": 7}, "/runner/project")
