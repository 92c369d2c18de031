import pytest

from wdsfilter import ConfigError, KeySpec, StageConfig
from wdsfilter.core.specs import FieldRef, find_caption, split_name


@pytest.mark.parametrize("text, alternatives", [
    ("txt", [FieldRef("txt")]),
    ("json:description", [FieldRef("json", ("description",))]),
    ("json:meta.caption", [FieldRef("json", ("meta", "caption"))]),
    ("TXT; json:caption ;json:description", [FieldRef("txt"), FieldRef("json", ("caption",)),
                                            FieldRef("json", ("description",))]),
    ("jpg;png;jpeg;webp", [FieldRef(e) for e in ("jpg", "png", "jpeg", "webp")]),
])
def test_spec_parses_and_round_trips(text, alternatives):
    spec = KeySpec.parse(text)
    assert list(spec.alternatives) == alternatives
    assert KeySpec.parse(str(spec)) == spec


@pytest.mark.parametrize("bad", ["", "  ", "json:", ":caption", "txt;;jpg", "json:a..b", "j pg", "json:a b"])
def test_malformed_spec_is_a_config_error(bad):
    with pytest.raises(ConfigError, match="spec"):
        StageConfig(caption_key=bad)


def test_find_caption_alternatives_nested_and_reasons():
    spec = KeySpec.parse("txt;json:meta.caption;json:description")
    assert find_caption({"json": b'{"meta": {"caption": "nested"}}'}, spec) == ("nested", None)
    assert find_caption({"txt": b"plain", "json": b'{"description": "d"}'}, spec) == ("plain", None)
    assert find_caption({"json": b'{"description": "d"}'}, spec) == ("d", None)
    assert find_caption({"json": b'{"other": 1}'}, spec) == (None, "missing_caption")
    assert find_caption({"json": b'{"description": "a red'}, spec) == (None, "invalid_json")
    assert find_caption({"txt": b"caf\xe9"}, spec) == (None, "invalid_utf8")
    assert find_caption({"txt": b"  \n"}, spec) == (None, "empty_caption")
    # A broken first alternative does not hide a good second one.
    assert find_caption({"txt": b"caf\xe9", "json": b'{"description": "ok"}'}, spec) == ("ok", None)


@pytest.mark.parametrize("name, rekey, expected", [
    ("000001.jpg", "first-dot", ("000001", "jpg")),
    ("dir/sub/000001.seg.png", "first-dot", ("dir/sub/000001", "seg.png")),
    ("img.v2.0001.jpg", "first-dot", ("img", "v2.0001.jpg")),
    ("img.v2.0001.jpg", "last-dot", ("img.v2.0001", "jpg")),
    ("dir.with.dots/img.jpg", "last-dot", ("dir.with.dots/img", "jpg")),
    ("README", "first-dot", (None, None)),
    (".DS_Store", "last-dot", (None, None)),
    ("trailing.", "first-dot", (None, None)),
])
def test_split_name(name, rekey, expected):
    assert split_name(name, rekey) == expected


def test_config_validates_at_once():
    with pytest.raises(ConfigError, match="rekey"):
        StageConfig(rekey="middle-dot")
    with pytest.raises(ConfigError, match="image_token"):
        StageConfig(token_mode="normalise")
    with pytest.raises(ConfigError, match="max_pixels"):
        StageConfig(max_pixels=0)


def test_config_file(tmp_path):
    path = tmp_path / "cfg.json"
    path.write_text('{"caption_key": "json:description", "max_pixels": 1000}')
    cfg = StageConfig.from_file(str(path))
    assert str(cfg.caption_spec) == "json:description" and cfg.max_pixels == 1000
    path.write_text('{"caption_keys": "txt"}')
    with pytest.raises(ConfigError, match="unknown option"):
        StageConfig.from_file(str(path))
