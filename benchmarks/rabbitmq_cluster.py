"""A RabbitMQ cluster of a few nodes on this machine, started by a test and gone after it.

Each node has its own name, AMQP and distribution ports and folders under a temporary directory
(``RABBITMQ_NODENAME``, ``RABBITMQ_NODE_PORT``, ``RABBITMQ_DIST_PORT``, ``RABBITMQ_MNESIA_BASE``,
``RABBITMQ_LOG_BASE``, ``RABBITMQ_CONFIG_FILE``, no plugins), and the cluster an epmd of its own
(``ERL_EPMD_PORT``) and an Erlang cookie of its own (in a ``HOME`` of its own): nothing of the machine's own
RabbitMQ (5672, its epmd on 4369, its cookie) is shared. The nodes join the first with ``rabbitmqctl
join_cluster``. :meth:`RabbitCluster.kill` is a kill -9 of one node (its whole process group).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

#: The server and CLI scripts: Debian's wrappers in /usr/sbin switch to the rabbitmq user and its
#: folders; these run as the caller, with the environment given.
_LIB_BIN = Path("/usr/lib/rabbitmq/bin")


def rabbitmq_server() -> str | None:
    """The ``rabbitmq-server`` script to run, or None when RabbitMQ is not installed."""
    if (_LIB_BIN / "rabbitmq-server").exists():
        return str(_LIB_BIN / "rabbitmq-server")
    return shutil.which("rabbitmq-server")


def _rabbitmqctl() -> str:
    if (_LIB_BIN / "rabbitmqctl").exists():
        return str(_LIB_BIN / "rabbitmqctl")
    found = shutil.which("rabbitmqctl")
    assert found, "rabbitmqctl not found beside rabbitmq-server"
    return found


#: The ports :func:`free_port` has handed out in this process. A topology picks all its ports before its
#: servers bind them (the chaos run: a RabbitMQ cluster's, then etcd's and Patroni's), so a port free at each
#: probe could otherwise be handed out twice (etcd once failed on a node's AMQP port).
_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A free TCP port from 20000 to 29999, never one this process was given before: below the kernel's
    ephemeral ports (32768 and up on Linux), so that no client connection is given it between this probe and
    the server's bind (a node's distribution port was once taken so, and the node did not start), and low
    enough that the CLI tools' own ports (the distribution port + 10000 and up) are never one of these."""
    while True:
        port = random.randint(20000, 29999)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port


class RabbitCluster:
    def __init__(self, folder: Path, size: int = 3) -> None:
        self.folder = folder
        self.host = socket.gethostname().split(".")[0]
        self.home = folder / "home"
        self.home.mkdir(parents=True)
        cookie = self.home / ".erlang.cookie"
        cookie.write_text(secrets.token_hex(16))
        cookie.chmod(0o400)
        (folder / "enabled_plugins").write_text("[].\n")
        (folder / "rabbitmq.conf").write_text("loopback_users = none\n")
        self.epmd_port = free_port()
        tag = f"fu{os.getpid()}"
        self.names = [f"{tag}n{i}@{self.host}" for i in range(size)]
        self.ports = [free_port() for _ in range(size)]
        self.dist_ports = [free_port() for _ in range(size)]
        self.processes: list[subprocess.Popen[bytes] | None] = [None] * size
        self.epmd: subprocess.Popen[bytes] | None = None

    @property
    def urls(self) -> list[str]:
        return [f"amqp://guest:guest@127.0.0.1:{port}/%2F" for port in self.ports]

    @property
    def amqp_url(self) -> str:
        """Every node, as ``AMQP_URL`` lists them."""
        return ",".join(self.urls)

    def _env(self) -> dict[str, str]:
        return os.environ | {"HOME": str(self.home), "ERL_EPMD_PORT": str(self.epmd_port)}

    def ctl(self, index: int, *args: str, timeout: float = 60) -> str:
        done = subprocess.run(
            [_rabbitmqctl(), "-n", self.names[index], *args],
            env=self._env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert done.returncode == 0, f"rabbitmqctl {' '.join(args)}: {done.stdout}{done.stderr}"
        return done.stdout

    def start_node(self, index: int) -> None:
        node = self.folder / f"node{index}"
        for sub in ("mnesia", "log"):
            (node / sub).mkdir(parents=True, exist_ok=True)
        server = rabbitmq_server()
        assert server
        env = self._env() | {
            "RABBITMQ_NODENAME": self.names[index],
            "RABBITMQ_NODE_PORT": str(self.ports[index]),
            "RABBITMQ_DIST_PORT": str(self.dist_ports[index]),
            "RABBITMQ_MNESIA_BASE": str(node / "mnesia"),
            "RABBITMQ_LOG_BASE": str(node / "log"),
            "RABBITMQ_PID_FILE": str(node / "pid"),
            "RABBITMQ_CONFIG_FILE": str(self.folder / "rabbitmq.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.folder / "enabled_plugins"),
        }
        with open(node / "out", "ab") as out:
            self.processes[index] = subprocess.Popen(
                [server], env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def await_node(self, index: int, timeout: float = 90) -> None:
        """Wait until node ``index`` runs (``await_startup`` fails at once while the node has not yet
        registered with epmd: it is asked again)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.ctl(index, "await_startup", "--timeout", "10", timeout=30)
                return
            except (AssertionError, subprocess.TimeoutExpired):  # a loaded machine: the CLI is slow too
                process = self.processes[index]
                if time.monotonic() > deadline or (process is not None and process.poll() is not None):
                    raise
                time.sleep(1)

    def start(self) -> None:
        """Start the cluster's epmd and every node, then join the others to the first."""
        epmd = shutil.which("epmd")
        assert epmd, "epmd not found beside rabbitmq-server"
        # in the foreground, a process of the test's (the one a node would start is a daemon)
        self.epmd = subprocess.Popen(
            [epmd, "-port", str(self.epmd_port)],
            env=self._env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for index in range(len(self.names)):
            self.start_node(index)
        for index in range(len(self.names)):
            self.await_node(index)
        for index in range(1, len(self.names)):
            self.ctl(index, "stop_app")
            self.ctl(index, "join_cluster", self.names[0])
            self.ctl(index, "start_app")

    def kill(self, index: int) -> None:
        """kill -9 of node ``index`` (and of what it started; the cluster's epmd is the test's own)."""
        process = self.processes[index]
        assert process is not None
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)
        self.processes[index] = None

    def queues(self, index: int) -> dict[str, dict[str, object]]:
        """The cluster's queues as node ``index`` sees them: name -> type, arguments, messages."""
        listed = json.loads(
            self.ctl(index, "list_queues", "name", "type", "arguments", "messages", "--formatter", "json")
        )
        for queue in listed:  # the CLI lists arguments as [name, type, value]
            queue["arguments"] = {name: value for name, _, value in queue["arguments"]}
        return {queue["name"]: queue for queue in listed}

    def close(self) -> None:
        """Kill every node still running (a node that failed to start is gone already), then the epmd."""
        try:
            for index, process in enumerate(self.processes):
                if process is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(process.pid, signal.SIGKILL)
                    process.wait(10)
                    self.processes[index] = None
        finally:
            if self.epmd is not None:
                self.epmd.kill()
                self.epmd.wait(10)
