"""Every file the loadbalancer role's delegated entry points write on a load balancer is written one host at a time.

The rollout runs backend_endpoints.yml, backend_retire.yml and backend_state.yml for every host of a batch at
once, delegated to the same load balancers (issue 41, item 1): a task that rewrites a shared file there (haproxy.cfg,
the instances' CA) from several hosts in parallel keeps only the last writer's view. The behaviour itself is
tests/integration/test_lb_batch_edits.py; this keeps a new writing task from coming without `throttle: 1`.
"""

import pytest
import yaml
from conftest import REPO

TASKS = REPO / "roles" / "loadbalancer" / "tasks"
# Entry points the rollout delegates per host, and what they include.
DELEGATED = ["backend_ca.yml", "backend_endpoints.yml", "backend_retire.yml", "backend_state.yml"]
WRITERS = {"replace", "copy", "template", "lineinfile", "blockinfile", "file", "assemble", "unarchive"}


def tasks_of(items):
    for task in items or []:
        yield task
        for key in ("block", "rescue", "always"):
            yield from tasks_of(task.get(key))


def module_of(task):
    """The file-writing module a task calls (ansible.builtin.<name> or the short name), or None."""
    return next((key for key in task if key.removeprefix("ansible.builtin.") in WRITERS), None)


@pytest.mark.parametrize("name", DELEGATED)
def test_each_file_write_of_a_delegated_entry_point_is_throttled_to_one_host(name):
    tasks = list(tasks_of(yaml.safe_load((TASKS / name).read_text())))
    writers = [task for task in tasks if module_of(task)]
    assert all(task.get("throttle") == 1 for task in writers), [
        task["name"] for task in writers if task.get("throttle") != 1
    ]
    if name != "backend_state.yml":  # backend_state only talks to the admin socket
        assert writers, f"{name}: no file write found; update this test"


def test_the_rollout_writes_nothing_on_a_load_balancer_itself():
    """roles/rollout reaches the load balancers only through the loadbalancer role's entry points (and a ping)."""
    for path in sorted((REPO / "roles" / "rollout" / "tasks").glob("*.yml")):
        for task in tasks_of(yaml.safe_load(path.read_text())):
            if "delegate_to" in task:
                assert module_of(task) is None, (path.name, task["name"])
