"""Second code review's findings: signed URLs as shards, no source URL secrets in published
outputs, bounded memory when copying kept members, and what a run counts as its own files."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _python(code: str) -> str:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.path.join(ROOT, "tests"))
    return subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, env=env,
                          timeout=120).stdout


def test_ctrl_c_asks_only_the_stopped_command_whether_it_resumes():
    """On Ctrl-C the CLI asks whether the stopped command has --resume: by its name only, without
    importing every other command's module (the scoring engine) on the way out."""
    out = _python("import sys, json; from wdsfilter.cli import _resumable; "
                  "r = [_resumable('validate'), _resumable('nope'), _resumable(None)]; "
                  "print(json.dumps([r, sorted(m for m in sys.modules if m.endswith('.cli'))]))")
    answers, loaded = json.loads(out)
    assert answers == [False, False, False]
    assert "wdsfilter.validate.cli" in loaded
    assert not {"wdsfilter.score.cli", "wdsfilter.filtering.cli", "wdsfilter.dedup.cli"} & set(loaded), loaded
