"""Energy per generation: an `EnergyMeter` wraps each generation in a `Measurement` over the
power sources `power.survey` found (counters read at the start and end, power-only sources
sampled by one background thread). A probe that fails never fails a reply: the figure is left
out and the reason kept.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from localfab.machine.power import (
    SAMPLE_INTERVAL_S,
    WHAT_IT_COVERS,
    Covers,
    Method,
    Probe,
    ProbeError,
    Survey,
    choose,
    render_findings,
    survey,
)

# The power sources' vocabulary, read through this module by the front ends.
__all__ = [
    "SAMPLE_INTERVAL_S",
    "WHAT_IT_COVERS",
    "Covers",
    "Energy",
    "EnergyMeter",
    "Measurement",
    "Method",
    "Probe",
    "ProbeError",
    "Survey",
    "render_findings",
    "survey",
]


@dataclass(frozen=True)
class Energy:
    """The energy one generation took, or why it is not known."""

    joules: float | None
    source: str  # the probes, joined by "+"; "" when there is none
    note: str = ""  # why the figure is left out or partial

    def tokens_per_joule(self, tokens: int) -> float | None:
        if self.joules is None or self.joules <= 0 or tokens <= 0:
            return None
        return tokens / self.joules


class _Sampler(threading.Thread):
    """Integrates sampled power (trapezoids) until stopped; runs only for power-only probes."""

    def __init__(self, probes: list[Probe], interval: float) -> None:
        super().__init__(name="localfab-power-sampler", daemon=True)
        self.probes = probes
        self.interval = interval
        self.stop_event = threading.Event()
        self.joules = dict.fromkeys((p.name for p in probes), 0.0)
        self.failed: dict[str, str] = {}
        self.last: dict[str, tuple[float, float]] = {}
        self.first: dict[str, float] = {}

    def sample(self) -> None:
        now = time.monotonic()
        for probe in self.probes:
            if probe.name in self.failed:
                continue
            try:
                watts = probe.read()
            except ProbeError as exc:
                self.failed[probe.name] = str(exc)
                continue
            prev = self.last.get(probe.name)
            if prev is None:
                self.first[probe.name] = now
            else:
                self.joules[probe.name] += (watts + prev[1]) / 2 * (now - prev[0])
            self.last[probe.name] = (now, watts)

    def run(self) -> None:
        while not self.stop_event.wait(self.interval):
            self.sample()

    def finish(self) -> None:
        self.stop_event.set()
        self.join()
        self.sample()


class EnergyMeter:
    """Measures generations with a fixed set of probes; `measure()` wraps one generation.

    Counters are read once at the start and once at the end; power-only sources are sampled by
    one background thread that sleeps between samples. Nothing runs per token.
    """

    def __init__(self, probes: Sequence[Probe], *, interval: float = SAMPLE_INTERVAL_S) -> None:
        self.probes = choose(probes)
        self.interval = interval

    @classmethod
    def for_this_machine(cls, root: str | Path = "/") -> EnergyMeter:
        return cls(survey(root).probes)

    def measure(self) -> Measurement:
        return Measurement(self.probes, self.interval)


class Measurement:
    """One generation's energy: use as a context manager, then read `energy`."""

    def __init__(self, probes: Sequence[Probe], interval: float) -> None:
        self.probes = list(probes)
        self.interval = interval
        self.start: dict[str, float] = {}
        self.failed: dict[str, str] = {}
        self.sampler: _Sampler | None = None
        self.energy = Energy(None, "", "no power source on this machine (see localfab doctor)")

    def __enter__(self) -> Measurement:
        try:
            self.begin()
        except Exception as exc:  # a probe must never fail a reply
            self.probes = []
            self.failed["meter"] = f"the energy reading failed: {exc}"
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.end()
        except Exception as exc:  # a probe must never fail a reply
            self.energy = Energy(None, "", f"the energy reading failed: {exc}")

    def begin(self) -> None:
        counters = [p for p in self.probes if p.method == "counter"]
        for probe in counters:
            try:
                self.start[probe.name] = probe.read()
            except ProbeError as exc:
                self.failed[probe.name] = str(exc)
        powered = [p for p in self.probes if p.method == "power"]
        if powered:
            self.sampler = _Sampler(powered, self.interval)
            self.sampler.sample()
            self.sampler.start()

    def end(self) -> Energy:
        total = 0.0
        used: list[str] = []
        for probe in self.probes:
            if probe.method != "counter" or probe.name in self.failed:
                continue
            try:
                total += probe.delta(self.start[probe.name], probe.read())
                used.append(probe.name)
            except ProbeError as exc:
                self.failed[probe.name] = f"vanished mid-reply: {exc}"
        if self.sampler is not None:
            self.sampler.finish()
            self.failed.update(
                {k: f"vanished mid-reply: {v}" for k, v in self.sampler.failed.items()}
            )
            for name, joules in self.sampler.joules.items():
                if name not in self.sampler.failed:
                    total += joules
                    used.append(name)
        note = "; ".join(f"{name}: {why}" for name, why in self.failed.items())
        if not self.probes:
            none = "no power source on this machine (see localfab doctor)"
            self.energy = Energy(None, "", note or none)
        elif self.failed or not used:
            # A partial sum would understate: leave the figure out and say why.
            self.energy = Energy(None, "+".join(used), note or "no probe could be read")
        else:
            self.energy = Energy(total, "+".join(used))
        return self.energy
