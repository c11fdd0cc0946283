"""A TCP proxy a test puts between a process and PostgreSQL or RabbitMQ, to fail the server on demand.

    proxy = TcpProxy(("127.0.0.1", 5432))    # listens on 127.0.0.1:<proxy.port>
    proxy = TcpProxy("/tmp/pg/.s.PGSQL.5432")  # or forwards to a unix socket (the embedded PostgreSQL)
    proxy.down()      # drop every connection and refuse new ones: the server is "stopped"
    proxy.up()        # accept and forward again on the same port: the server is "back"
    proxy.stall()     # keep connections open but forward nothing either way: a broker whose publishers
                      # are blocked (a RabbitMQ alarm), a server that accepts and never answers
    proxy.resume()    # forward again what was held back

:func:`proxied_postgres` puts one in front of a test's PostgreSQL. :func:`blackhole` is a listener that
accepts connections and never answers (nor reads).
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
from collections.abc import Iterator
from urllib.parse import quote

import psycopg


def _listener(port: int = 0) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(128)
    return sock


class TcpProxy:
    """Forwards 127.0.0.1:``port`` to ``target`` (host and port, or a unix socket's path) in one background
    thread (a selector loop)."""

    def __init__(self, target: tuple[str, int] | str) -> None:
        self._target = target
        self._lock = threading.Lock()
        self._server: socket.socket | None = _listener()
        self.port: int = self._server.getsockname()[1]
        self._pairs: dict[socket.socket, socket.socket] = {}
        self._stalled = False
        self._closed = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._thread = threading.Thread(target=self._run, name=f"tcp-proxy-{self.port}", daemon=True)
        self._thread.start()

    # -- control ------------------------------------------------------------------------------------------

    def down(self) -> None:
        """Close every forwarded connection and stop listening (new connections are refused)."""
        with self._lock:
            server, self._server = self._server, None
            pairs, self._pairs = self._pairs, {}
        self._wake()
        if server is not None:
            server.close()
        for sock in pairs:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def up(self) -> None:
        """Listen again on the same port."""
        with self._lock:
            if self._server is None:
                self._server = _listener(self.port)
        self._wake()

    def stall(self) -> None:
        """Forward nothing more (connections stay open; new ones are accepted and connected, then held)."""
        self._stalled = True
        self._wake()

    def resume(self) -> None:
        self._stalled = False
        self._wake()

    def close(self) -> None:
        self._closed = True
        self.down()
        self._thread.join(5)
        self._wake_r.close()
        self._wake_w.close()

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the loop -----------------------------------------------------------------------------------------

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def _run(self) -> None:
        while not self._closed:
            # down() closes sockets from the test's thread while this loop holds them: a socket closed
            # between the copy and its use raises (EBADF, or ValueError for fd -1); the next round
            # starts from the sockets still open
            with contextlib.suppress(OSError, ValueError):
                self._round()

    def _round(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self._wake_r, selectors.EVENT_READ)
            with self._lock:
                server = self._server
                pairs = dict(self._pairs)
            if server is not None:
                selector.register(server, selectors.EVENT_READ)
            if not self._stalled:
                for held in pairs:
                    selector.register(held, selectors.EVENT_READ)
            for key, _ in selector.select(timeout=0.5):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if sock is self._wake_r:
                    with contextlib.suppress(OSError):
                        self._wake_r.recv(4096)
                elif sock is server:
                    self._accept(server)
                else:
                    self._forward(sock)

    def _accept(self, server: socket.socket) -> None:
        try:
            client, _ = server.accept()
        except OSError:
            return
        try:
            if isinstance(self._target, str):
                upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                upstream.connect(self._target)
            else:
                upstream = socket.create_connection(self._target, timeout=5)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        # Nagle's algorithm off: a small write (a publisher confirm, a query) is forwarded at once instead
        # of waiting for a delayed ACK (~40 ms a round trip)
        for sock in (client, upstream):
            with contextlib.suppress(OSError):  # a unix socket has no TCP options
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            self._pairs[client] = upstream
            self._pairs[upstream] = client

    def _forward(self, sock: socket.socket) -> None:
        with self._lock:
            peer = self._pairs.get(sock)
        if peer is None:
            return
        try:
            data = sock.recv(65536)
            if data:
                peer.sendall(data)
                return
        except OSError:
            pass
        with self._lock:
            self._pairs.pop(sock, None)
            self._pairs.pop(peer, None)
        sock.close()
        peer.close()


def proxied_postgres(url: str) -> tuple[TcpProxy, str]:
    """A proxy in front of the PostgreSQL server ``url`` points at, and ``url`` through it.

    The server's address is asked of libpq (a unix socket's folder, or a host) rather than parsed from
    the URL, so it works for the embedded server's ``?host=/tmp/...`` URL and for DATABASE_URL alike."""
    with psycopg.connect(url) as conn:
        info = conn.info
        host, port, user, password, dbname = info.host, info.port, info.user, info.password, info.dbname
    target: tuple[str, int] | str = f"{host}/.s.PGSQL.{port}" if host.startswith("/") else (host, port)
    proxy = TcpProxy(target)
    auth = f"{quote(user, safe='')}:{quote(password or '', safe='')}"
    return proxy, f"postgresql://{auth}@127.0.0.1:{proxy.port}/{quote(dbname, safe='')}"


@contextlib.contextmanager
def blackhole() -> Iterator[int]:
    """A port on 127.0.0.1 that accepts connections and never answers: the port, while the block runs."""
    server = _listener()
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            held.append(conn)

    thread = threading.Thread(target=accept, name="blackhole", daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        server.close()
        for conn in held:
            conn.close()
