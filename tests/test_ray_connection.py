"""easgd.ray_connection: where a Ray is, and Ray's pages about a lost process in the
project's words. (The address's refusals are tests/test_executor.py's and
tests/train/runtimes/test_ray.py's, through the flags and fields that give it.)"""

import contextlib
import socket
import threading

import pytest
from ray._private import worker

from easgd import ray_connection
from easgd.errors import ConfigError

DIED = "A worker died or was killed while executing a task by an unexpected system error."
RETRY = "Task _task failed. There are 2 retries remaining, so the task will be retried."
OTHER = "Some other message of Ray's"


def _raylet(text: str) -> None:
  worker.print_to_stdstream({"lines": [text], "pid": "raylet", "is_err": False}, False)


def test_a_lost_process_page_is_left_out_and_a_retry_handed_over_while_inside(capsys):
  retries = []
  with ray_connection.lost_processes_in_our_words(retries.append):
    for text in (DIED, RETRY, OTHER):
      _raylet(text)
  assert retries == [2]
  printed = capsys.readouterr().out
  assert OTHER in printed and DIED not in printed and RETRY not in printed
  with ray_connection.lost_processes_in_our_words():  # a run of actors: no retries to say
    _raylet(RETRY)
  assert capsys.readouterr().out == ""
  _raylet(DIED)
  assert DIED in capsys.readouterr().out  # Ray's own printer again, outside


def test_the_address_comes_from_the_setting_else_ray_address(monkeypatch):
  monkeypatch.delenv("RAY_ADDRESS", raising=False)
  assert ray_connection.resolve("", "--flag") == ("", "--flag")
  monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
  assert ray_connection.resolve("", "--flag") == ("10.0.0.1:6379", "RAY_ADDRESS")
  assert ray_connection.resolve("auto", "--flag") == ("auto", "--flag")
  ray_connection.check("auto", "--flag")  # nothing to reach before Ray looks
  with pytest.raises(ConfigError, match=r"^--flag='host:' is not HOST:PORT"):
    ray_connection.check("host:", "--flag")


CLOSES = b"closes"  # the server closes the connection without a word


@pytest.mark.parametrize("answer", [None, CLOSES, b"HTTP/1.1 400 Bad Request\r\n\r\n"])
def test_a_port_that_accepts_but_is_not_a_ray_head_is_refused_at_once(monkeypatch, answer):
  """ray.init would retry such an address for minutes: a port that says nothing
  (None), closes at once, or answers but not as gRPC (an HTTP/1 server), is refused
  in one line."""
  monkeypatch.setattr(ray_connection, "CONNECT_TIMEOUT", 0.5)
  with socket.create_server(("127.0.0.1", 0)) as server:
    address = f"127.0.0.1:{server.getsockname()[1]}"

    def serve():
      connection, _ = server.accept()
      with connection:
        connection.recv(len(ray_connection.HTTP2_PREFACE))
        if answer == CLOSES:
          return
        if answer is not None:
          connection.sendall(answer)
        with contextlib.suppress(ConnectionResetError):  # it may close with our answer unread
          connection.recv(1)  # until the checker closes its end

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    with pytest.raises(ConfigError, match="accepts connections but does not answer as a Ray head"):
      ray_connection.check(address, "--flag")
    thread.join()


def test_under_tls_a_port_that_accepts_is_left_to_rays_own_check(monkeypatch):
  """A TLS port answers a plain HTTP/2 preface with nothing: under RAY_USE_TLS the
  check stops at the connection, and ray.init's own handshake says the rest."""
  monkeypatch.setenv("RAY_USE_TLS", "1")
  with socket.create_server(("127.0.0.1", 0)) as server:
    ray_connection.check(f"127.0.0.1:{server.getsockname()[1]}", "--flag")
