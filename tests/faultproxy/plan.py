"""What the fault proxy does to which request: rules that fire by count or by chance, from a seed.

A `FaultPlan` holds rules in order; for each request the proxy reads, the first rule that matches it (API
key, client id prefix) and fires decides its fate (every matching rule counts the request, so `nth` is
the n-th matching request whatever earlier rules did). Chance comes from the plan's own `random.Random(seed)`,
so a plan is reproducible as far as the order of requests is: `describe()` prints the seed and the rules,
for a failure message.

The faults (`Fault`):
- `delay`: hold the request, and everything after it on its connection (TCP keeps order), for a while
  before the broker gets it; if the client gives up and closes meanwhile, the held requests still reach the
  broker, late, as packets still in the network do (the Jepsen case of a produce that outlives its
  transaction);
- `hold`: a delay that ends when the test says so (`FaultProxy.release()`), not after a time: a test puts
  the late request exactly where it wants it, whatever the machine's load (rules only, never by chance);
- `drop`: the broker gets the request, the client never gets the response (it times out);
- `disconnect_before`: the connection is cut when the request arrives; the broker never gets it;
- `disconnect_after`: the broker gets the request and answers; the connection is cut instead of the
  answer reaching the client (the outcome is unknown to it);
- `blackhole` (not a rule: `FaultProxy.blackhole`): a client's requests are swallowed, nothing answers.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from tests.faultproxy.frames import FAULT_APIS, RequestHeader, api_name

__all__ = ["Chaos", "Fault", "FaultPlan", "Injection", "Rule"]


class Fault(str, Enum):
    DELAY = "delay"
    DROP = "drop"
    DISCONNECT_BEFORE = "disconnect_before"
    DISCONNECT_AFTER = "disconnect_after"
    BLACKHOLE = "blackhole"
    HOLD = "hold"


@dataclass(frozen=True)
class Injection:
    """The fate of one request."""

    fault: Fault
    delay_s: float = 0.0


def _apis(apis: frozenset[int]) -> str:
    return "any API" if not apis else "/".join(sorted(api_name(k) for k in apis))


@dataclass(frozen=True)
class Rule:
    """A fault on requests of `apis` (empty: any) from clients whose id starts with `client` (None: any):
    on the `nth` such request only (1-based), or on each with `probability`, at most `times` times."""

    fault: Fault
    apis: frozenset[int] = FAULT_APIS
    client: str | None = None
    nth: int | None = None
    times: int | None = None
    probability: float = 1.0
    delay_s: float = 0.0

    def __post_init__(self) -> None:
        if self.fault is Fault.BLACKHOLE:
            raise ValueError("blackholing is per client or connection: FaultProxy.blackhole")
        if self.fault is Fault.DELAY and self.delay_s <= 0:
            raise ValueError("a delay rule needs delay_s > 0")
        if not 0.0 <= self.probability <= 1.0:
            raise ValueError(f"probability {self.probability} outside [0, 1]")

    def matches(self, header: RequestHeader) -> bool:
        if self.apis and header.api_key not in self.apis:
            return False
        return self.client is None or (header.client_id or "").startswith(self.client)

    def __str__(self) -> str:
        when = f"#{self.nth}" if self.nth is not None else f"p={self.probability:g}"
        limit = "" if self.times is None else f" x{self.times}"
        delay = f" {self.delay_s:g}s" if self.fault is Fault.DELAY else ""
        client = "" if self.client is None else f" client {self.client}*"
        return f"{self.fault.value}{delay} on {_apis(self.apis)}{client} {when}{limit}"


# The default mix of random faults: mostly ones a client resolves by itself at once (a late answer, a
# new connection), fewer that cost it a request timeout (a lost answer).
DEFAULT_MIX: Mapping[Fault, float] = {
    Fault.DELAY: 0.45,
    Fault.DISCONNECT_BEFORE: 0.2,
    Fault.DISCONNECT_AFTER: 0.25,
    Fault.DROP: 0.1,
}


@dataclass(frozen=True)
class Chaos:
    """Random faults: each matching request, with probability `rate`, gets a fault drawn from `mix`
    (weights), a delay drawn uniformly from `delay_s`; at most `times` in all."""

    rate: float
    mix: Mapping[Fault, float] = field(default_factory=lambda: dict(DEFAULT_MIX))
    apis: frozenset[int] = FAULT_APIS
    client: str | None = None
    delay_s: tuple[float, float] = (0.01, 0.5)
    times: int | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.rate <= 1.0:
            raise ValueError(f"rate {self.rate} outside [0, 1]")
        if not self.mix or min(self.mix.values()) < 0 or {Fault.BLACKHOLE, Fault.HOLD} & set(self.mix):
            raise ValueError(f"bad mix {dict(self.mix)}")

    def matches(self, header: RequestHeader) -> bool:
        if self.apis and header.api_key not in self.apis:
            return False
        return self.client is None or (header.client_id or "").startswith(self.client)

    def __str__(self) -> str:
        mix = ", ".join(f"{f.value} {w:g}" for f, w in self.mix.items())
        limit = "" if self.times is None else f" x{self.times}"
        client = "" if self.client is None else f" client {self.client}*"
        lo, hi = self.delay_s
        return f"chaos rate {self.rate:g} on {_apis(self.apis)}{client} ({mix}; delays {lo:g}-{hi:g}s){limit}"


class FaultPlan:
    """Rules in order, a seeded chance, and how often each rule matched and fired. Used by one thread
    (the proxy's event loop)."""

    def __init__(self, *rules: Rule | Chaos, seed: int = 0) -> None:
        self.rules = rules
        self.seed = seed
        self._rng = random.Random(seed)
        self.matched = [0] * len(rules)
        self.fired = [0] * len(rules)

    def decide(self, header: RequestHeader) -> Injection | None:
        """The fate of a request: the first rule (in order) that matches it and fires. Every rule that
        matches counts the request, whichever fires (`nth` counts all matching requests)."""
        chosen: Injection | None = None
        for i, rule in enumerate(self.rules):
            if not rule.matches(header):
                continue
            self.matched[i] += 1
            if chosen is None:
                chosen = self._fire(i, rule)
        return chosen

    def _fire(self, i: int, rule: Rule | Chaos) -> Injection | None:
        rng = self._rng
        if rule.times is not None and self.fired[i] >= rule.times:
            return None
        if isinstance(rule, Rule):
            if rule.nth is not None:
                if self.matched[i] != rule.nth:
                    return None
            elif rule.probability < 1.0 and rng.random() >= rule.probability:
                return None
            self.fired[i] += 1
            return Injection(rule.fault, rule.delay_s)
        if rng.random() >= rule.rate:
            return None
        faults = list(rule.mix)
        fault = rng.choices(faults, weights=[rule.mix[f] for f in faults])[0]
        lo, hi = rule.delay_s
        self.fired[i] += 1
        return Injection(fault, rng.uniform(lo, hi) if fault is Fault.DELAY else 0.0)

    def exhausted(self) -> bool:
        """Every rule has a limit and reached it: nothing more will fire."""
        return all(r.times is not None and f >= r.times for r, f in zip(self.rules, self.fired, strict=True))

    def describe(self) -> str:
        rules = "; ".join(
            f"[{rule}: matched {m}, fired {f}]"
            for rule, m, f in zip(self.rules, self.matched, self.fired, strict=True)
        )
        return f"FaultPlan(seed={self.seed}) {rules or '(no rules)'}"
