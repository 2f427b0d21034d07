"""A turn's stage clock: seconds per stage between marks (a restart's gap no stage's), intervals for spans."""

from __future__ import annotations

from server_shim.stages import StageClock


def ticking(*times: float) -> StageClock:
    readings = iter(times)
    return StageClock(lambda: next(readings))


def test_each_mark_ends_its_stage_where_the_previous_mark_or_restart_left_off():
    clock = ticking(10.0, 11.0, 13.0, 20.0, 20.5, 21.0, 24.0, 30.0)
    clock.mark("resolve")  # 11
    clock.mark("render")  # 13
    clock.restart()  # 20: the 7 s before are nobody's
    clock.mark_first_token()  # 20.5
    clock.mark_first_token()  # a second first token changes nothing (no reading)
    clock.mark("stream")  # 21
    clock.mark("render")  # 24: a stage marked again adds up
    assert clock.seconds == {"resolve": 1.0, "render": 5.0, "backend_ttft": 0.5, "stream": 0.5}
    assert list(clock.seconds) == ["resolve", "render", "backend_ttft", "stream"]
    assert clock.intervals == [
        ("resolve", 10.0, 11.0),
        ("render", 11.0, 13.0),
        ("backend_ttft", 20.0, 20.5),
        ("stream", 20.5, 21.0),
        ("render", 21.0, 24.0),
    ]
    assert clock.started == 10.0 and clock.first_token == 20.5 and clock.ttft_s == 10.5
    assert clock.elapsed() == 20.0


def test_a_clock_with_no_marks_has_no_stages():
    clock = ticking(1.0, 2.0)
    assert clock.seconds == {} and clock.intervals == [] and clock.ttft_s is None
    clock.restart()
    assert clock.seconds == {} and clock.intervals == []
