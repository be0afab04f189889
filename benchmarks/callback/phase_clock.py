"""Callback for benchmarks/rollout_speed.py: the start of every play (one per rollout batch) and task, and the
end of every task on each host, as JSON lines in $PHASE_CLOCK_FILE (monotonic clock)."""

import json
import os
import time

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: phase_clock
type: aggregate
short_description: Writes when each play and task started and each host's task ended, for a benchmark
description: A JSON line per event in the file $PHASE_CLOCK_FILE.
requirements: [enabled in ANSIBLE_CALLBACKS_ENABLED]
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "phase_clock"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self._out = open(os.environ["PHASE_CLOCK_FILE"], "a")  # noqa: SIM115 - open for the whole run

    def _write(self, **event):
        self._out.write(json.dumps({"t": time.monotonic(), **event}) + "\n")
        self._out.flush()

    def v2_playbook_on_play_start(self, play):
        self._write(event="play", name=play.get_name())

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._write(event="task", name=task.get_name())

    def _ended(self, result, status):
        self._write(event="end", host=result._host.get_name(), name=result._task.get_name(), status=status)

    def v2_runner_on_ok(self, result):
        self._ended(result, "ok")

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._ended(result, "failed")

    def v2_runner_on_skipped(self, result):
        self._ended(result, "skipped")

    def v2_runner_on_unreachable(self, result):
        self._ended(result, "unreachable")
