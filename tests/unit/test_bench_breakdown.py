"""The sampling breakdown's decode estimate never divides by zero: a tiny shape on a fast machine can finish T_1
and T_N in the same logged millisecond (CI saw it), and the figure then falls back to a clock that can tell."""

from __future__ import annotations

import math

import pytest

from benchmarks.sampling_breakdown import ENGINE_CLOCK_S, decode_span


def test_the_engines_clock_is_used_where_it_tells_the_requests_apart():
    assert decode_span(0.100, 0.160, 0.110, 0.190) == (pytest.approx(0.060), "engine")


def test_the_same_logged_millisecond_falls_back_to_the_clients_clock():
    span, source = decode_span(0.422, 0.422, 0.4455, 0.4512)
    assert source == "client" and span == pytest.approx(0.0057)


def test_no_clock_telling_them_apart_gives_the_resolution_as_an_upper_bound():
    span, source = decode_span(0.422, 0.422, 0.45, 0.44)
    assert span == ENGINE_CLOCK_S > 0 and "resolution" in source


def test_a_request_the_log_did_not_time_uses_the_clients_clock():
    span, source = decode_span(math.nan, math.nan, 0.1, 0.3)
    assert source == "client" and span == pytest.approx(0.2)
