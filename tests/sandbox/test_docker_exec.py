"""The host side of a Docker exec stream, against a scripted daemon on a unix socket.

No Docker needed: a thread answers ``POST /exec/<id>/start`` the way dockerd
does (``101 UPGRADED``, then the multiplexed stream), and the real docker SDK
talks to it. What is checked: output that arrives in the same read as the
response headers is not lost, and the socket lives as long as the stream.
"""

from __future__ import annotations

import gc
import socket
import threading

import pytest

from sao_gym.sandbox._docker_exec import StreamPump, hijacked

docker = pytest.importorskip("docker")

HEADERS = (b"HTTP/1.1 101 UPGRADED\r\nContent-Type: application/vnd.docker.raw-stream\r\n"
           b"Connection: Upgrade\r\nUpgrade: tcp\r\n\r\n")


def frame(stream: int, data: bytes) -> bytes:
    return bytes([stream, 0, 0, 0]) + len(data).to_bytes(4, "big") + data


class ScriptedDaemon:
    """Answers one exec start per connection with ``HEADERS + body`` in one write."""

    def __init__(self, path: str, body: bytes, then: bytes = b""):
        self.path, self.body, self.then = path, body, then
        self.more = threading.Event()  # set: send ``then`` and close
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(path)
        self.server.listen(4)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.server.accept()
        with conn:
            request = b""
            while b"\r\n\r\n" not in request:
                request += conn.recv(4096)
            head, _, rest = request.partition(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            while len(rest) < length:
                rest += conn.recv(4096)
            assert head.startswith(b"POST /v1.41/exec/abc/start "), head
            conn.sendall(HEADERS + self.body)
            self.more.wait(10)
            try:
                conn.sendall(self.then)
            except OSError:  # the client closed first
                pass

    def close(self) -> None:
        self.more.set()
        self.thread.join(10)
        self.server.close()


@pytest.fixture
def daemon_at(tmp_path):
    made = []

    def start(body: bytes, then: bytes = b"") -> tuple[ScriptedDaemon, docker.APIClient]:
        daemon = ScriptedDaemon(str(tmp_path / f"d{len(made)}.sock"), body, then)
        made.append(daemon)
        return daemon, docker.APIClient(base_url=f"unix://{daemon.path}", version="1.41")

    yield start
    for daemon in made:
        daemon.close()


def pump_all(sock: socket.socket, early: bytes) -> StreamPump:
    pump = StreamPump(sock, None, None, early)
    for _ in range(100):
        if pump.eof:
            break
        pump.step(0.1)
    return pump


def test_output_that_arrives_with_the_headers_is_kept(daemon_at):
    body = frame(1, b"42\n") + frame(2, b"warn\n")
    daemon, api = daemon_at(body, then=frame(1, b"more\n"))
    stream = api.exec_start("abc", socket=True)
    sock, early = hijacked(stream)
    assert early == body  # the HTTP client had buffered all of it past the headers
    daemon.more.set()
    pump = pump_all(sock, early)
    assert pump.eof
    assert bytes(pump.out[1]) == b"42\nmore\n" and bytes(pump.out[2]) == b"warn\n"
    sock.close()
    stream.close()


def test_a_frame_split_between_buffer_and_socket_is_joined(daemon_at):
    whole = frame(1, b"x" * 100)
    daemon, api = daemon_at(whole[:30], then=whole[30:])
    stream = api.exec_start("abc", socket=True)
    sock, early = hijacked(stream)
    assert early == whole[:30]
    daemon.more.set()
    assert bytes(pump_all(sock, early).out[1]) == b"x" * 100
    sock.close()
    stream.close()


def test_nothing_buffered_is_an_empty_start(daemon_at):
    daemon, api = daemon_at(b"", then=frame(1, b"late\n"))
    stream = api.exec_start("abc", socket=True)
    sock, early = hijacked(stream)
    assert early == b""
    assert not sock.getblocking()
    daemon.more.set()
    assert bytes(pump_all(sock, early).out[1]) == b"late\n"
    sock.close()
    stream.close()


def test_the_socket_is_the_http_response_s(daemon_at):
    """Why DockerSandbox holds the stream until the command ends: the socket
    closes with the HTTP response the stream refers to (when that response is
    collected, too), which would pull it from under the pump."""
    daemon, api = daemon_at(b"")
    stream = api.exec_start("abc", socket=True)
    sock, _ = hijacked(stream)
    gc.collect()
    assert sock.fileno() != -1
    stream._response.raw.close()
    assert sock.fileno() == -1
    stream.close()
