"""Which open_clip model a user means, resolved without loading weights; then loading it.

    ClipSource.resolve("ViT-B-32", "laion2b_s34b_b79k")      built-in name + pretrained tag
    ClipSource.resolve("ViT-B-32", "/ckpt/model.safetensors") built-in name + local checkpoint
    ClipSource.resolve("local-dir:models/tiny-clip")          folder: open_clip_config.json + weights
    ClipSource.resolve("hf-hub:laion/CLIP-ViT-B-32-laion2B-s34B-b79K")

Resolving reads configs only (no weights), so DataLoader workers can build the image transform
and the tokenizer, and a wrong name or path is a ConfigError before any work starts. Weights are
fetched in `load_model`, in the model worker. open_clip itself falls back to random weights with
a log line when a folder or hub repo has none; here that is an error.
"""
from __future__ import annotations

import contextlib
import difflib
import json
import os
import socket
import tempfile
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Optional
from urllib.parse import urlparse

from ..core.errors import ConfigError, require

LOCAL_DIR = "local-dir:"
HF_HUB = "hf-hub:"
CONFIG_FILE = "open_clip_config.json"
CHECKPOINT_SUFFIXES = (".safetensors", ".bin", ".pth", ".pt")
FOLDER_SUFFIXES = (".safetensors", ".bin", ".pth")  # what open_clip's local-dir loader looks for
RANDOM = "random"  # explicit random weights: for throughput and memory tests, never for filtering
# pretrained=None picks these weights (the most used ones); other models take their first tag.
DEFAULT_TAGS = {"ViT-B-32": "laion2b_s34b_b79k", "ViT-B-16": "laion2b_s34b_b88k", "ViT-L-14": "laion2b_s32b_b82k"}

OFFLINE_ADVICE = ("Without network, pass a local checkpoint: --pretrained /path/to/open_clip_model.safetensors "
                  "(pretrained='/path/...' in Python) with its model name, or --model local-dir:PATH for a folder "
                  "holding open_clip_config.json and the weights. python tools/make_tiny_clip.py builds a tiny "
                  "one offline from the sample shards (models/tiny-clip).")
NAMES_ADVICE = ("See the model names with: python -c \"import open_clip; print(open_clip.list_models())\" and "
                "the weights per name with open_clip.list_pretrained()")


@dataclass
class ClipSource:
    """Architecture, preprocessing and where the weights come from: small, picklable, no tensors."""

    spec: str                      # what open_clip gets as model name: "ViT-B-32", "local-dir:/abs", "hf-hub:org/repo"
    weights: str                   # "tag" | "file" | "folder" | "hub" | "random"
    pretrained: Optional[str]      # the tag or the checkpoint file, for built-in names
    model_cfg: Dict[str, Any]
    preprocess_cfg: Dict[str, Any]
    quick_gelu: bool = False       # the weights were trained with QuickGELU and the config lacks it
    checkpoint: Optional[str] = None
    info: Dict[str, Any] = field(default_factory=dict)  # the "wdsfilter" entry of a tiny model's config

    @property
    def context_length(self) -> int:
        return int(self.model_cfg.get("text_cfg", {}).get("context_length", 77))

    @property
    def is_tiny(self) -> bool:
        return bool(self.info.get("tiny"))

    def weights_text(self) -> str:
        text = {"tag": f"pretrained tag {self.pretrained!r} (downloaded on load)",
                "file": f"checkpoint {os.path.basename(self.pretrained or '')}",
                "folder": f"local folder ({os.path.basename(self.checkpoint or '')})",
                "hub": f"Hugging Face Hub {self.spec[len(HF_HUB):]}",
                "random": "RANDOM weights: scores are meaningless (for throughput/memory tests only)"}[self.weights]
        if self.quick_gelu:
            text += ", QuickGELU as the weights were trained"
        if self.is_tiny:
            scenes = self.info.get("fresh_scenes")
            text += ("; tiny local model trained on sample shards — scores are only meaningful on these shards"
                     f" ({', '.join(self.info.get('trained_on', []))}"
                     + (f", plus {scenes} fresh scenes from their generator" if scenes else "") + ")")
        return text

    # -- where the weights are on this machine ----------------------------------------------
    def local_files(self) -> List[str]:
        """The checkpoint file or model folder load() reads from this machine's disk."""
        if self.weights == "file":
            return [self.checkpoint]
        if self.weights == "folder":
            return [self.spec[len(LOCAL_DIR):]]
        return []

    def moved(self, where: Dict[str, str]) -> "ClipSource":
        """The same model, its checkpoint or folder read at where[its path] (a copy elsewhere)."""
        if self.weights == "file" and self.checkpoint in where:
            return replace(self, pretrained=where[self.checkpoint], checkpoint=where[self.checkpoint])
        folder = self.spec[len(LOCAL_DIR):]
        if self.weights == "folder" and folder in where:
            checkpoint = os.path.join(where[folder], os.path.relpath(self.checkpoint, folder))
            return replace(self, spec=LOCAL_DIR + where[folder], checkpoint=checkpoint)
        return self

    # -- resolving ----------------------------------------------------------------------------
    @classmethod
    def resolve(cls, model: str, pretrained: Optional[str] = None, cache_dir: Optional[str] = None) -> "ClipSource":
        if not isinstance(model, str) or not model.strip():
            raise ConfigError(f"model must be an open_clip model name, local-dir:PATH or hf-hub:ORG/REPO; got {model!r}. "
                              + NAMES_ADVICE)
        model = model.strip()
        if not model.startswith((LOCAL_DIR, HF_HUB)) and os.path.isfile(os.path.join(model, CONFIG_FILE)):
            model = LOCAL_DIR + model  # a model folder given as a plain path
        if model.startswith((LOCAL_DIR, HF_HUB)) and pretrained not in (None, ""):
            raise ConfigError(f"pretrained={pretrained!r} cannot be used with model {model!r}: that form brings its "
                              f"own weights. Drop --pretrained, or pass a model name with --pretrained.")
        if model.startswith(LOCAL_DIR):
            return cls._local_dir(model[len(LOCAL_DIR):])
        if model.startswith(HF_HUB):
            return cls._hf_hub(model[len(HF_HUB):], cache_dir)
        return cls._builtin(model, pretrained)

    @classmethod
    def _local_dir(cls, path: str) -> "ClipSource":
        folder, config, checkpoint = _local_dir_files(path)
        return cls(LOCAL_DIR + folder, "folder", None, config["model_cfg"],
                   _preprocess(config["model_cfg"], config.get("preprocess_cfg")), checkpoint=checkpoint,
                   info=config.get("wdsfilter") or {})

    @classmethod
    def _hf_hub(cls, repo: str, cache_dir: Optional[str]) -> "ClipSource":
        if not repo:
            raise ConfigError("empty repository after 'hf-hub:'; expected hf-hub:ORG/REPO")
        download_pretrained_from_hf = require("open_clip.pretrained", "the CLIP scorer").download_pretrained_from_hf
        try:
            with hub_access() as offline:
                config_path = download_pretrained_from_hf(repo, filename=CONFIG_FILE, cache_dir=cache_dir)
        except Exception as e:
            raise ConfigError(f"could not fetch {CONFIG_FILE} of hf-hub:{repo} ({_why(e, offline)}). "
                              f"{OFFLINE_ADVICE}") from None
        config = _read_json(config_path)
        if "model_cfg" not in config:
            raise ConfigError(f"hf-hub:{repo} has no 'model_cfg' in its {CONFIG_FILE}: not an open_clip model")
        return cls(HF_HUB + repo, "hub", None, config["model_cfg"],
                   _preprocess(config["model_cfg"], config.get("preprocess_cfg")))

    @classmethod
    def _builtin(cls, model: str, pretrained: Optional[str]) -> "ClipSource":
        open_clip = require("open_clip", "the CLIP scorer")

        name = model.replace("/", "-")  # open_clip's own spelling rule (ViT-B/32 -> ViT-B-32)
        model_cfg = open_clip.get_model_config(name)
        if model_cfg is None:
            raise _unknown_model(model, name, open_clip.list_models())
        tags = open_clip.list_pretrained_tags_by_model(name)
        if pretrained in (None, ""):
            if not tags:
                raise ConfigError(f"open_clip knows no pretrained weights for {name}; pass a checkpoint with "
                                  f"--pretrained /path/to/weights, or pretrained='random' for a throughput test")
            pretrained = DEFAULT_TAGS.get(name, tags[0])
        if pretrained == RANDOM:
            return cls(name, "random", None, model_cfg, _preprocess(model_cfg))
        tag_cfg = open_clip.get_pretrained_cfg(name, pretrained)
        if tag_cfg:
            quick = bool(tag_cfg.get("quick_gelu")) and not model_cfg.get("quick_gelu", False)
            return cls(name, "tag", pretrained, model_cfg, _preprocess(model_cfg, tag_cfg), quick_gelu=quick)
        path = os.path.abspath(os.path.expanduser(pretrained))
        if os.path.isdir(path):
            hint = (f"pass --model local-dir:{pretrained} (its config defines the architecture)"
                    if os.path.isfile(os.path.join(path, CONFIG_FILE)) else "pass the checkpoint file inside it")
            raise ConfigError(f"pretrained={pretrained!r} is a folder, not a checkpoint file; {hint}")
        if os.path.isfile(path):
            return cls(name, "file", path, model_cfg, _preprocess(model_cfg), checkpoint=path)
        looks_like_path = os.sep in pretrained or pretrained.endswith(CHECKPOINT_SUFFIXES)
        if looks_like_path:
            raise ConfigError(f"checkpoint {pretrained!r} does not exist. {OFFLINE_ADVICE}")
        raise ConfigError(f"{pretrained!r} is neither a pretrained tag of {name} nor a file. Tags of {name}: "
                          f"{', '.join(tags) or 'none'}. {OFFLINE_ADVICE}")

    # -- the CPU side, no weights ------------------------------------------------------------
    def tokenizer(self):
        import open_clip
        try:
            return open_clip.get_tokenizer(self.spec, context_length=self.context_length)
        except Exception as e:  # an HF tokenizer that needs a download, a malformed folder
            raise ConfigError(f"could not build the tokenizer of {self.spec} ({type(e).__name__}: {e}). "
                              f"{OFFLINE_ADVICE}") from None


def check_model(model: str, pretrained: Optional[str] = None) -> None:
    """resolve's checks that need no torch (open_clip's import imports it: tens of seconds on a busy
    machine): a local-dir: folder, a built-in name, a checkpoint path. Tags and hub repos: resolve."""
    model = model.strip() if isinstance(model, str) else ""
    if model.startswith(LOCAL_DIR):
        _local_dir_files(model[len(LOCAL_DIR):])
    if not model or model.startswith((LOCAL_DIR, HF_HUB)) or os.path.isfile(os.path.join(model, CONFIG_FILE)):
        return  # an empty name: resolve words it
    name = model.replace("/", "-")
    names = builtin_model_names()
    if names is not None and name not in names:
        raise _unknown_model(model, name, sorted(names))
    if isinstance(pretrained, str) and pretrained and pretrained != RANDOM and (
            os.sep in pretrained or pretrained.endswith(CHECKPOINT_SUFFIXES)):
        path = os.path.abspath(os.path.expanduser(pretrained))
        if not os.path.exists(path):
            raise ConfigError(f"checkpoint {pretrained!r} does not exist. {OFFLINE_ADVICE}")


def builtin_model_names() -> Optional[set]:
    """open_clip's model names without importing it: its model_configs/*.json (its own list where it
    is imported: add_model_config's count too). None without open_clip (resolve says so)."""
    import sys
    if sys.modules.get("open_clip") is not None:
        return set(sys.modules["open_clip"].list_models())
    if "open_clip" in sys.modules:  # None there: it cannot be imported (resolve names the install)
        return None
    import importlib.util
    try:
        spec = importlib.util.find_spec("open_clip")
        folder = os.path.join(list(spec.submodule_search_locations)[0], "model_configs")
        return {f[:-len(".json")] for f in os.listdir(folder) if f.endswith(".json")}
    except (ImportError, ValueError, AttributeError, TypeError, IndexError, OSError):
        return None


def _unknown_model(model: str, name: str, names) -> ConfigError:
    if os.path.exists(model) or model.startswith((".", os.sep, "~")):
        return ConfigError(f"model {model!r} is not a model folder (no {CONFIG_FILE} in it). {OFFLINE_ADVICE}")
    close = difflib.get_close_matches(name, list(names), n=3)
    hub = f" A Hugging Face Hub repo is passed as hf-hub:{model}." if model.count("/") == 1 else ""
    return ConfigError(f"unknown CLIP model {model!r}" + (f" (did you mean {', '.join(close)}?)" if close else "")
                       + f". {NAMES_ADVICE}. A model of your own: --model local-dir:PATH.{hub}")


def _local_dir_files(path: str):
    """(folder, config, weights file) of a local-dir: model, or a ConfigError naming what is missing."""
    if not path:
        raise ConfigError("empty path after 'local-dir:'; expected local-dir:/path/to/model-folder")
    folder = os.path.abspath(os.path.expanduser(path))
    config_path = os.path.join(folder, CONFIG_FILE)
    if not os.path.isdir(folder):
        raise ConfigError(f"model folder {path!r} (local-dir:) does not exist. {OFFLINE_ADVICE}")
    if not os.path.isfile(config_path):
        raise ConfigError(f"model folder {path!r} has no {CONFIG_FILE}; a local-dir: model folder holds "
                          f"{CONFIG_FILE} (with model_cfg) and the weights. {OFFLINE_ADVICE}")
    config = _read_json(config_path)
    if "model_cfg" not in config:
        raise ConfigError(f"{config_path} has no 'model_cfg' entry (open_clip's local-dir format)")
    checkpoint = find_checkpoint(folder)
    if checkpoint is None:
        # open_clip would log a warning and score with random weights.
        raise ConfigError(f"model folder {path!r} has a config but no weights "
                          f"(*{', *'.join(FOLDER_SUFFIXES)}). {OFFLINE_ADVICE}")
    return folder, config, checkpoint


def find_checkpoint(folder: str) -> Optional[str]:
    """The weights file open_clip's local-dir loader would pick (safetensors first)."""
    names = sorted(f for f in os.listdir(folder) if f.endswith(FOLDER_SUFFIXES))
    if not names:
        return None
    preferred = ["open_clip_model.safetensors", "open_clip_pytorch_model.safetensors", "open_clip_pytorch_model.bin",
                 "open_clip_pytorch_model.pth", "model.safetensors", "pytorch_model.bin", "pytorch_model.pth", "model.pth"]
    names.sort(key=lambda n: (preferred.index(n) if n in preferred else len(preferred), not n.endswith(".safetensors")))
    return os.path.join(folder, names[0])


def _read_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read {path}: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} is not a JSON object")
    return data


def _preprocess(model_cfg: dict, overlay: Optional[dict] = None) -> dict:
    """The eval preprocessing open_clip's create_model would attach: defaults, then the weights'
    own settings, then the image size of the vision tower."""
    from dataclasses import asdict

    from open_clip.transform import PreprocessCfg, merge_preprocess_dict
    cfg = merge_preprocess_dict(asdict(PreprocessCfg()), overlay or {})
    cfg["size"] = model_cfg.get("vision_cfg", {}).get("image_size", 224)
    return cfg


def token_count(tokenizer, text: str) -> int:
    """How many tokens the caption needs with start/end tokens, before truncation to the context."""
    inner = getattr(tokenizer, "tokenizer", None)  # HFTokenizer / SigLipTokenizer wrap a transformers one
    if hasattr(tokenizer, "encode") and hasattr(tokenizer, "sot_token_id"):  # open_clip SimpleTokenizer
        return len(tokenizer.encode(text)) + 2
    if inner is not None and callable(inner):
        clean = getattr(tokenizer, "clean_fn", None)
        ids = inner(clean(text) if clean else text, truncation=False)["input_ids"]
        return len(ids)
    raise ConfigError(f"cannot count tokens with {type(tokenizer).__name__}; truncation would go uncounted")


# SimpleTokenizer.encode runs BPE over the whole caption, and BPE is quadratic in a word's length:
# one 40 KB word took 75 s (a 4 MB caption, under the text cap, hours), and its cache keeps every
# word it has seen. Only the ids that fit the context are needed: a caption is read up to
# _CAPTION_CHARS (far past 77 tokens), a word is encoded in pieces of _WORD_CHARS (no real word is
# that long; such a piece ends with BPE's end-of-word mark), and the cache is emptied when full.
_CAPTION_CHARS = 1 << 16
_WORD_CHARS = 256
_CACHE_ENTRIES = 1 << 16


def _encode_head(tokenizer, text: str, need: int) -> list:
    """The BPE ids tokenizer.encode(text) starts with, stopping once there are more than `need`."""
    if len(tokenizer.cache) > _CACHE_ENTRIES:  # keep the special tokens (cached as themselves)
        tokenizer.cache = {k: v for k, v in tokenizer.cache.items() if k == v}
    ids, encoder, byte_encoder = [], tokenizer.encoder, tokenizer.byte_encoder
    for match in tokenizer.pat.finditer(tokenizer.clean_fn(text[:_CAPTION_CHARS])):
        word = "".join(byte_encoder[b] for b in match.group().encode("utf-8"))
        for start in range(0, len(word), _WORD_CHARS):
            ids.extend(encoder[t] for t in tokenizer.bpe(word[start:start + _WORD_CHARS]).split(" "))
            if len(ids) > need:
                return ids
    return ids


def tokenize(tokenizer, text: str, context_length: int):
    """(tokens, truncated): the caption's token tensor as tokenizer(text)[0] gives it, and whether
    it was longer than the context, encoding the text once. open_clip's SimpleTokenizer (every
    OpenAI/LAION CLIP) is encoded here exactly as its __call__ does (start, BPE ids, end, cut to the
    context keeping the end token, zero padding); other tokenizers are called, then counted."""
    import torch
    from open_clip.tokenizer import SimpleTokenizer
    if isinstance(tokenizer, SimpleTokenizer) and getattr(tokenizer, "reduction_fn", None) is None:
        head = _encode_head(tokenizer, text, context_length - 1)
        ids = [tokenizer.sot_token_id] + head + [tokenizer.eot_token_id]
        truncated = len(ids) > context_length or len(text) > _CAPTION_CHARS
        if truncated:
            ids = ids[:context_length]
            ids[-1] = tokenizer.eot_token_id
        tokens = torch.zeros(context_length, dtype=torch.long)
        tokens[:len(ids)] = torch.tensor(ids, dtype=torch.long)
        return tokens, truncated
    return tokenizer(text)[0], token_count(tokenizer, text) > context_length


PRECISIONS = ("auto", "fp32", "fp16", "bf16")


def resolve_precision(precision: str, device) -> str:
    """The precision a model runs in on `device` (a torch.device): "auto" is fp16 on CUDA (fp16
    keeps 3 more mantissa bits than bf16: CLIP scores stay within ~1e-3 of fp32, and every CUDA
    GPU has it) and fp32 elsewhere. bf16 is checked on that very device (not on GPU 0)."""
    import torch
    if precision not in PRECISIONS:
        raise ConfigError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if device.type != "cuda":
        return "fp32" if precision == "auto" else precision
    if precision == "auto":
        return "fp16"
    if precision == "bf16" and not bf16_supported(device):
        name = torch.cuda.get_device_name(device)
        raise ConfigError(f"precision bf16 is not supported on {device} ({name}); use --precision fp16 or fp32")
    return precision


def bf16_supported(device) -> bool:
    """Native bf16 on this CUDA device (compute capability 8.0+, i.e. Ampere and later)."""
    import torch
    with torch.cuda.device(device):
        try:
            return bool(torch.cuda.is_bf16_supported(including_emulation=False))
        except TypeError:  # torch < 2.4 has no emulation flag and checks the current device
            return bool(torch.cuda.is_bf16_supported())


def load_model(source: ClipSource, device: str, cache_dir: Optional[str] = None, precision: str = "fp32"):
    """open_clip model on `device`, in eval mode. precision "fp32" keeps fp32 weights; "fp16" or
    "bf16" converts the matrices (linear, conv, attention, projections) to that dtype as open_clip's
    own precision option does, keeping norms and embeddings fp32: half the weight memory, and no
    per-batch weight casts under autocast. Download failures are ConfigErrors."""
    import open_clip

    kwargs: Dict[str, Any] = {"device": device, "precision": precision, "cache_dir": cache_dir}
    with hub_access() as offline:
        if source.weights == "tag":
            from open_clip.pretrained import download_pretrained
            try:
                checkpoint = download_pretrained(open_clip.get_pretrained_cfg(source.spec, source.pretrained),
                                                 cache_dir=cache_dir)
            except Exception as e:
                raise ConfigError(f"could not download weights {source.spec} / {source.pretrained!r} "
                                  f"({_why(e, offline)}). {OFFLINE_ADVICE}") from None
            if not checkpoint:
                raise ConfigError(f"no download source for {source.spec} / {source.pretrained!r}. {OFFLINE_ADVICE}")
            kwargs.update(pretrained=checkpoint, force_quick_gelu=source.quick_gelu)
        elif source.weights == "file":
            kwargs.update(pretrained=source.checkpoint)
        elif source.weights == "hub":
            from open_clip.pretrained import download_pretrained_from_hf
            try:  # open_clip would go on with random weights if this failed
                download_pretrained_from_hf(source.spec[len(HF_HUB):], cache_dir=cache_dir)
            except Exception as e:
                raise ConfigError(f"could not download the weights of {source.spec} ({_why(e, offline)}). "
                                  f"{OFFLINE_ADVICE}") from None
        if source.weights in ("tag", "file", "random"):
            _ensure_registered(source.spec, source.model_cfg)
        try:
            model = open_clip.create_model(source.spec, **kwargs)
        except RuntimeError as e:
            if "state_dict" in str(e) or "size mismatch" in str(e):
                raise ConfigError(f"checkpoint {kwargs.get('pretrained') or source.checkpoint} does not fit model "
                                  f"{source.spec}: {str(e)[:300]}. Pass the model name the weights were trained "
                                  "with.") from None
            raise
    return model.eval()


PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "HTTP_PROXY", "http_proxy")


def hub_unreachable() -> Optional[str]:
    """The Hugging Face hub's host name when it does not resolve (no network), else None. Behind a
    proxy the local resolver says nothing, so the hub is then taken as reachable."""
    try:
        from huggingface_hub import constants
    except ImportError:
        return None
    host = urlparse(constants.ENDPOINT).hostname
    if not host or constants.HF_HUB_OFFLINE or any(os.environ.get(name) for name in PROXY_VARIABLES):
        return None
    try:
        socket.getaddrinfo(host, 443)
    except OSError:
        return host
    return None


@contextlib.contextmanager
def hub_access():
    """Hub downloads inside read only the hub's cache when the hub cannot be reached: without
    network huggingface_hub retries every candidate file for about 25 s, logging each retry, before
    the one error. Yields the unreachable host (None when online)."""
    host = hub_unreachable()
    if host is None:
        yield None
        return
    from huggingface_hub import constants
    constants.HF_HUB_OFFLINE = True
    try:
        yield host
    finally:
        constants.HF_HUB_OFFLINE = False


def _why(error: Exception, offline: Optional[str]) -> str:
    if offline:
        return f"no network: {offline} does not resolve, and the files are not in the Hugging Face cache"
    return f"{type(error).__name__}: {error}"


def _ensure_registered(name: str, model_cfg: dict) -> None:
    """A name registered with open_clip.add_model_config in the parent process is unknown in a
    spawned model worker; the resolved config travels with the source, so register it again."""
    import open_clip
    if open_clip.get_model_config(name) is not None:
        return
    folder = tempfile.mkdtemp(prefix="wdsfilter-clip-config-")
    with open(os.path.join(folder, name + ".json"), "w") as f:
        json.dump(model_cfg, f)
    open_clip.add_model_config(folder)
