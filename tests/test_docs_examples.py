"""The commands in README.md and docs/*.md exist as written, so the docs cannot silently rot.

Every `wdsfilter COMMAND ...` line (in code blocks, continuation lines joined, and in inline code)
must name a command and only options that command has; every other `--option` in inline code must
be an option of some wdsfilter command, of a tools/ script, or of a named foreign tool. The small
documented runs on the committed sample shards are run, with the exit code the docs give.
"""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from wdsfilter.cli import main

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").glob("*.md"))]

# Options of other programs that the docs mention in inline code (GNU tar, img2dataset, ray,
# open_clip_train), by the program.
FOREIGN = {
    "tar": {"--sort", "--sparse", "--dereference"},
    "img2dataset": {"--output_format", "--caption_col", "--save_additional_columns",
                    "--encode_format", "--resize_mode", "--incremental_mode"},
    "ray start": {"--head", "--num-gpus", "--address"},
    "open_clip_train": {"--train-data", "--train-num-samples"},
    "pip": {"--index-url", "--no-cache-dir", "--no-deps"},
    "uv pip": {"--compile-bytecode", "--no-cache"},
    "pytest": {"--dist"},  # pytest-xdist's
    "huggingface-cli": {"--repo-type", "--local-dir"},
    "curl": {"--speed-limit", "--speed-time"},  # what --remote-speed-limit/--remote-speed-time follow
    "DataComp's resharder.py": {"--subset-file"},
    "py-spy record": {"--subprocesses"},  # how docs/dev.md's profiles were taken
}
OPTION = re.compile(r"(?<![\w-])(--?[a-zA-Z][\w-]*)")


def _options(command) -> set:
    names = {"--debug", "--help", "-h"}
    for param in command.params:
        names.update(param.opts)
        names.update(param.secondary_opts)
    return names


def _tool_options() -> set:
    return {m for path in (ROOT / "tools").glob("*.py")
            for m in re.findall(r"[\"'](--[a-z][\w-]*)[\"']", path.read_text())}


def _code_blocks(text: str):
    for m in re.finditer(r"^```[^\n]*\n(.*?)^```", text, re.S | re.M):
        yield text[:m.start()].count("\n") + 2, m.group(1)


def _command_lines(path: Path):
    """(line number, text) of each `wdsfilter COMMAND ...` invocation in the file."""
    text = path.read_text()
    for first, block in _code_blocks(text):
        joined = re.sub(r"\\\n", " ", block)
        for offset, line in enumerate(joined.splitlines()):
            for part in re.split(r"&&|\|\||;(?=\s)|\|", line.split(" #")[0]):
                part = part.strip().lstrip("$ ").strip()
                if part.startswith("wdsfilter "):
                    yield first + offset, part
    for number, line in enumerate(text.splitlines(), 1):
        for m in re.finditer(r"`(wdsfilter [a-z][^`]*)`", line):
            yield number, m.group(1)


def _invocations():
    for path in DOCS:
        for number, line in _command_lines(path):
            yield pytest.param(line, id=f"{path.name}:{number}")


@pytest.mark.parametrize("line", list(_invocations()))
def test_documented_command_has_its_options(line):
    words = shlex.split(line.replace("[", " ").replace("]", " "))
    name = words[1]
    if name.startswith("-") or name.isupper() or name.endswith(":"):  # --debug, COMMAND, output
        return
    assert name in main.commands, f"'{line}': no command '{name}' (commands: {sorted(main.commands)})"
    known = _options(main.commands[name])
    unknown = [option for word in words[2:] if word.startswith("-")  # `--top/--bottom` names two
               for option in OPTION.findall(word.split("=")[0]) if option not in known]
    assert not unknown, f"'{line}': wdsfilter {name} has no option {unknown}"


def test_every_inline_option_exists_somewhere():
    known = set().union(*(_options(c) for c in main.commands.values()), _tool_options(),
                        *FOREIGN.values())
    stale = []
    for path in DOCS:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for span in re.findall(r"`([^`]*--[a-z][^`]*)`", line):
                stale += [f"{path.name}:{number}: {option}" for option in OPTION.findall(span)
                          if option.startswith("--") and option not in known]
    assert not stale, "options named in the docs that nothing has:\n" + "\n".join(stale)


@pytest.mark.parametrize("args, code", [
    # README "Validate shards before training", first two lines; the CI example's exit codes
    (["validate", "sample_shards/images-000000.tar", "sample_shards/images-000001.tar",
      "sample_shards/json-captions-000000.tar", "sample_shards/ocr-images-000000.tar",
      "sample_shards/videos-000000.tar", "--caption-key", "txt;json:description",
      "--image-key", "jpg;png;jpeg;webp;mp4"], 0),
    (["validate", "sample_shards/broken/"], 1),
])
def test_documented_validate_runs(args, code, monkeypatch):
    monkeypatch.chdir(ROOT)
    result = CliRunner().invoke(main, args)
    assert result.exit_code == code, result.output


def _python_calls():
    """(file:line, function name, keyword names) of each call in the docs' Python blocks."""
    import ast
    for path in DOCS:
        text = path.read_text()
        for m in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M):
            first = text[:m.start()].count("\n") + 2
            source = re.sub(r",\s*\.\.\.\)", ")", m.group(1))  # `f(a, ...)`: "and so on"
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.Call):
                    name = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
                    yield (f"{path.name}:{first + node.lineno - 1}", name,
                           [k.arg for k in node.keywords if k.arg is not None])


def test_documented_python_calls_use_keywords_their_functions_take():
    import inspect

    import wdsfilter
    from wdsfilter.filtering import filter_scores
    from wdsfilter.validate import validate
    functions = {"validate": validate, "filter_scores": filter_scores, "StageConfig": wdsfilter.StageConfig,
                 "sample_pipeline": wdsfilter.sample_pipeline}
    try:
        from wdsfilter.score.scorers.clip import ClipScorer
        from wdsfilter.score.scorers.ocr import OcrScorer
        functions.update(ClipScorer=ClipScorer, OcrScorer=OcrScorer)
    except ImportError:  # the light install: the scorers' snippets are checked where they import
        pass
    wrong = []
    for where, name, keywords in _python_calls():
        if name not in functions:
            continue  # loader() and score() take **options, checked when they are called
        parameters = inspect.signature(functions[name]).parameters
        wrong += [f"{where}: {name}({k}=...)" for k in keywords if k not in parameters]
    assert not wrong, "keywords the functions do not take:\n" + "\n".join(wrong)


def test_readme_install_names_every_extra_of_setup_cfg():
    # README's Install section once left out [scorers]: a user could not learn that the caption
    # and nsfw scorers need it except from the error.
    import configparser
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    extras = set(cfg["options.extras_require"])
    install = README_INSTALL.search((ROOT / "README.md").read_text()).group(1)
    named = set(re.findall(r"pip install '\.\[([a-z]+)\]'", install))
    assert named == extras, f"README's Install section: missing {sorted(extras - named)}, unknown {sorted(named - extras)}"


README_INSTALL = re.compile(r"^## Install\n(.*?)^## ", re.S | re.M)
