"""The Report: per-shard results put together, the cross-shard checks, and the verdict."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from .. import __version__
from ..stream.census import KeyCensus
from .checks import layout
from .findings import ERROR, KINDS, SAMPLE_KINDS, WARNING, Finding, at_level
from .options import ValidateOptions
from .shard_check import ShardResult
from .formats import to_text, verdict_line

SCHEMA_VERSION = 1


@dataclass
class Report:
    options: ValidateOptions
    shards: List[ShardResult]
    layout: List[Finding] = field(default_factory=list)  # findings of no single shard
    seconds: float = 0.0

    @classmethod
    def build(cls, results: List[ShardResult], options: ValidateOptions, seconds: float = 0.0) -> "Report":
        """results in shard order; runs the cross-shard checks (they need every shard's summary)."""
        layout.key_across_shards(results)
        layout.uneven_shards(results, options.uneven_ratio)
        found = layout.too_few_shards(len(results), options.ranks, options.loader_workers)
        report = cls(options, results, found, seconds)
        report.layout += report.drop_limits_exceeded()
        return report

    def drop_limits_exceeded(self) -> List[Finding]:
        """A too_many_dropped finding for each --max-drop tolerance the samples exceed: overall (every
        sample the stages drop, whatever the reason) and per reason (its findings, one a sample)."""
        o, n, out = self.options, self.samples, []
        if not n or (o.drop_limit is None and not o.drop_limits):
            return out
        dropped = n - self.kept
        if o.drop_limit is not None and dropped > o.drop_limit * n:
            out.append(Finding("too_many_dropped", "", message=f"{dropped} of {n} samples ({dropped / n:.2%}) would be "
                               f"dropped ({self.drop_reasons()}), above --max-drop {o.drop_limit:.2%}"))
        counts = self.counts
        for kind in SAMPLE_KINDS:
            limit = o.drop_limits.get(kind)
            if limit is not None and counts.get(kind, 0) > limit * n:
                out.append(Finding("too_many_dropped", "", message=f"{counts[kind]} {kind} in {n} samples "
                                   f"({counts[kind] / n:.2%}), above --max-drop {kind}={limit:.2%}"))
        return out

    def drop_reasons(self) -> str:
        """The stages' drop reasons with their counts and shares, most first ('corrupt_image 2, 5.26%')."""
        n = self.samples or 1
        return "; ".join(f"{reason} {count}, {count / n:.2%}" for reason, count in self.dropped.most_common())

    def is_failing(self, kind: str) -> bool:
        """A finding of this kind fails the run: at the --fail-on level, unless it costs one sample
        and a --max-drop tolerance holds it (too_many_dropped says when it does not)."""
        if self.options.tolerance(kind) is not None:
            return False
        return at_level(kind, self.options.fail_on)

    @property
    def tolerated(self) -> Dict[str, int]:
        """Kinds at the failing level that --max-drop lets pass (within their tolerance), with their counts."""
        o, n = self.options, self.samples
        over_all = o.drop_limit is not None and n - self.kept > o.drop_limit * n
        out = {}
        for k, count in sorted(self.counts.items()):
            limit = o.tolerance(k)
            if limit is None or not at_level(k, o.fail_on) or count > limit * n \
                    or (k not in o.drop_limits and over_all):
                continue
            out[k] = count
        return out

    # -- totals ----------------------------------------------------------------------------------
    @property
    def samples(self) -> int:
        return sum(r.samples for r in self.shards)

    @property
    def kept(self) -> int:
        return sum(r.kept for r in self.shards)

    @property
    def kept_share(self) -> Optional[float]:
        return self.kept / self.samples if self.samples else None

    @property
    def bytes(self) -> int:
        return sum(r.bytes for r in self.shards)

    @property
    def dropped(self) -> Counter:
        total: Counter = Counter()
        for r in self.shards:
            total.update(r.dropped)
        return total

    @property
    def findings(self) -> List[Finding]:
        """Every listed finding, shard by shard (the first max_findings of each kind per shard)."""
        return [f for r in self.shards for f in r.findings] + list(self.layout)

    @property
    def counts(self) -> Counter:
        """Findings per kind, all of them (listed or not)."""
        total: Counter = Counter()
        for r in self.shards:
            total.update(r.counts)
        total.update(f.kind for f in self.layout)
        return total

    def count(self, severity: str) -> int:
        return sum(n for kind, n in self.counts.items() if KINDS[kind][0] == severity)

    @property
    def errors(self) -> int:
        return self.count(ERROR)

    @property
    def warnings(self) -> int:
        return self.count(WARNING)

    @property
    def failing(self) -> Dict[str, int]:
        """Kinds at the failing level (--fail-on) with their counts."""
        return {k: n for k, n in sorted(self.counts.items()) if self.is_failing(k)}

    @property
    def passed(self) -> bool:
        return not self.failing

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1

    @property
    def omitted(self) -> Dict[str, int]:
        listed = Counter(f.kind for f in self.findings)
        return {k: n - listed[k] for k, n in sorted(self.counts.items()) if n > listed[k]}

    def suggestions(self) -> List[str]:
        """The all-filtered shards' suggestions, then one per spec over every sample that missed it.

        When the current spec finds the caption (image) in some samples, the advice keeps it and
        adds the alternative ('txt;json:description'): replacing it would lose those samples."""
        found = list(dict.fromkeys(r.suggestion for r in self.shards if r.suggestion))
        stage = self.options.stage
        for what, spec in (("caption", stage.caption_spec), ("image", stage.image_spec)):
            census = KeyCensus()
            for r in self.shards:
                part = r.census.get(what)
                if part is not None:
                    census.samples += part.samples
                    census.exts.update(part.exts)
                    census.json_fields.update(part.json_fields)
            hint = census.suggest(what, spec) if census.samples else None
            if not hint:
                continue
            flag = f"--{what}-key "
            head, best = hint.rsplit(flag, 1)  # "... use --caption-key json:description"
            if census.samples == self.samples:
                if not any(s.endswith(flag + best) for s in found):
                    found.append(f"no sample has a {what} under '{spec}'; {hint}")
                continue
            found = [s for s in found if flag not in s]  # shard-level advice that the combined spec replaces
            found.append(f"{census.samples} of {self.samples} samples have no {what} under '{spec}'; among "
                         f"them, {head}{flag}'{spec};{best}'")
        return found

    # -- printed as the command line prints it ---------------------------------------------------------
    def format_text(self, quiet: bool = False) -> str:
        """The text report `wdsfilter validate` prints (findings, shard table, suggestions, verdict);
        quiet: the verdict line only, as `validate -q` prints it."""
        return to_text(self, quiet)

    def __repr__(self) -> str:
        """One line: the verdict and the counts (print(report) or report.format_text() for all of it)."""
        return (f"<wdsfilter validate Report: {len(self.shards)} shard(s), {self.samples} samples, {self.kept} kept; "
                f"{verdict_line(self)}>")

    def __str__(self) -> str:
        return self.format_text()

    def _repr_html_(self) -> str:
        """A notebook's view: the verdict, the findings by kind and the suggestions as a small table."""
        from html import escape

        colour = "#2a2" if self.passed else "#c22"
        rows = "".join(f"<tr><td>{escape(k)}</td><td>{escape(KINDS[k][0])}</td><td style='text-align:right'>{n}</td>"
                       f"<td>{escape(KINDS[k][1])}</td></tr>"
                       for k, n in sorted(self.counts.items(), key=lambda x: (KINDS[x[0]][0] != ERROR, x[0])))
        share = "-" if self.kept_share is None else f"{self.kept_share:.1%}"
        out = [f"<div><b style='color:{colour}'>{'PASS' if self.passed else 'FAIL'}</b> "
               f"{escape(verdict_line(self))}</div>",
               f"<div>{len(self.shards)} shard(s), {self.samples} samples, {self.kept} kept ({share})</div>"]
        if rows:
            out.append("<table><tr><th>kind</th><th>severity</th><th>count</th><th>what to do</th></tr>"
                       f"{rows}</table>")
        suggestions = self.suggestions()
        if suggestions:
            out.append("<ul>" + "".join(f"<li>{escape(s)}</li>" for s in suggestions) + "</ul>")
        return "\n".join(out)

    def to_dict(self) -> dict:
        """The JSON report (schema documented in docs/validate.md; bump SCHEMA_VERSION on any
        change that is not a new field)."""
        return {
            "schema_version": SCHEMA_VERSION,
            "tool": "wdsfilter validate",
            "wdsfilter_version": __version__,
            "status": "pass" if self.passed else "fail",
            "exit_code": self.exit_code,
            "options": self.options.to_dict(),
            "summary": {"shards": len(self.shards), "bytes": self.bytes, "members": sum(r.members for r in self.shards),
                        "samples": self.samples, "kept": self.kept,
                        "kept_share": None if self.kept_share is None else round(self.kept_share, 6),
                        "errors": self.errors, "warnings": self.warnings, "seconds": round(self.seconds, 3),
                        "tolerated": self.tolerated},
            "counts": dict(sorted(self.counts.items())),
            "dropped": dict(sorted(self.dropped.items())),
            "severities": {k: v[0] for k, v in KINDS.items()},
            "suggestions": self.suggestions(),
            "layout": layout.layout_stats(self.shards, self.options.ranks, self.options.loader_workers),
            "shards": [r.stats() for r in self.shards],
            "findings": [f.to_dict() for f in self.findings],
            "omitted": self.omitted,
        }
