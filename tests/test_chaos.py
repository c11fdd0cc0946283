"""The short chaos run (`make chaos`'s harness, :mod:`benchmarks.chaos`) as a test of ``make test``.

A 3-node RabbitMQ cluster with quorum queues, etcd and Patroni with a primary and a synchronous standby, and
replicas of every service, under a steady load through both API processes and the ingress queue, while a
RabbitMQ node, replicas and the PostgreSQL primary are killed in turn. It passes when the harness's checks
hold: every due step released exactly once, no follow-up after an acknowledged reply, every rule execution
and webhook delivery exactly once, every event published, no 5xx but a 503 with ``Retry-After``, and the
retention job running on the new primary.

Marked ``chaos``: ``make test`` runs it on its own after the rest of the suite (``make chaos-test``), so its
processes have the machine to themselves. Skipped locally when Patroni, etcd, PostgreSQL's server binaries
or RabbitMQ are not installed (``apt-get install -y patroni etcd-server``); a failure when ``CI`` is set.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from benchmarks.patroni import installed
from benchmarks.rabbitmq_cluster import rabbitmq_server

pytestmark = pytest.mark.chaos

#: The short run: three faults (a RabbitMQ node, replicas, the PostgreSQL primary) within a minute of load.
ARGS = ["--seconds", "60", "--fault-every", "10", "--rate", "2", "--drain", "180"]

#: Every count the run must end with at zero.
MUST_BE_ZERO = ("lost", "doubled", "after_reply", "executions_doubled", "api_5xx_other")


def _missing() -> str | None:
    return installed() or (None if rabbitmq_server() else "RabbitMQ is not installed")


@pytest.mark.timeout(1200)
def test_the_replicated_topology_keeps_every_guarantee_under_faults() -> None:
    missing = _missing()
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set and the chaos run cannot start: {missing}")
        pytest.skip(missing)

    # Given the replicated topology under load, When a RabbitMQ node, replicas and the primary are killed
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.chaos", *ARGS],
        capture_output=True,
        text=True,
        timeout=1100,
        check=False,
    )
    output = run.stdout + run.stderr
    lines = [line for line in run.stdout.splitlines() if line.startswith("chaos: ")]
    assert lines, f"no chaos line (exit {run.returncode}):\n{output[-6000:]}"

    # Then every check holds, after three faults that each healed
    figures = dict(re.findall(r"(\w+)=(\S+)", lines[-1]))
    print(lines[-1])
    assert run.returncode == 0, output[-6000:]
    assert {key: figures[key] for key in MUST_BE_ZERO} == dict.fromkeys(MUST_BE_ZERO, "0"), output[-6000:]
    assert int(figures["faults"]) >= 3, output[-6000:]
    assert int(figures["steps"]) > 0
