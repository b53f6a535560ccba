"""Sluice's gRPC-over-ASGI edge (sluice.edge) under pyvoy, with a test service of its own
(tests/support/edge_echo_app.py) called by real grpcio clients: metadata, trailers, errors,
deadlines, compression, message sizes and every kind of stream."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests.support.processes import free_port, wait_until

ROOT = Path(__file__).parents[2]


def _answers(target: str) -> bool:
    try:
        with grpc.insecure_channel(target) as channel:
            channel.unary_unary("/test.Echo/Unary")(b"", timeout=0.5)
        return True
    except grpc.RpcError:
        return False


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = tmp_path_factory.mktemp("edge") / "pyvoy.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [
                # pyvoy's command line, after envoy_path() (see there: the envoy package).
                sys.executable,
                "-c",
                "from sluice.pyvoy_launcher import envoy_path; envoy_path(); "
                "from pyvoy._cli import main; main()",
                "tests.support.edge_echo_app:app",
                "--port",
                str(port),
                "--lifespan",
            ],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        address = f"127.0.0.1:{port}"
        try:
            wait_until(lambda: process.poll() is not None or _answers(address), 30, "pyvoy")
            assert process.poll() is None, log.read_text()
            yield address
        finally:
            process.terminate()
            process.wait(10)
    text = log.read_text()
    # The one expected traceback is the handler's own bug, logged by the edge.
    assert text.count("Traceback") == text.count("RuntimeError: a bug"), text


@pytest.fixture(scope="module")
def channel(target: str) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(target) as ch:
        yield ch


def test_request_metadata_reaches_the_handler_and_comes_back_as_trailers(
    channel: grpc.Channel,
) -> None:
    call = channel.unary_unary("/test.Echo/Unary")
    response, info = call.with_call(
        b"hello",
        metadata=[("x-user", "alice"), ("x-raw-bin", b"\x00\xff\x01"), ("other", "no")],
        timeout=5,
    )
    assert response == b"hello"
    trailers = dict(info.trailing_metadata())
    assert trailers == {"x-user": "alice", "x-raw-bin": b"\x00\xff\x01"}
    assert dict(info.initial_metadata())["x-initial"] == "yes"


def test_gzip_compressed_requests_are_accepted(channel: grpc.Channel) -> None:
    call = channel.unary_unary("/test.Echo/Unary")
    data = b"compress me " * 1000
    assert call(data, compression=grpc.Compression.Gzip, timeout=5) == data


def test_unknown_methods_and_services_are_unimplemented(channel: grpc.Channel) -> None:
    for path in ("/test.Echo/Nope", "/test.Nope/Unary", "/nothing"):
        with pytest.raises(grpc.RpcError) as info:
            channel.unary_unary(path)(b"", timeout=5)
        assert info.value.code() is grpc.StatusCode.UNIMPLEMENTED, path


def test_a_message_over_the_maximum_is_resource_exhausted(channel: grpc.Channel) -> None:
    call = channel.unary_unary("/test.Echo/Unary")
    with pytest.raises(grpc.RpcError) as info:
        call(b"x" * (1024 * 1024 + 1), timeout=5)
    assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert call(b"x" * (1024 * 1024), timeout=5) == b"x" * (1024 * 1024)  # the maximum itself


def test_a_gzip_message_inflating_past_the_maximum_is_resource_exhausted(
    channel: grpc.Channel,
) -> None:
    call = channel.unary_unary("/test.Echo/Unary")
    with pytest.raises(grpc.RpcError) as info:
        call(b"\0" * (2 * 1024 * 1024), compression=grpc.Compression.Gzip, timeout=5)
    assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED


def test_errors_carry_status_percent_encoded_message_and_trailers(channel: grpc.Channel) -> None:
    call = channel.unary_unary("/test.Echo/Fail")
    with pytest.raises(grpc.RpcError) as info:
        call(b"status", timeout=5)
    assert info.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert info.value.details() == "100% wrong: ünïcode"
    assert ("x-why", "test") in info.value.trailing_metadata()
    with pytest.raises(grpc.RpcError) as info:
        call(b"bug", timeout=5)
    assert info.value.code() is grpc.StatusCode.UNKNOWN


def stats(channel: grpc.Channel) -> dict[str, int]:
    return json.loads(channel.unary_unary("/test.Echo/Stats")(b"", timeout=5))


def test_a_call_past_its_deadline_is_cancelled_not_finished(channel: grpc.Channel) -> None:
    before = stats(channel)
    with pytest.raises(grpc.RpcError) as info:
        channel.unary_unary("/test.Echo/Slow")(b"2", timeout=0.2)
    assert info.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    wait_until(
        lambda: stats(channel)["slow_cancelled"] == before["slow_cancelled"] + 1,
        5,
        "the server to cancel the call",
    )
    after = stats(channel)
    assert after["slow_started"] == before["slow_started"] + 1
    assert after["slow_finished"] == before["slow_finished"]


def test_server_streaming(channel: grpc.Channel) -> None:
    responses = list(channel.unary_stream("/test.Echo/CountTo")(b"50", timeout=5))
    assert responses == [str(i).encode() for i in range(50)]
    assert list(channel.unary_stream("/test.Echo/CountTo")(b"0", timeout=5)) == []


def test_client_streaming(channel: grpc.Channel) -> None:
    total = channel.stream_unary("/test.Echo/Total")
    assert total(iter([b"1", b"2", b"39"]), timeout=5) == b"42"


def test_bidirectional_stream_answers_each_message_as_it_comes(channel: grpc.Channel) -> None:
    # The next request is only sent once the previous answer is back: the edge must hand
    # each message over as it arrives, not at the end of the request stream.
    answered = threading.Event()
    answers: list[bytes] = []

    def requests() -> Iterator[bytes]:
        for word in (b"one", b"two", b"three"):
            answered.clear()
            yield word
            assert answered.wait(5), "no answer before the next request"

    for answer in channel.stream_stream("/test.Echo/Echo")(requests(), timeout=10):
        answers.append(answer)
        answered.set()
    assert answers == [b"ONE", b"TWO", b"THREE"]
