"""etcd and Patroni with two PostgreSQL nodes on this machine: a primary and a synchronous standby.

Debian's ``etcd-server`` and ``patroni`` packages (``apt-get install -y patroni etcd-server``) and
PostgreSQL's server binaries. One etcd member (its own client and peer ports, its own data folder) holds
the leader key; each Patroni node has its own REST API port, PostgreSQL port and data folder under
``folder``, and runs as the ``postgres`` user when started by root (PostgreSQL refuses root). The cluster
runs with ``synchronous_mode: true``: a commit returns once the standby has it, so the standby Patroni
promotes holds every transaction a client saw committed. :meth:`Patroni.kill` is a kill -9 of one node
(Patroni and its PostgreSQL); started again, it rejoins as the new primary's standby (pg_rewind when it
has to).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from benchmarks.rabbitmq_cluster import free_port

#: PostgreSQL's tools refuse to run as root: under root Patroni runs as this system user.
SERVER_USER = "postgres"


def pg_bin() -> Path | None:
    """The folder of PostgreSQL's server binaries, or None when they are not installed."""
    initdb = shutil.which("initdb")
    if initdb:
        return Path(os.path.realpath(initdb)).parent
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    return found[-1].parent if found else None


def installed() -> str | None:
    """Why the cluster cannot start here (a tool missing), or None."""
    for tool in ("etcd", "patroni"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install -y patroni etcd-server)"
    bin_dir = pg_bin()
    if bin_dir is None or not (bin_dir / "pg_rewind").exists():
        return "PostgreSQL's server binaries are not installed"
    return None


class Patroni:
    def __init__(self, folder: Path, size: int = 2, scope: str = "followups-chaos") -> None:
        self.folder = folder
        self.scope = scope
        self.user = SERVER_USER if os.geteuid() == 0 else None
        folder.mkdir(parents=True, exist_ok=True)
        if self.user:
            shutil.chown(folder, self.user)
        self.etcd_port, self.etcd_peer_port = free_port(), free_port()
        self.names = [f"pg{i}" for i in range(size)]
        self.ports = [free_port() for _ in range(size)]
        self.api_ports = [free_port() for _ in range(size)]
        self.etcd: subprocess.Popen[bytes] | None = None
        self.processes: list[subprocess.Popen[bytes] | None] = [None] * size

    @property
    def url(self) -> str:
        """Every node, as a multi-host ``DATABASE_URL`` that follows the primary."""
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.ports)
        return f"postgresql://postgres@{hosts}/postgres?target_session_attrs=read-write&connect_timeout=3"

    def node_url(self, index: int) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.ports[index]}/postgres?connect_timeout=3"

    def _config(self, index: int) -> Path:
        bin_dir = pg_bin()
        assert bin_dir
        node = self.folder / self.names[index]
        config = {
            "scope": self.scope,
            "name": self.names[index],
            "log": {"level": "WARNING"},
            "restapi": {
                "listen": f"127.0.0.1:{self.api_ports[index]}",
                "connect_address": f"127.0.0.1:{self.api_ports[index]}",
            },
            "etcd3": {"hosts": [f"127.0.0.1:{self.etcd_port}"]},
            "bootstrap": {
                "dcs": {
                    "ttl": 10,
                    "loop_wait": 1,
                    "retry_timeout": 4,
                    "maximum_lag_on_failover": 1048576,
                    "synchronous_mode": True,
                    "postgresql": {
                        "use_pg_rewind": True,
                        "parameters": {"wal_log_hints": "on", "max_connections": 300, "fsync": "off"},
                    },
                },
                "initdb": [{"auth": "trust"}, {"encoding": "UTF8"}],
                "pg_hba": ["local all all trust", "host all all 127.0.0.1/32 trust"],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{self.ports[index]}",
                "connect_address": f"127.0.0.1:{self.ports[index]}",
                "data_dir": str(node / "data"),
                "bin_dir": str(bin_dir),
                "pgpass": str(node / "pgpass"),
                "authentication": {
                    "superuser": {"username": "postgres"},
                    "replication": {"username": "postgres"},
                    "rewind": {"username": "postgres"},
                },
                "parameters": {"unix_socket_directories": str(node)},
                "pg_hba": [
                    "local all all trust",
                    "host all all 127.0.0.1/32 trust",
                    "host replication all 127.0.0.1/32 trust",
                ],
            },
        }
        node.mkdir(exist_ok=True)
        path = node / "patroni.yml"
        path.write_text(json.dumps(config))  # JSON is YAML
        if self.user:
            shutil.chown(node, self.user)
            shutil.chown(path, self.user)
        return path

    def start(self) -> None:
        etcd_data = self.folder / "etcd"
        with open(self.folder / "etcd.out", "ab") as out:
            self.etcd = subprocess.Popen(
                [
                    "etcd", "--name", "chaos", "--data-dir", str(etcd_data),
                    "--listen-client-urls", f"http://127.0.0.1:{self.etcd_port}",
                    "--advertise-client-urls", f"http://127.0.0.1:{self.etcd_port}",
                    "--listen-peer-urls", f"http://127.0.0.1:{self.etcd_peer_port}",
                    "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.etcd_peer_port}",
                    "--initial-cluster", f"chaos=http://127.0.0.1:{self.etcd_peer_port}",
                ],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        self._await(lambda: self._http(f"http://127.0.0.1:{self.etcd_port}/health") is not None, "etcd")
        self.start_node(0)
        self._await(lambda: self.leader() == 0, "the first node leading", timeout=90)
        for index in range(1, len(self.names)):
            self.start_node(index)
        self._await(self.synchronous, "a synchronous standby", timeout=120)

    def start_node(self, index: int) -> None:
        config = self._config(index)
        with open(self.folder / f"{self.names[index]}.out", "ab") as out:
            self.processes[index] = subprocess.Popen(
                ["patroni", str(config)],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                user=self.user,
                cwd=self.folder,
            )

    def kill(self, index: int) -> None:
        """kill -9 of node ``index``: Patroni and its PostgreSQL (they share a process group; a postmaster
        killed while its children live on is not restarted by them)."""
        process = self.processes[index]
        assert process is not None
        pid_file = self.folder / self.names[index] / "data" / "postmaster.pid"
        postmaster = None
        if pid_file.exists():
            postmaster = int(pid_file.read_text().split()[0])
        os.killpg(process.pid, signal.SIGKILL)
        if postmaster is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(os.getpgid(postmaster), signal.SIGKILL)
        process.wait(10)
        self.processes[index] = None

    def _http(self, url: str) -> dict[str, object] | None:
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                loaded = json.loads(answer.read() or b"{}")
                return loaded if isinstance(loaded, dict) else {}
        except Exception:
            return None

    def cluster(self) -> list[dict[str, object]]:
        """The members as a live node's REST API lists them (role, state, lag)."""
        for port in self.api_ports:
            listed = self._http(f"http://127.0.0.1:{port}/cluster")
            if listed is not None:
                members = listed.get("members")
                return members if isinstance(members, list) else []
        return []

    def leader(self) -> int | None:
        for member in self.cluster():
            if member.get("role") == "leader" and member.get("state") == "running":
                return self.names.index(str(member["name"]))
        return None

    def synchronous(self) -> bool:
        """True when a leader runs and a standby is its synchronous standby, streaming."""
        members = self.cluster()
        roles = {str(m.get("role")) for m in members if m.get("state") in ("running", "streaming")}
        return "leader" in roles and "sync_standby" in roles

    def _await(self, predicate: object, what: str, timeout: float = 60) -> None:
        assert callable(predicate)
        deadline = time.monotonic() + timeout
        while not predicate():
            exited = [p.args for p in self.processes if p is not None and p.poll() is not None]
            if exited or time.monotonic() > deadline:
                raise RuntimeError(f"patroni: no {what} within {timeout}s (logs under {self.folder})")
            time.sleep(0.5)

    def close(self) -> None:
        for index, process in enumerate(self.processes):
            if process is not None:
                self.kill(index)
        if self.etcd is not None:
            with contextlib.suppress(ProcessLookupError):  # it may have failed to start, and been reaped
                os.killpg(self.etcd.pid, signal.SIGKILL)
            self.etcd.wait(10)
            self.etcd = None
