"""What the doctor answers: one ``Finding`` per check, and the ``Report`` of them all (text and JSON).

A check ends ``ok``, with ``problem``\\ s (each says what is wrong and how to fix it), ``skipped``
(nothing to check here, e.g. no Prometheus was named), or ``failed``: it could not finish (the API
refused a read, its deadline passed), which says nothing about what it checks.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

OK, PROBLEM, SKIPPED, FAILED = "ok", "problem", "skipped", "failed"
SHOWN_PROBLEMS = 10  # per check in the text output; --json lists every one


@dataclass(frozen=True)
class Problem:
    """One thing wrong (``what``, naming the object) and what to do about it (``fix``)."""

    what: str
    fix: str


@dataclass(frozen=True)
class Outcome:
    """What a check returns: one line on what it found, and the problems (none: ok)."""

    summary: str
    problems: list[Problem] = field(default_factory=list)


class Skip(Exception):
    """Raised by a check that has nothing to check on this cluster; the message says why."""


@dataclass(frozen=True)
class Finding:
    check: str
    status: str  # OK, PROBLEM, SKIPPED or FAILED
    summary: str
    problems: tuple[Problem, ...] = ()
    seconds: float = 0.0

    def lines(self) -> list[str]:
        """One line for the check, then each problem and its fix (at most ``SHOWN_PROBLEMS``)."""
        label = {OK: "ok", PROBLEM: "PROBLEM", SKIPPED: "skipped", FAILED: "FAILED"}[self.status]
        lines = [f"{label:<8} {self.check:<22} {self.summary}"]
        for problem in self.problems[:SHOWN_PROBLEMS]:
            lines += [f"{'':31}- {problem.what}", f"{'':33}fix: {problem.fix}"]
        if len(self.problems) > SHOWN_PROBLEMS:
            lines.append(f"{'':31}(+{len(self.problems) - SHOWN_PROBLEMS} more; --json lists them all)")
        return lines


@dataclass(frozen=True)
class Report:
    server: str
    findings: tuple[Finding, ...]

    @property
    def exit_code(self) -> int:
        """0 when every check is ok (or skipped), 1 when one found a problem or could not finish."""
        return 0 if all(f.status in (OK, SKIPPED) for f in self.findings) else 1

    def counts(self) -> dict[str, int]:
        return {s: sum(1 for f in self.findings if f.status == s) for s in (OK, PROBLEM, SKIPPED, FAILED)}

    def text(self) -> str:
        lines = [f"trainops doctor: {self.server}"]
        for finding in self.findings:
            lines += finding.lines()
        said = {OK: "ok", PROBLEM: "with problems", SKIPPED: "skipped", FAILED: "could not finish"}
        counted = ", ".join(f"{n} {said[s]}" for s, n in self.counts().items() if n)
        lines.append(f"{len(self.findings)} checks: {counted}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {
            "server": self.server,
            "ok": self.exit_code == 0,
            "counts": self.counts(),
            "checks": [
                {**asdict(f), "problems": [asdict(p) for p in f.problems], "seconds": round(f.seconds, 3)}
                for f in self.findings
            ],
        }
