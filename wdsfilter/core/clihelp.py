"""Every command's --help laid out one way: its options in named groups, always in the order of
GROUPS, each group listing the flags used on almost every real set first (the command says the
order), and an epilog naming only the exit codes the command can return.

Plain click does this: `Command.format_options` is click's place for laying out the options, and
overriding it takes a few lines and imports nothing. cloup (option groups, constraints) would do
it too, but measured here it adds 0.1-0.2 s to every start of `wdsfilter` (it imports
importlib.metadata, typing_extensions and its constraint engine) and its current release needs
click >= 8.5; the validator installs and starts light (docs/dev.md, "Help pages").
"""
from __future__ import annotations

from typing import Dict, List, Mapping, Sequence, Tuple

import click

from .errors import exit_codes_help

# The groups of every command's options, in the order --help shows them (a command shows the ones
# it has). The help option (-h/--help) closes "Run control".
GROUPS = ("Input", "Model and scorers", "Thresholds", "Output", "Performance", "Remote", "Run control")
LEFT_OVER = "Other options"  # options no group names: tests/test_cli_help.py refuses them
HELP_OPTIONS = ["-h", "--help"]
COLUMN = 30  # the widest flag column (click's own limit); a longer flag's help starts on the next line


class GroupedCommand(click.Command):
    """A click command whose --help shows `groups` ({group title: parameter names in the order
    shown}) and, as its epilog, the exit `codes` it can return. `findings`: the command's own
    words for exit code 1."""

    def __init__(self, *args, groups: Mapping[str, Sequence[str]], codes: Sequence[int],
                 findings: str = "findings", **kwargs):
        kwargs.setdefault("context_settings", {}).setdefault("help_option_names", HELP_OPTIONS)
        kwargs.setdefault("epilog", exit_codes_help(tuple(codes), findings))
        super().__init__(*args, **kwargs)
        unknown = [g for g in groups if g not in GROUPS]
        if unknown:
            raise ValueError(f"{self.name}: help groups {unknown} are none of {GROUPS}")
        names = [n for g in groups.values() for n in g]
        declared = {p.name for p in self.params}
        wrong = sorted({n for n in names if n not in declared} | {n for n in names if names.count(n) > 1})
        if wrong:
            raise ValueError(f"{self.name}: help groups name parameters it lacks or name them twice: {wrong}")
        self.groups = {g: tuple(groups[g]) for g in GROUPS if g in groups}
        self.codes = tuple(codes)

    def option_groups(self, ctx: click.Context) -> List[Tuple[str, List[click.Parameter]]]:
        """(title, options) in the order shown; the options no group names come last, under
        LEFT_OVER (hidden ones, such as a deprecated spelling, are not shown at all)."""
        by_name: Dict[str, click.Parameter] = {p.name: p for p in self.get_params(ctx)}
        shown = [(title, [by_name[n] for n in names]) for title, names in self.groups.items()]
        help_option = self.get_help_option(ctx)
        if help_option is not None:
            if not shown or shown[-1][0] != "Run control":
                shown.append(("Run control", []))
            shown[-1][1].append(help_option)
        placed = {id(p) for _, params in shown for p in params}
        left = [p for p in by_name.values() if isinstance(p, click.Option) and id(p) not in placed and not p.hidden]
        return shown + ([(LEFT_OVER, left)] if left else [])

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        sections = [(title, [r for r in (p.get_help_record(ctx) for p in params) if r is not None])
                    for title, params in self.option_groups(ctx)]
        # one column of help texts down the whole page (write_dl sizes each group's on its own)
        width = min(max((len(term) for _, rows in sections for term, _ in rows), default=0), COLUMN)
        for title, rows in sections:
            if rows:
                with formatter.section(title):
                    formatter.write_dl([(term.ljust(width), text) for term, text in rows], col_max=COLUMN)


def command(name: str, groups: Mapping[str, Sequence[str]], codes: Sequence[int], **kwargs):
    """`@click.command(name, ...)` with the grouped help and the epilog of `codes`."""
    return click.command(name, cls=GroupedCommand, groups=groups, codes=codes, **kwargs)
