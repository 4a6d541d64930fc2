"""Telling cumulative from delta stream chunks (sse.stream_is_delta), and what a router's workers report."""

from __future__ import annotations

import pytest

from eagle3_dagster.generate.endpoint_info import Endpoint, router_window, stream_mode_of
from eagle3_dagster.generate.request_errors import FinalFailure
from eagle3_dagster.generate.sse import stream_is_delta

EP = Endpoint(url="http://127.0.0.1:1", name="router")


def _last(n: int | None) -> dict:
    return {"output_ids": [], "meta_info": {"completion_tokens": n} if n is not None else {}}


@pytest.mark.parametrize(
    ("chunks", "completion_tokens", "delta"),
    [
        ([[5], [5, 7], [5, 7, 9]], 3, False),  # cumulative: each starts with the previous
        ([[5], [7], [9]], 3, True),  # deltas sum to completion_tokens
        ([[5], [5], [5]], 3, True),  # a repeated token: prefix-like, but only the sum fits
        ([[5, 7]], 2, False),  # one chunk: both readings are the same ids
        ([[5], [7], [9]], None, True),  # no completion_tokens: not prefixes, so not cumulative
    ],
)
def test_the_chunks_tell_the_mode(chunks, completion_tokens, delta):
    assert stream_is_delta(EP, chunks, _last(completion_tokens)) is delta


@pytest.mark.parametrize(
    ("chunks", "completion_tokens"),
    [
        ([[5], [7], [9]], 5),  # neither the last chunk nor the sum is 5
        ([[5], [5, 7], [5, 7, 9]], None),  # prefixes, yet could be deltas that repeat: no count to settle it
    ],
)
def test_a_stream_neither_reading_fits_fails_the_sample_loudly(chunks, completion_tokens):
    with pytest.raises(FinalFailure) as e:
        stream_is_delta(EP, chunks, _last(completion_tokens))
    assert e.value.reason == "stream_mode_unknown" and "cumulative or delta" in e.value.detail


def test_server_info_flag_names_of_both_versions_and_the_router_stub():
    assert stream_mode_of({"incremental_streaming_output": True}) is True
    assert stream_mode_of({"stream_output": False}) is False  # 0.5.9's name
    assert stream_mode_of({"router_manager": True, "routers_count": 1, "workers_count": 2}) is None


@pytest.mark.parametrize(
    ("per_worker", "window"),
    [
        ([64, 64], 128),
        ([64, None], 128),  # one dead worker of two: counted with the reachable one's 64, not 0
        ([64, 32, None], 144),  # the mean of 64 and 32
        ([10, 11, None], 32),  # 21 + ceil(10.5)
        ([None, None], None),  # nobody said: the caller needs max_in_flight
        ([], None),
    ],
)
def test_a_routers_window_counts_unreachable_workers_with_the_mean_of_the_reachable(per_worker, window):
    assert router_window(per_worker) == window
