"""The collectors' one life cycle: started in order, stopped in reverse, rolled back together."""

from __future__ import annotations

import pytest

from cpuprof.collect.collectors import Collector
from cpuprof.collect.session import CollectorError, check_op_counters, start_all, stop_all
from cpuprof.errors import UsageError
from cpuprof.model import Profile


class Recording:
    """A collector that writes what happens to it into a shared log."""

    def __init__(self, name: str, log: list[str], fail_start: BaseException | None = None,
                 fail_stop: BaseException | None = None) -> None:
        self.name = name
        self.log = log
        self.fail_start = fail_start
        self.fail_stop = fail_stop

    def start(self) -> None:
        self.log.append(f"start {self.name}")
        if self.fail_start is not None:
            raise self.fail_start

    def stop(self) -> None:
        self.log.append(f"stop {self.name}")
        if self.fail_stop is not None:
            raise self.fail_stop

    def contribute(self, profile: Profile) -> None:
        self.log.append(f"contribute {self.name}")

    def limitations(self) -> list[str]:
        return []


def test_collectors_start_in_order_and_stop_in_reverse():
    log: list[str] = []
    collectors: list[Collector] = [Recording(n, log) for n in ("a", "b", "c")]
    start_all(collectors)
    stop_all(collectors)
    assert log == ["start a", "start b", "start c", "stop c", "stop b", "stop a"]


def test_a_failed_start_stops_the_started_ones_in_reverse_and_says_one_line():
    log: list[str] = []
    collectors: list[Collector] = [Recording("a", log), Recording("b", log, fail_stop=RuntimeError("b's stop")),
                                   Recording("c", log, fail_start=OSError("no such device")), Recording("d", log)]
    with pytest.raises(CollectorError) as caught:
        start_all(collectors)
    assert log == ["start a", "start b", "start c", "stop b", "stop a"]  # d never started, c never stops
    assert str(caught.value) == "c could not start: no such device"
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("failure", [UsageError("bad event"), KeyboardInterrupt()])
def test_user_errors_and_interrupts_pass_through_the_rollback_unchanged(failure):
    log: list[str] = []
    collectors: list[Collector] = [Recording("a", log), Recording("b", log, fail_start=failure)]
    with pytest.raises(type(failure)):
        start_all(collectors)
    assert log == ["start a", "start b", "stop a"]


def test_every_collector_is_stopped_even_when_one_stop_fails():
    log: list[str] = []
    collectors: list[Collector] = [Recording("a", log), Recording("b", log, fail_stop=RuntimeError("b"))]
    with pytest.raises(RuntimeError):
        stop_all(collectors)
    assert log == ["stop b", "stop a"]


def test_op_counters_per_thread_are_bounded():
    check_op_counters(2048, 16)  # the defaults
    check_op_counters(65536, 16)  # the most keys with 16 events
    check_op_counters(1048576, 1)
    with pytest.raises(UsageError, match="counters per thread"):
        check_op_counters(65537, 16)  # rounded up to 131072 keys
    with pytest.raises(UsageError, match="counters per thread"):
        check_op_counters(1048576, 16)
