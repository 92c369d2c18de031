"""The public surface of wdsfilter.score: the extension API is importable from the package, and
what needs torch is imported only when asked for."""
import subprocess
import sys
import textwrap


def _run(code: str):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)


def test_extension_api_without_torch_until_asked():
    proc = _run("""
        import sys
        sys.modules["torch"] = None  # a core-only install: any "import torch" fails
        import wdsfilter.score as ws
        from wdsfilter.score import Scorer, DetectorBackend, NothingScoredError, ScoreConfig, score
        from wdsfilter.score.scorers.base import Scorer as Base
        assert Scorer is Base and issubclass(NothingScoredError, Exception)
        print(sorted(set(ws.__all__) - set(dir(ws))))
        try:
            ws.NoSuchThing
        except AttributeError as e:
            print("AttributeError", e)
    """)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    # The lazy names are not module attributes until first use; each resolves when asked.
    assert set(eval(lines[0])) <= {"Scorer", "ClipScorer", "OcrScorer", "DetectorBackend", "score_on_ray",
                                   "NothingScoredError"}
    assert lines[1].startswith("AttributeError") and "NoSuchThing" in lines[1]


def test_extension_api_resolves_to_the_real_classes():
    import wdsfilter.score as ws
    from wdsfilter.score.ocr_backends.base import DetectorBackend
    from wdsfilter.score.ray_runner import score_on_ray
    from wdsfilter.score.scorers.clip import ClipScorer
    from wdsfilter.score.scorers.ocr import OcrScorer
    assert ws.ClipScorer is ClipScorer and ws.OcrScorer is OcrScorer
    assert ws.DetectorBackend is DetectorBackend and ws.score_on_ray is score_on_ray
    assert issubclass(ws.ClipScorer, ws.Scorer) and issubclass(ws.OcrScorer, ws.Scorer)


def test_config_errors_of_score_come_before_torch_is_imported(tmp_path):
    """A wrong caption key, scorer name or output folder: `wdsfilter score` answers with the
    ConfigError (exit 2) while torch (and open_clip) are still not imported."""
    import os
    shard = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "sample_shards", "images-000000.tar"))
    taken = tmp_path / "taken"
    (taken / "done").mkdir(parents=True)
    (taken / "done" / "x.json").write_text("{}")
    proc = _run(f"""
        import sys
        from click.testing import CliRunner
        from wdsfilter.cli import main
        cases = [["--caption-key", "nope"], ["--scorer", "nosuch"], ["--min", "clip_score=high"],
                 ["--out", {str(taken)!r}]]
        for extra in cases:
            args = ["score", {shard!r}, "--out", {str(tmp_path / "out")!r}, "--device", "cpu", *extra]
            r = CliRunner().invoke(main, args)
            print(r.exit_code, "torch" in sys.modules or "open_clip" in sys.modules, r.output.splitlines()[0])
    """)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 4, proc.stdout
    for line in lines:
        assert line.startswith("2 False "), line
    assert "no sample of the first shard" in lines[0] and "caption key 'nope'" in lines[0]
    assert "use --caption-key txt" in lines[0]  # one line: the fix on it, not on a line below
    assert "unknown scorer 'nosuch'" in lines[1]
    assert "'high' is not a number" in lines[2]
    assert "holds completion markers but no run.json" in lines[3]


def test_a_script_without_the_main_guard_gets_a_clear_error(tmp_path):
    """Model workers are spawned: they import the user's script again. A script that scores at
    import time gets, from the worker, the ConfigError naming the main guard, and from the run a
    WorkerError that names it too; not a bare "worker died"."""
    import os
    root = os.path.normpath(os.path.join(os.path.dirname(__file__), ".."))
    script = tmp_path / "no_guard.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {root!r})
        from wdsfilter.score import score
        score([{os.path.join(root, "sample_shards", "images-000000.tar")!r}], out={str(tmp_path / "out")!r},
              scorers=["tools.trace_modules:LumaScorer"], devices=("cpu", "cpu"), workers=0, progress=False)
    """))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, cwd=root)
    assert proc.returncode != 0
    assert "wdsfilter scoring was started while a worker process was importing your script" in proc.stderr
    assert "died while starting" in proc.stderr and 'if __name__ == "__main__":' in proc.stderr


def test_the_rekey_hint_names_a_flag_score_has(tmp_path):
    """Dotted basenames (img.v2.0001.jpg): the first-shard check tells to use --rekey last-dot, and
    `wdsfilter score --rekey last-dot` takes it (the run then scores every sample)."""
    import io
    import os
    import tarfile

    from click.testing import CliRunner
    from PIL import Image

    from wdsfilter.cli import main
    root = os.path.normpath(os.path.join(os.path.dirname(__file__), ".."))
    shard = tmp_path / "dotted.tar"
    with tarfile.open(shard, "w") as tar:
        for i in range(4):
            buf = io.BytesIO()
            Image.new("RGB", (16, 16), (60 * i, 0, 0)).save(buf, "PNG")
            for ext, data in (("png", buf.getvalue()), ("txt", f"red {i}".encode())):
                info = tarfile.TarInfo(f"img.v2.{i:04d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    args = ["score", str(shard), "--scorer", "tools.trace_modules:LumaScorer", "--device", "cpu", "--workers", "0",
            "--no-progress"]
    sys.path.insert(0, root)
    first = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "a")])
    assert first.exit_code == 2 and "--rekey last-dot" in first.output
    second = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "b"), "--rekey", "last-dot"])
    assert second.exit_code == 0, second.output
    assert "scored 4 of 4 samples" in second.output
