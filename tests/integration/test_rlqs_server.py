"""RLQS against a real `sluice serve` (the default transport): a policy published while a
stream is open is pushed to it; a stream past its bucket maximum ends alone; a drain ends
streams with UNAVAILABLE."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import grpc
import pytest

from sluice._proto.envoy.service.rate_limit_quota.v3 import rlqs_pb2, rlqs_pb2_grpc
from tests.integration.test_policy_lifecycle import V1, V2, api, propagation_budget_s, seed, serve
from tests.support.processes import SluiceProcess, sluice_serve

Reports = rlqs_pb2.RateLimitQuotaUsageReports
Response = rlqs_pb2.RateLimitQuotaResponse


def report(domain: str, *buckets: dict[str, str]) -> Reports:
    message = Reports(domain=domain)
    for bucket in buckets:
        message.bucket_quota_usages.add().bucket_id.bucket.update(bucket)
    return message


class Stream:
    """One RLQS stream on a thread: reports go in through ``send``, responses (or the error
    that ended the stream) come out of ``responses``."""

    def __init__(self, server: SluiceProcess) -> None:
        self._channel = grpc.insecure_channel(server.grpc_target)
        self._requests: queue.Queue[Reports | None] = queue.Queue()
        self.responses: queue.Queue[Response | grpc.RpcError | None] = queue.Queue()
        stub = rlqs_pb2_grpc.RateLimitQuotaServiceStub(self._channel)
        self._call = stub.StreamRateLimitQuotas(iter(self._requests.get, None))
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for response in self._call:
                self.responses.put(response)
            self.responses.put(None)
        except grpc.RpcError as exc:
            self.responses.put(exc)

    def send(self, message: Reports) -> None:
        self._requests.put(message)

    def next(self, timeout_s: float = 10) -> Response | grpc.RpcError | None:
        return self.responses.get(timeout=timeout_s)

    def close(self) -> None:
        self._requests.put(None)
        self._call.cancel()
        self._thread.join(5)
        self._channel.close()


@pytest.fixture
def streams() -> Iterator[list[Stream]]:
    opened: list[Stream] = []
    yield opened
    for stream in opened:
        stream.close()


def tokens_per_fill(response: Response | grpc.RpcError | None) -> int:
    assert isinstance(response, Response), response
    [action] = response.bucket_action
    return action.quota_assignment_action.rate_limit_strategy.token_bucket.tokens_per_fill.value


def test_a_published_policy_reaches_open_streams_within_a_second(
    tmp_path: Path, streams: list[Stream]
) -> None:
    database_url = f"sqlite:///{tmp_path / 'config.db'}"
    seed(database_url, tmp_path, V1.replace("hour", "second"))
    with ExitStack() as stack:
        server = serve(stack, tmp_path, database_url, "a")
        stream = Stream(server)
        streams.append(stream)
        stream.send(report("shop", {"user": "ada"}))
        assert tokens_per_fill(stream.next()) == 1  # 1 a second
        budget = propagation_budget_s(polls=4)
        start = time.monotonic()
        code, body = api(
            server,
            "PUT",
            "/api/v1/domains/shop",
            {"document": V2.replace("hour", "second"), "base_version": 1, "comment": "raise"},
        )
        assert code == 200, body
        pushed = stream.next()
        elapsed = time.monotonic() - start
        assert tokens_per_fill(pushed) == 100  # unasked: no report was sent meanwhile
        assert elapsed < budget, f"took {elapsed:.2f}s, more than {budget:.2f}s"


POLICY = """
domain: api
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 10}
"""


@pytest.fixture(scope="module")
def small_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SluiceProcess]:
    workdir = tmp_path_factory.mktemp("rlqs")
    config = workdir / "policy.yaml"
    config.write_text(POLICY)
    args = ["--rlqs-max-buckets-per-stream", "100"]
    with sluice_serve(workdir, config=config, extra_args=args) as process:
        yield process


def test_a_stream_past_its_bucket_maximum_ends_alone(
    small_server: SluiceProcess, streams: list[Stream]
) -> None:
    bystander, greedy = Stream(small_server), Stream(small_server)
    streams += [bystander, greedy]
    bystander.send(report("api", {"tenant": "calm"}))
    assert tokens_per_fill(bystander.next()) == 10
    greedy.send(report("api", *({"tenant": str(i)} for i in range(100))))
    first = greedy.next()
    assert isinstance(first, Response) and len(first.bucket_action) == 100
    greedy.send(report("api", {"tenant": "one-too-many"}))
    error = greedy.next()
    assert isinstance(error, grpc.RpcError)
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "101 buckets, more than the maximum of 100" in str(error.details())
    bystander.send(report("api", {"tenant": "calm"}))
    assert tokens_per_fill(bystander.next()) == 10  # nothing else disturbed


@pytest.mark.parametrize("transport", ["grpcio", "pyvoy"])
def test_sigterm_ends_streams_unavailable(
    tmp_path: Path, streams: list[Stream], transport: str
) -> None:
    config = tmp_path / "policy.yaml"
    config.write_text(POLICY)
    with sluice_serve(tmp_path, config=config, extra_args=["--transport", transport]) as server:
        stream = Stream(server)
        streams.append(stream)
        stream.send(report("api", {"tenant": "a"}))
        assert tokens_per_fill(stream.next()) == 10
        assert server.terminate() == 0
        error = stream.next()
        assert isinstance(error, grpc.RpcError)
        assert error.code() == grpc.StatusCode.UNAVAILABLE
