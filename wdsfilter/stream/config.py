"""StageConfig: every option of the sample stages, with safe defaults, validated at once."""
from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any, Dict, Optional, Sequence, Tuple, Union

from ..core.errors import ConfigError
from ..core.specs import DEFAULT_CAPTION_KEY, DEFAULT_IMAGE_KEY, REKEY_MODES, KeySpec
from ..core.units import parse_size
from ..storage.remote_options import RemoteOptions, parse_storage_options, redact_options

TOKEN_MODES = ("auto", "normalise", "strip", "keep")
OVERSIZE_MODES = ("skip", "reduce")
# Image tokens of popular multimodal data formats; a caption carrying one that is not the
# configured token was prepared for another model.
KNOWN_IMAGE_TOKENS = ("<__dj__image>", "<image>", "<img>", "<|image|>", "<|image_pad|>", "<ImageHere>")

# The CLIs' --max-bytes KIND=SIZE -> the StageConfig field it sets.
BYTE_CAPS = {"text": "max_text_bytes", "json": "max_json_bytes", "image": "max_image_bytes",
             "video": "max_video_bytes", "other": "max_other_bytes", "decompressed": "max_decompressed_bytes"}


def parse_byte_caps(items: Sequence[str]) -> Dict[str, int]:
    """['image=128MiB', 'text=1MB'] -> {"max_image_bytes": ..., "max_text_bytes": ...}."""
    caps = {}
    for item in items:
        kind, sep, size = item.partition("=")
        field = BYTE_CAPS.get(kind.strip().lower())
        if not sep or field is None:
            raise ConfigError(f"--max-bytes {item!r}: expected KIND=SIZE with KIND one of {', '.join(BYTE_CAPS)} "
                              f"(e.g. --max-bytes image=128MiB)")
        caps[field] = parse_size(size, f"--max-bytes {kind}")
    return caps


@dataclass
class StageConfig:
    # Where the caption and the image live (see wdsfilter.core.specs for the syntax).
    caption_key: str = DEFAULT_CAPTION_KEY
    image_key: str = DEFAULT_IMAGE_KEY
    # Member name -> key: "first-dot" (webdataset's rule) or "last-dot" (for dotted basenames).
    rekey: str = "first-dot"
    # How many open samples the grouper holds, so members of one key that are a few members
    # apart in the tar are merged instead of becoming two half-samples.
    group_window: int = 8
    # Byte caps per kind of member (the kinds: wdsfilter.stream.members). A member over its cap is streamed
    # past without being read into memory and counted as oversized_member; the caps bound a
    # worker's memory on any shard. No real LAION, DataComp or WebVid sample comes near them.
    max_text_bytes: int = 4 << 20
    max_json_bytes: int = 16 << 20
    max_image_bytes: int = 64 << 20
    max_video_bytes: int = 256 << 20
    max_other_bytes: int = 64 << 20
    # Decompressed bytes of one compressed shard (.tar.gz: a zip bomb ends here, counted as a
    # truncated shard); a compressed member (.txt.gz) is held to its kind's cap instead.
    max_decompressed_bytes: int = 16 << 30
    # Bytes the grouping window may hold: past this, its oldest samples move on early.
    group_bytes: int = 128 << 20
    # Bytes of one sample's members together: past this it is emptied and dropped
    # (oversized_sample). Frames named clip.000001.jpg all share the key "clip" and would make
    # one sample as big as the shard. None: twice the largest member cap (512 MiB by default).
    max_sample_bytes: Optional[int] = None
    # Size guard: dimensions come from the header; larger images are never decoded.
    max_pixels: int = 64_000_000
    max_side: Optional[int] = None
    oversize: str = "skip"  # or "reduce": decode JPEGs at 1/2..1/8 scale (draft mode) to fit
    image_mode: str = "RGB"
    # (short side, long side) the consumer of the images needs: larger JPEGs are decoded at a
    # reduced DCT scale (1/2, 1/4, 1/8) that keeps both. The scoring engine sets it from its
    # scorers (a 224 px CLIP needs far fewer pixels than a 1024 px photo); None: full size.
    decode_floor: Optional[Tuple[int, int]] = None
    # Keep an image member's bytes beside its decoded image (sample["__image_bytes__"]): the hash
    # scorer's sha256 is of the bytes, and the shard is read once. The scoring engine sets it from
    # its scorers (Scorer.image_bytes).
    keep_image_bytes: bool = False
    # Decode images at all: False leaves sample["image"] the member's bytes, unchecked (a scoring
    # run whose scorers read captions or image headers only: Scorer.image_pixels).
    decode_pixels: bool = True
    # Leave a JPEG that passes the size guard undecoded (its header read, its bytes kept as with
    # keep_image_bytes): a consumer decodes it elsewhere (the CLIP scorer's --decode-device, on the
    # model's device). Set by the scoring engine from its scorers; other images decode as usual.
    defer_jpeg: bool = False
    # Special tokens: the image token the user's model expects, and what to do with others.
    image_token: Optional[str] = None
    token_mode: str = "auto"  # auto: normalise when image_token is set, else keep
    extra_tokens: Tuple[str, ...] = ()
    known_image_tokens: Tuple[str, ...] = KNOWN_IMAGE_TOKENS
    # Safety: nothing that executes code unless asked.
    allow_unsafe: bool = False
    allow_pipe: bool = False
    # Remote shards (s3://, gs://, hf://, http(s)://) are read when named; False forbids network
    # reads (CI). storage_options go to the fsspec filesystem (endpoint, profile, key...): they
    # are never written (to_dict hides their values). The retry settings: remote.RemoteOptions.
    allow_remote: bool = True
    storage_options: Dict[str, Any] = field(default_factory=dict)
    remote_attempts: int = 8
    remote_backoff_seconds: float = 0.5
    remote_block_bytes: int = 8 << 20
    remote_readahead: int = 4
    # A remote object's retries in all (bytes received do not renew them), and the transfer floor:
    # a read slower than remote_speed_limit bytes/s (or "1KiB/s") over remote_speed_time seconds
    # of waiting is abandoned and asked again; 0 = no floor (docs/remote.md, "Bounds").
    remote_retry_budget: int = 16
    remote_speed_limit: Union[int, str] = 1024
    remote_speed_time: float = 60.0
    # A pipe: command or download that sends nothing for this many seconds while it is being read
    # is killed and its shard fails (scoring: no marker), instead of hanging the run. 0 = never.
    stream_idle_seconds: float = 600.0
    # Watchdog: raise when this many samples were read with no output at all, or when the stages
    # spent this many seconds producing the next sample (named: the shard and member). 0 = off.
    starvation_samples: int = 500
    starvation_seconds: float = 300.0
    # Pass markers downstream instead of dropping silently: a reject marker for each dropped sample
    # and a shard_end marker after each shard (markers.py; the scoring engine gives every sample
    # a row and completes score files shard by shard).
    emit_rejects: bool = False
    # Raise a ConfigError when no sample of the first shard has the caption or image key.
    check_first_shard: bool = True

    @property
    def sample_bytes(self) -> int:
        """The bytes one sample may hold (max_sample_bytes, or twice the largest member cap)."""
        if self.max_sample_bytes is not None:
            return self.max_sample_bytes
        return 2 * max(self.max_text_bytes, self.max_json_bytes, self.max_image_bytes, self.max_video_bytes,
                       self.max_other_bytes)

    def __post_init__(self):
        self.caption_spec = KeySpec.parse(self.caption_key, "caption key")
        self.image_spec = KeySpec.parse(self.image_key, "image key")
        if self.rekey not in REKEY_MODES:
            raise ConfigError(f"rekey must be one of {REKEY_MODES}, got {self.rekey!r}")
        if self.token_mode not in TOKEN_MODES:
            raise ConfigError(f"token_mode must be one of {TOKEN_MODES}, got {self.token_mode!r}")
        if self.oversize not in OVERSIZE_MODES:
            raise ConfigError(f"oversize must be one of {OVERSIZE_MODES}, got {self.oversize!r}")
        if self.token_mode == "normalise" and not self.image_token:
            raise ConfigError("token_mode='normalise' needs image_token (e.g. image_token='<__dj__image>')")
        if self.max_pixels is not None and self.max_pixels <= 0:
            raise ConfigError(f"max_pixels must be positive, got {self.max_pixels}")
        if isinstance(self.stream_idle_seconds, bool) or not isinstance(self.stream_idle_seconds, (int, float)) \
                or not self.stream_idle_seconds >= 0:
            raise ConfigError(f"stream_idle_seconds must be >= 0 (0: never), got {self.stream_idle_seconds!r}")
        if self.group_window < 1:
            raise ConfigError(f"group_window must be >= 1, got {self.group_window}")
        for name in ("max_text_bytes", "max_json_bytes", "max_image_bytes", "max_video_bytes",
                     "max_other_bytes", "max_decompressed_bytes", "group_bytes", "max_sample_bytes"):
            value = getattr(self, name)
            if value is None and name == "max_sample_bytes":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive number of bytes, got {value!r}")
        if self.decode_floor is not None:
            floor = tuple(self.decode_floor)
            if len(floor) != 2 or not all(isinstance(v, int) and v >= 0 for v in floor):
                raise ConfigError(f"decode_floor must be (short side, long side) in pixels, got {self.decode_floor!r}")
            self.decode_floor = floor
        if not isinstance(self.storage_options, dict):
            raise ConfigError(f"storage_options must be a dict of fsspec options, got {type(self.storage_options).__name__}")
        self.remote_speed_limit = parse_rate(self.remote_speed_limit)
        self.remote_options()  # checks the retry settings
        self.extra_tokens = tuple(self.extra_tokens)
        self.known_image_tokens = tuple(self.known_image_tokens)

    @property
    def effective_token_mode(self) -> str:
        if self.token_mode == "auto":
            return "normalise" if self.image_token else "keep"
        return self.token_mode

    def to_dict(self) -> dict:
        """The options as they may be written (run.json, reports): storage option values hidden."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["storage_options"] = redact_options(self.storage_options)
        return d

    def remote_options(self):
        """How this stage reads remote shards (picklable, for workers that open their own)."""
        return RemoteOptions(storage_options=dict(self.storage_options), attempts=self.remote_attempts,
                             retry_budget=self.remote_retry_budget, backoff_seconds=self.remote_backoff_seconds,
                             block_bytes=self.remote_block_bytes, readahead=self.remote_readahead,
                             idle_seconds=self.stream_idle_seconds, speed_limit=self.remote_speed_limit,
                             speed_seconds=self.remote_speed_time)

    @classmethod
    def from_file(cls, path: str, **overrides) -> "StageConfig":
        """Read a JSON or YAML config file (keys are the field names above)."""
        with open(path) as f:
            text = f.read()
        if path.endswith((".yaml", ".yml")):
            try:
                import yaml
            except ImportError as e:
                raise ConfigError(f"{path}: reading YAML needs PyYAML (pip install pyyaml), or use JSON") from e
            data = yaml.safe_load(text) or {}
        else:
            data = json.loads(text)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"{path}: unknown option(s) {unknown}; known: {sorted(known)}")
        data.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**data)


def parse_rate(value) -> int:
    """A transfer rate as people write it (1024, "1KiB", "1KiB/s", "50kB/s") -> bytes/s; 0: none."""
    if isinstance(value, str):
        text = value.strip()
        text = text[:-2] if text.lower().endswith("/s") else text
        if text.strip() in ("0", "0.0"):
            return 0
        return parse_size(text, "remote_speed_limit (--remote-speed-limit)")
    return value


def config_or_options(config, options: dict, name: str = "config", kind: str = "StageConfig") -> None:
    """The front door of every API that takes either a config object or its options one by one:
    both at once is a ConfigError naming the options given (None and empty values do not count)."""
    given = [k for k, v in options.items() if v is not None and not (isinstance(v, (str, dict, list, tuple)) and not v)]
    if config is not None and given:
        raise ConfigError(f"pass either {name}={kind}(...) or individual options, not both "
                          f"(got {name}= and {', '.join(sorted(given))})")


# -- the stage options on the command line ------------------------------------------------------------
# Declared once for every command that reads shards (`validate`, `score`): flag, parameter, its
# click settings and help. Each sets the StageConfig field of its name (max_bytes: several, by
# parse_byte_caps; storage_options: parsed by remote.parse_storage_options).
STAGE_OPTIONS = (
    ("--caption-key", "caption_key", {}, "Caption key spec, e.g. txt, json:description, 'txt;json:caption' "
                                         "[default: txt]."),
    ("--image-key", "image_key", {}, "Image key spec, e.g. 'jpg;png;webp' or mp4 [default: jpg;png;jpeg;webp]."),
    ("--rekey", "rekey", {"type": "rekey"}, "Member name -> key split: first-dot (webdataset's) or last-dot "
                                            "(dotted basenames) [default: first-dot]."),
    ("--image-token", "image_token", {}, "The image token your model expects, e.g. '<__dj__image>'; others are "
                                         "reported (validate) or normalised (token_mode)."),
    ("--max-pixels", "max_pixels", {"type": "positive"}, "Size guard, from headers [default: 64000000]."),
    ("--max-bytes", "max_bytes", {"multiple": True, "metavar": "KIND=SIZE"},
     "Byte cap of one member, KIND text, json, image, video, other, or decompressed (a .tar.gz shard); over it a "
     "member is skipped unread. Repeatable [defaults: docs/stages.md]."),
    ("--allow-pipe", "allow_pipe", {"is_flag": True}, "Accept pipe: URLs (they run shell commands)."),
    ("--allow-remote/--no-remote", "allow_remote", {}, "Read s3://, gs://, hf://, http(s):// shards named here (the "
                                                       "default: a URL you name is read); --no-remote forbids network "
                                                       "reads. (filter's --allow-remote is about the URLs a run "
                                                       "folder names: off unless given.)"),
    ("--remote-speed-limit", "remote_speed_limit", {"metavar": "RATE"},
     "The transfer floor of a remote read (curl's --speed-limit): slower than RATE (bytes/s, or 1KiB/s) over "
     "--remote-speed-time seconds of waiting, the read is abandoned and asked again; 0: no floor [default: 1KiB/s]."),
    ("--remote-speed-time", "remote_speed_time", {"type": "seconds", "metavar": "SECONDS"},
     "The window of --remote-speed-limit (curl's --speed-time) [default: 60]."),
    ("--remote-retry-budget", "remote_retry_budget", {"type": "count", "metavar": "N"},
     "Retries of one remote object in all, with back-off; bytes received do not renew them, so a server that "
     "sends a byte then resets cannot hold a run [default: 16]."),
    ("--storage-option", "storage_options", {"multiple": True, "metavar": "KEY=VALUE"},
     "An fsspec storage option for remote shards (endpoint_url=..., profile=..., anon=true); repeatable; never "
     "written anywhere. See docs/remote.md."),
)
# Where the stage options show in a command's --help (wdsfilter/core/clihelp.py): the keys first.
STAGE_INPUT = ("caption_key", "image_key", "rekey", "image_token", "max_pixels", "max_bytes", "allow_pipe")
STAGE_REMOTE = ("allow_remote", "remote_speed_limit", "remote_speed_time", "remote_retry_budget", "storage_options")


def stage_options(command):
    """The STAGE_OPTIONS on a click command; every one is None (or empty) when not given, so a
    config file or recipe decides (stage_overrides)."""
    import click
    types = {"rekey": click.Choice(REKEY_MODES), "positive": click.IntRange(min=1), "count": click.IntRange(min=0),
             "seconds": click.FloatRange(min=0, min_open=True)}
    for flag, name, settings, help_text in reversed(STAGE_OPTIONS):
        settings = dict(settings)
        if "type" in settings:
            settings["type"] = types[settings["type"]]
        if not settings.get("multiple"):
            settings["default"] = None
        command = click.option(flag, name, help=help_text, **settings)(command)
    return command


def stage_overrides(**given) -> Dict[str, Any]:
    """StageConfig fields from the STAGE_OPTIONS' values (as click passes them): only those given."""
    values = dict(given)
    caps = parse_byte_caps(values.pop("max_bytes", None) or ())
    values["storage_options"] = parse_storage_options(values.pop("storage_options", None) or ()) or None
    return {**{k: v for k, v in values.items() if v is not None}, **caps}
