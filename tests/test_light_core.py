"""The core installs and runs without torch (the validator and stages must stay light)."""
import subprocess
import sys
import textwrap

from shardkit import image_text_members, write_shard


def test_stages_run_with_torch_unavailable(tmp_path):
    url = write_shard(tmp_path / "a.tar", image_text_members(3))
    code = textwrap.dedent(f"""
        import sys
        sys.modules["torch"] = None  # any "import torch" now fails, as in a core-only install
        import wdsfilter
        from wdsfilter.stream.pipeline import sample_pipeline
        print(len(list(sample_pipeline([{url!r}]))), "torch" in sys.modules and sys.modules["torch"] is not None)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["3", "False"]


def test_cli_help_and_version():
    proc = subprocess.run([sys.executable, "-m", "wdsfilter", "--version"], capture_output=True, text=True)
    assert proc.returncode == 0 and "wdsfilter, version" in proc.stdout
    from click.testing import CliRunner
    from wdsfilter.cli import main
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    for name in main.commands:
        sub = CliRunner().invoke(main, [name, "--help"])
        assert sub.exit_code == 0 and "Usage" in sub.output, name


def _cli_without(modules, args, cwd):
    """`wdsfilter ARGS` in a process where importing any of `modules` fails, as in an install
    without the [score] extra (or with open_clip alone missing)."""
    code = textwrap.dedent(f"""
        import sys
        for name in {list(modules)!r}:
            sys.modules[name] = None
        from wdsfilter.cli import main
        main({list(args)!r}, prog_name="wdsfilter")
    """)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=cwd)


def test_scoring_without_its_extra_is_a_configuration_error_naming_the_install(tmp_path):
    """A light install (`pip install wdsfilter`) asked to score: exit 2 and one line naming what to
    install, for each scorer and the loader; not 'internal error ... a bug in wdsfilter' (exit 3),
    which `--scorer clip` gave when open_clip was missing."""
    url = write_shard(tmp_path / "a.tar", image_text_members(3))
    for scorer in ("clip", "ocr"):
        proc = _cli_without(["torch", "open_clip"], ["score", url, "--out", str(tmp_path / scorer), "--scorer", scorer],
                            tmp_path)
        assert proc.returncode == 2, proc.stderr
        assert "scoring needs torch, which is not installed: pip install 'wdsfilter[score]'" in proc.stderr
        assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    # torch there, open_clip not: the CLIP scorer says so.
    proc = _cli_without(["open_clip"], ["score", url, "--out", str(tmp_path / "c"), "--scorer", "clip"], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "the CLIP scorer needs open_clip, which is not installed: pip install 'wdsfilter[score]'" in proc.stderr
    code = textwrap.dedent(f"""
        import sys
        sys.modules["torch"] = None
        import wdsfilter
        try:
            wdsfilter.loader([{url!r}], batch_size=2)
        except wdsfilter.ConfigError as e:
            print(e)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "wdsfilter.loader needs torch, which is not installed" in proc.stdout, proc.stderr
