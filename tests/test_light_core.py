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
        from wdsfilter.pipeline import sample_pipeline
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
