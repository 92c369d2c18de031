"""Every case of sample_shards/broken/ behaves in the stream as docs/stages.md documents:
the bad sample is dropped or fixed and counted under its reason, and nothing else is lost."""
import json
import os
import tarfile

import pytest

from wdsfilter import StageConfig
from wdsfilter.core.specs import split_name
from wdsfilter.stream.pipeline import sample_pipeline

BROKEN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "sample_shards", "broken")
CASES = {c["case"]: c for c in json.load(open(os.path.join(BROKEN, "MANIFEST.json")))["cases"]}

# case -> (StageConfig options, dropped counts, noted counts at least)
EXPECTED = {
    "dotted-basenames": ({}, {"dotted_basename": 1}, {}),  # both dotted samples collapse into key "img"
    "uppercase-ext": ({}, {}, {}),
    "nonadjacent": ({}, {}, {"nonadjacent_key": 1}),
    "split": ({}, {"missing_caption": 1, "missing_image": 1}, {}),
    "truncated": ({}, {"truncated_tar": 1}, {}),
    "corrupt-jpeg": ({}, {"corrupt_image": 2}, {}),
    "zero-byte": ({}, {"missing_image": 1, "missing_caption": 1}, {"empty_member": 2}),
    "invalid-json": ({"caption_key": "json:caption"}, {"invalid_json": 1}, {}),
    "non-utf8": ({}, {"invalid_utf8": 1}, {}),
    "bomb": ({}, {"oversized_image": 1}, {}),
    "unsafe": ({}, {}, {"unsafe_member": 3}),
    "image-token": ({"image_token": "<__dj__image>"}, {}, {"foreign_image_token": 2}),
    "text-only-image-only": ({}, {"missing_image": 1, "missing_caption": 1}, {}),
    "keys-misc": ({"caption_key": "txt;json:caption"}, {"empty_caption": 2},
                  {"no_extension": 2, "duplicate_member": 1}),
    "corrupt-video": ({"image_key": "jpg;mp4"}, {}, {}),  # videos stay bytes; the scorers give the reasons
}


def test_every_manifest_case_has_an_expectation():
    assert set(CASES) == set(EXPECTED)


def keys_in(shard):
    keys = []
    with tarfile.open(os.path.join(BROKEN, shard)) as tar:
        try:
            for info in tar:
                key, _ = split_name(info.name, "last-dot")
                if key and key not in keys:
                    keys.append(key)
        except tarfile.ReadError:
            pass
    return keys


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_broken_case(case):
    options, dropped, noted = EXPECTED[case]
    spec = CASES[case]
    urls = [os.path.join(BROKEN, s) for s in spec["shards"]]
    p = sample_pipeline(urls, StageConfig(**options))
    samples = list(p)
    tally = p.tally
    assert dict(tally.dropped) == dropped
    for reason, count in noted.items():
        assert tally.notes[reason] == count, reason
    # Nothing else is lost: every sample the manifest does not name comes out.
    bad_keys = {e["key"] for e in spec["expect"]}
    out = {s["__key__"] for s in samples}
    expected_good = [k for s in spec["shards"] for k in keys_in(s) if k not in bad_keys and not k.startswith("img.")]
    if case == "truncated":
        expected_good = expected_good[: spec["complete_samples_before_break"]]
    if case == "keys-misc":
        expected_good = [k for k in expected_good if k != "000010"]  # duplicate member: kept (first wins)
        assert "000010" in out
    if case in ("unsafe", "image-token", "uppercase-ext", "nonadjacent"):
        expected_good += [k for k in bad_keys if k]  # fixed or cleaned, not dropped
    assert set(expected_good) <= out, set(expected_good) - out
    for reason in dropped:
        example = tally.examples[reason][0]
        assert example.shard in urls


def test_dotted_basenames_with_last_dot_rekeying():
    url = os.path.join(BROKEN, "dotted-basenames-000000.tar")
    samples = list(sample_pipeline([url], StageConfig(rekey="last-dot")))
    assert {"img.v2.0001", "img.v2.0002"} <= {s["__key__"] for s in samples}


def test_image_token_is_normalised_in_captions():
    url = os.path.join(BROKEN, "image-token-000000.tar")
    samples = list(sample_pipeline([url], StageConfig(image_token="<__dj__image>")))
    assert not any("<image>" in s["caption"] for s in samples)
    assert sum("<__dj__image>" in s["caption"] for s in samples) == 3


def test_all_broken_shards_together_keep_every_good_sample():
    urls = sorted(os.path.join(BROKEN, f) for f in os.listdir(BROKEN) if f.endswith(".tar"))
    p = sample_pipeline(urls, StageConfig(caption_key="txt;json:description", image_token="<__dj__image>"))
    samples = list(p)
    assert len(samples) > 40 and p.tally.samples_out == len(samples)
    assert {"truncated_tar", "corrupt_image", "oversized_image", "invalid_utf8"} <= set(p.tally.dropped)
