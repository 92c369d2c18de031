"""Help that a person can scan (issue 35 item 7): every command's --help shows its options in the
groups of wdsfilter/core/clihelp.py, in one order, the flags used on almost every real set first; every
option is in a group (a new flag without one fails here); one spelling per concept across commands;
an epilog naming exactly the exit codes the command can return. Real CliRunner invocations."""
import re

import click
import pytest
from click.testing import CliRunner

from tests.shardkit import image_bytes, image_text_members, write_shard
from wdsfilter.cli import main
from wdsfilter.core.clihelp import GROUPS, GroupedCommand

COMMON = ("--caption-key", "--image-key", "--out", "--scorer", "--model")  # on almost every real set
# What each command can return (wdsfilter/errors.py): only validate has findings.
CODES = {"validate": (0, 1, 2, 3), "score": (0, 2, 3), "filter": (0, 2, 3), "dedup": (0, 2, 3),
         "sort-shard": (0, 2, 3)}


def commands(group=main, path=()):
    """(name path, command) of every command under the `wdsfilter` group, nested groups walked."""
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            yield from commands(command, (*path, name))
        else:
            yield (*path, name), command


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def help_sections(path):
    """[(heading, [flags of each entry])] of `wdsfilter PATH --help`, in the order shown."""
    result = invoke(*path, "--help")
    assert result.exit_code == 0, result.output
    sections = []
    for line in result.output.splitlines():
        if re.fullmatch(r"\S[^:]*:", line):
            sections.append((line[:-1], []))
        elif line.startswith("  -") and sections:
            term = line[2:].split("  ")[0]
            sections[-1][1].append(re.findall(r"(?<![\w-])--?[A-Za-z][\w-]*", term))
    return sections, result.output


def test_every_command_is_listed_and_grouped():
    names = {path[0] for path, _ in commands()}
    assert names == set(CODES), names  # a new command gets its codes here
    for path, command in commands():
        assert isinstance(command, GroupedCommand), path


@pytest.mark.parametrize("path", [p for p, _ in commands()], ids=" ".join)
def test_help_shows_its_groups_in_order_with_common_flags_first(path):
    sections, text = help_sections(path)
    headings = [h for h, _ in sections if h != "Usage"]
    assert headings and all(h in GROUPS for h in headings), headings  # no "Options:", no "Other options:"
    assert headings == sorted(headings, key=GROUPS.index), headings
    for heading, entries in sections:
        flags = [f for entry in entries for f in entry]
        common = [f for f in flags if f in COMMON]
        assert flags[:len(common)] == common, (heading, flags)  # the common ones lead their group
    if path == ("score",):  # the five, each first in its group, the groups in order
        first = {h: entries[0][0] for h, entries in sections}
        assert first["Input"] == "--caption-key" and first["Model and scorers"] == "--scorer"
        assert first["Output"] == "--out"
        assert [e[0] for e in dict(sections)["Model and scorers"][:2]] == ["--scorer", "--model"]
        assert [e[0] for e in dict(sections)["Input"][:2]] == ["--caption-key", "--image-key"]
    if path == ("validate",):
        assert [e[0] for e in dict(sections)["Input"][:2]] == ["--caption-key", "--image-key"]
    assert dict(sections)["Run control"][-1] == ["-h", "--help"]


def ungrouped(path, command):
    """The visible flags of `command` that its --help does not show under one of GROUPS."""
    sections, _ = help_sections(path)
    grouped = {f for heading, entries in sections if heading in GROUPS for entry in entries for f in entry}
    return [f for p in command.params if isinstance(p, click.Option) and not p.hidden
            for f in (*p.opts, *p.secondary_opts) if f not in grouped]


@pytest.mark.parametrize("path", [p for p, _ in commands()], ids=" ".join)
def test_every_option_of_every_command_is_in_a_group(path):
    command = dict(commands())[path]
    assert ungrouped(path, command) == []


def test_a_flag_without_a_group_is_caught(monkeypatch):
    """The walk above fails on a new flag nobody placed: it lands under 'Other options'."""
    command = dict(commands())[("sort-shard",)]
    extra = click.Option(["--new-flag"], is_flag=True, help="Nobody placed me.")
    monkeypatch.setattr(command, "params", [*command.params, extra])
    assert ungrouped(("sort-shard",), command) == ["--new-flag"]
    assert "Other options:" in invoke("sort-shard", "--help").output
    with pytest.raises(ValueError, match="lacks or name them twice"):  # a group naming a flag that is gone
        GroupedCommand("x", groups={"Input": ("gone",)}, codes=(0,), params=[])
    with pytest.raises(ValueError, match="none of"):
        GroupedCommand("x", groups={"Inputs": ()}, codes=(0,), params=[])


def epilog_codes(path):
    text = " ".join(invoke(*path, "--help").output.split())
    listed = re.search(r"Exit codes: (.*?); --debug", text).group(1)
    return tuple(int(code) for code in re.findall(r"(?:^|, )(\d+) ", listed))


@pytest.mark.parametrize("path", [p for p, _ in commands()], ids=" ".join)
def test_each_epilog_lists_exactly_the_codes_the_command_returns(path):
    assert epilog_codes(path) == CODES[path[0]] == dict(commands())[path].codes
    result = invoke(*path, "--no-such-flag")  # 2, reached by every command
    assert result.exit_code == 2, result.output


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    folder = tmp_path_factory.mktemp("help")
    clean = write_shard(folder / "clean-000000.tar", image_text_members(2))
    # a.jpg, b.jpg, a.txt, b.txt: each key's members apart (validate's warning, sort-shard's fix)
    scattered = write_shard(folder / "scattered-000000.tar", [("a.jpg", image_bytes()), ("b.jpg", image_bytes()),
                                                              ("a.txt", "a"), ("b.txt", "b")])
    cut = folder / "cut-000000.tar"
    cut.write_bytes(open(clean, "rb").read()[:700])  # ends inside a member
    return folder, clean, scattered, str(cut)


def test_the_codes_listed_are_reached(shards, tmp_path):
    """validate: 0 clean, 1 findings; sort-shard (no findings: a scattered shard is what it fixes):
    0 and 3 (one of two shards cannot be sorted); every command's 2 in the test above; score,
    filter and dedup's 3 in tests/test_exit_codes.py and tests/test_failures_half_way.py."""
    folder, clean, scattered, cut = shards
    assert invoke("validate", clean, "-j", "1").exit_code == 0
    assert invoke("validate", scattered, "-j", "1", "--fail-on", "warning").exit_code == 1  # nonadjacent_key
    assert invoke("sort-shard", scattered, tmp_path / "sorted.tar").exit_code == 0
    assert invoke("validate", tmp_path / "sorted.tar", "-j", "1", "--fail-on", "warning").exit_code == 0
    result = invoke("sort-shard", clean, cut, tmp_path / "sorted")
    assert result.exit_code == 3, result.output


def test_one_spelling_of_the_run_folder():
    sections, _ = help_sections(("score",))
    assert ["--out"] in dict(sections)["Output"] and "--out RUN " in invoke("score", "--help").output
    for name in ("filter", "dedup"):
        text = invoke(name, "--help").output
        assert f"Usage: main {name} [OPTIONS] RUN\n" in text or f"Usage: wdsfilter {name} [OPTIONS] RUN\n" in text
        assert "SCORES_DIR" not in text and "RUN_DIR" not in text
    assert "RUN/run.yaml" in invoke("validate", "--help").output


def test_allow_remote_says_how_its_meanings_differ(shards):
    for name in ("validate", "score"):
        text = " ".join(invoke(name, "--help").output.split())
        assert "--allow-remote / --no-remote" in text and "filter's --allow-remote" in text, name
    text = " ".join(invoke("filter", "--help").output.split())
    assert "validate's and score's --allow-remote" in text
    # --no-remote refuses a URL before any network use, on both commands that take it: exit 2
    for args in (("validate", "http://127.0.0.1:9/x.tar", "--no-remote"),
                 ("score", "http://127.0.0.1:9/x.tar", "--no-remote", "--scorer", "size", "--out", shards[0] / "r")):
        result = invoke(*args)
        assert result.exit_code == 2 and "remote" in result.output.lower(), (args, result.output)


@pytest.mark.parametrize("name", ["validate", "score"])
def test_progress_and_no_progress(name, shards, tmp_path):
    """--progress/--no-progress on every command with a progress line (validate, score): the same
    spelling, and each does what it says, off a terminal too."""
    clean = shards[1]
    more = ("--scorer", "size", "--device", "cpu", "--workers", "0") if name == "score" else ("-j", "1")
    lines = {}
    for flag in ("--progress", "--no-progress"):
        out = ("--out", tmp_path / flag) if name == "score" else ()
        result = invoke(name, clean, *more, *out, flag)
        assert result.exit_code == 0, result.output
        lines[flag] = [line for line in result.output.splitlines() if "elapsed" in line]
    assert lines["--progress"] and not lines["--no-progress"], lines


@pytest.fixture(scope="module")
def scored(shards, tmp_path_factory):
    """A score folder (the hash scorer: what dedup reads) of the two-sample shard."""
    out = tmp_path_factory.mktemp("scored") / "run"
    result = invoke("score", shards[1], "--scorer", "hash", "--device", "cpu", "--workers", "0", "--out", out,
                    "--no-progress", "-q")
    assert result.exit_code == 0, result.output
    return out


def progress_lines(output, name):
    return [line for line in output.splitlines() if line.startswith(name) and "elapsed" in line]


def test_filter_and_dedup_progress(scored, tmp_path):
    """filter and dedup draw their passes on the shared progress line (wdsfilter/progress.py):
    with --progress, in a log too (CliRunner is no terminal), each pass's last line drawn when it
    ends; not with --no-progress, -q, or by default off a terminal. Only the counts of those last
    lines are asserted (rates and times depend on the machine)."""
    def run(*args):
        result = invoke(*args)
        assert result.exit_code == 0, result.output
        return result.output
    shards = ("--write-shards", tmp_path / "kept", "--samples-per-shard", "1", "--no-report")
    text = run("filter", scored, *shards, "--progress")
    assert progress_lines(text, "counting: 1/1 score files (100%)"), text
    assert progress_lines(text, "writing shards: 2/2 samples (100%), shards 2/2"), text
    again = run("filter", scored, *shards, "--progress")  # resumed: the whole shards count as done
    assert "already whole" in again and progress_lines(again, "writing shards: 2/2 samples (100%), shards 2/2"), again
    assert progress_lines(run("filter", scored, "--dry-run", "--progress"), "counting: 1/1")
    for quiet in (("--no-progress",), (), ("-q", "--progress")):
        for args in (("filter", scored, *shards), ("dedup", scored)):
            text = run(*args, *quiet)
            assert not [line for line in text.splitlines() if "elapsed" in line], (args, quiet, text)
    text = run("dedup", scored, "--progress")
    assert progress_lines(text, "dedup: reading scores: 2/2 rows (100%), shards 1/1"), text
    assert progress_lines(text, "dedup: 4/4 passes (100%)"), text  # exact, near, groups, write


def test_dedup_says_what_the_run_lacks_before_reading_it(scored, tmp_path):
    """A configuration error (a kind the run has no data for) comes before any row is read: one
    line, no progress line before it."""
    result = invoke("dedup", scored, "--kind", "semantic", "--semantic-threshold", "0.99", "--progress")
    assert result.exit_code == 2 and "--save-embeddings" in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output


def test_help_and_validate_stay_light(shards):
    """The grouped help costs no import: `wdsfilter --help`, every command's --help and a validate
    run load neither torch nor pyarrow (the validator installs and starts light)."""
    import subprocess
    import sys
    code = ("import sys\nfrom wdsfilter.cli import main\n"
            f"for args in (['--help'], *([n, '--help'] for n in {sorted(CODES)!r}), ['validate', {shards[1]!r}, '-j', '1', '-q']):\n"
            "    try:\n        main(args)\n    except SystemExit:\n        pass\n"
            "print('HEAVY', sorted(m for m in ('torch', 'pyarrow', 'open_clip') if m in sys.modules), file=sys.stderr)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert "HEAVY []" in proc.stderr, proc.stderr[-2000:]
