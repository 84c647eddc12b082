"""A TCP relay on 127.0.0.1 in front of a real server, which a test can cut and restore.

Cut: every relayed connection is closed and the port refuses new ones, as when the network
to a database host goes away; the server behind it keeps running. Restore: the same port
relays again.
"""

import socket
import threading

from tests.utils.servers import free_port

__all__ = ["TcpRelay"]


class TcpRelay:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []  # both ends of every relayed connection
        self._listener: socket.socket | None = None
        self._accepting: threading.Thread | None = None

    def start(self) -> "TcpRelay":
        listener = socket.create_server(("127.0.0.1", self.port))  # SO_REUSEADDR: restartable
        listener.settimeout(0.1)  # the accept loop looks at its stop flag this often
        self._listener = listener
        self._accepting = threading.Thread(target=self._accept, args=(listener,), daemon=True)
        self._accepting.start()
        return self

    def cut(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        if self._accepting is not None:
            self._accepting.join(timeout=5)
        with self._lock:
            ends, self._open = self._open, []
        for end in ends:
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            end.close()

    restore = start

    def _accept(self, listener: socket.socket) -> None:
        while self._listener is listener:
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed by cut()
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._open += [client, server]
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=_pump, args=(source, sink), daemon=True).start()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while chunk := source.recv(65536):
            sink.sendall(chunk)
    except OSError:
        pass
    finally:
        for end in (source, sink):
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
