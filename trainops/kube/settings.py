"""``KubeSettings``: the one place for how long trainops waits on the Kubernetes API, how it backs off,
how it pages lists and how it watches.  Every verb of ``Kube`` (and the async watches) reads it; no
module keeps its own deadline or backoff constant.

Airflow reads it from ``[trainops]`` in airflow.cfg (``AIRFLOW__TRAINOPS__API_DEADLINE_S=60``) and from
the ``kubernetes`` connection's extra (same keys, which win), through ``KubernetesClusterHook``; the CLI
uses the defaults.  Each default and where it comes from:

============================  =========  ============================================================
key                           default    why
============================  =========  ============================================================
``api_deadline_s``            120        how long one API step retries 429/5xx, dropped connections and
                                         409 conflicts: two kube-apiserver request timeouts
                                         (``--request-timeout``, 60 s), enough to ride out an API server
                                         restart behind its load balancer
``backoff_base_s``            0.05       first retry wait (full jitter, doubling; AWS "Exponential
                                         Backoff And Jitter"); client-go's conflict retry starts at 10 ms
``backoff_cap_s``             2.0        longest wait between two tries without a ``Retry-After``
``retry_after_cap_s``         5.0        longest ``Retry-After`` honoured (API Priority and Fairness
                                         answers 429 with ``Retry-After: 1``)
``page_size``                 500        objects per list page: kubectl's ``--chunk-size`` default
``list_restarts``             3          a list whose continue token expired (410) starts over at most
                                         this often
``watch_timeout_s``           60         ``timeoutSeconds`` of one watch request; the watch then resumes
                                         from its last resourceVersion.  Shorter than client-go's
                                         reflector (5-10 min) so that a silently dead connection is
                                         noticed within a minute
``watch_read_slack_s``        10         how much longer than ``watch_timeout_s`` the client waits on a
                                         silent connection before it calls it dead
``max_concurrent_reads``      8          GETs in flight at once for one step (a failed attempt's nodes
                                         and logs); client-go's default QPS is 5 with a burst of 10
============================  =========  ============================================================
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class KubeSettings:
    """See the module docstring for each field, its default and its source."""

    api_deadline_s: float = 120.0
    backoff_base_s: float = 0.05
    backoff_cap_s: float = 2.0
    retry_after_cap_s: float = 5.0
    page_size: int = 500
    list_restarts: int = 3
    watch_timeout_s: int = 60
    watch_read_slack_s: float = 10.0
    max_concurrent_reads: int = 8

    def __post_init__(self) -> None:
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            integral = item.type == "int"
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or (integral and not isinstance(value, int))
                or not math.isfinite(value)
                or value <= 0
            ):
                kind = "a positive integer" if integral else "positive seconds"
                raise ValueError(f"{item.name} must be {kind}, got {value!r}")
        if self.backoff_cap_s < self.backoff_base_s:
            raise ValueError(
                f"backoff_cap_s ({self.backoff_cap_s:g}) must be at least backoff_base_s ({self.backoff_base_s:g})"
            )

    @classmethod
    def from_options(cls, *sources: tuple[str, Mapping[str, Any]]) -> KubeSettings:
        """From ``(where, options)`` pairs, later ones winning; keys that are not settings are ignored
        (``[trainops]`` holds other options too).  A bad value raises ``ValueError`` naming the key,
        where it was set and what it must be."""
        values: dict[str, Any] = {}
        where: dict[str, str] = {}
        for origin, options in sources:
            for item in dataclasses.fields(cls):
                raw = (options or {}).get(item.name)
                if raw is None or raw == "":
                    continue
                try:
                    values[item.name] = int(raw) if item.type == "int" else float(raw)
                except (TypeError, ValueError):
                    kind = "an integer" if item.type == "int" else "a number of seconds"
                    raise ValueError(f"{origin}: {item.name} must be {kind}, got {raw!r}") from None
                where[item.name] = origin
        try:
            return cls(**values)
        except ValueError as error:
            key = str(error).split(" ", 1)[0]
            raise ValueError(f"{where.get(key, 'settings')}: {error}") from None

    def with_deadline(self, seconds: float) -> KubeSettings:
        """The same settings with another ``api_deadline_s`` (a view that must answer quickly)."""
        return dataclasses.replace(self, api_deadline_s=seconds)
