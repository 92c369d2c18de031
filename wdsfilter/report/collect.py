"""What the HTML report shows, gathered while `filter` (or the end of `score`) judges the rows, in
one pass and bounded memory: each section of sections/ sees every row and keeps the few it shows;
then one read of each source shard that holds a shown row gives every section's cards their
thumbnails and captions (media.attach_media)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

from .media import attach_media
from .sections import SECTIONS, ReportContext, Section


@dataclass
class Report:
    """A report ready to render (page.render): the judged result and its sections, finished."""
    result: object
    sections: List[Section]


class ReportCollector:
    def __init__(self, run, thresholds: Sequence, allow_pipe: bool = False, allow_remote: bool = False,
                 idle_seconds: float = 0.0):
        # this command's permissions, never the folder's
        self.context = ReportContext(run, thresholds, (allow_pipe, allow_remote, idle_seconds))
        self.sections = [cls(self.context) for cls in SECTIONS]
        extra = [c for s in self.sections for c in s.columns()]
        # read beside the threshold columns while judging
        self.columns = self.context.numeric + [c for c in dict.fromkeys(extra) if c not in self.context.numeric]

    def observe(self, shard, row: dict, reason: Optional[str]) -> None:
        for section in self.sections:
            section.observe(shard, row, reason)

    def finish(self, result) -> Report:
        for section in self.sections:
            section.finish(result)
        attach_media([e for s in self.sections for e in s.examples()], self.context.run.stage, *self.context.allow)
        return Report(result, self.sections)
