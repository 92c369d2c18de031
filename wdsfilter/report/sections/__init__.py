"""The report's sections, in the page's order. Each is a `base.Section` in a module of its own:
it sees every judged row, gathers what it shows, renders its HTML. A new section is a module and
one line here.

    totals.py   rows, kept rows, each rule's counts, the loader call
    columns.py  per score column: statistics, charts, the rows beside each threshold; count columns
    dropped.py  the drop reasons and their first rows
    masked.py   a tmars run: the largest drops in clip_score when the text is masked
    ledger.py   the failure ledger: not scored, by reason; partly scored rows
    dedup.py    the run's duplicate groups and eval matches (also `wdsfilter dedup`'s page)
"""
from .base import ReportContext, Section
from .columns import ScoreColumns
from .dedup import Dedup
from .dropped import Dropped
from .ledger import Ledger
from .masked import MaskedDrops
from .totals import Totals

SECTIONS = [Totals, ScoreColumns, Dropped, MaskedDrops, Ledger, Dedup]

__all__ = ["SECTIONS", "ReportContext", "Section"]
