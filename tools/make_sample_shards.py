"""Deterministic generator of the small WebDataset shards committed under sample_shards/.

    python tools/make_sample_shards.py [--out sample_shards] [--check]

Running it again reproduces every file byte for byte (with the pinned pillow==13.0.0 and
av==18.1.0 of the [test] extra); --check regenerates into a temporary folder and exits 1 listing
any file that differs. Seeds are fixed (numpy default_rng), tar members have mtime 0, uid/gid 0,
empty user/group names, mode 0o644, a fixed order and GNU format.

Clean shards (images are coloured shapes, e.g. "two green squares on a white background"; about
20% of the image samples carry the caption of a different scene and say "caption_matches": false):
  images-000000.tar, images-000001.tar  img2dataset layout, 32 samples each, keys 000000000..
        000000063; <key>.jpg (most), .png or .webp, plus .txt and .json {key, caption, url, width,
        height, status, caption_matches}; sides 128-256 px.
  json-captions-000000.tar  32 samples, <key>.jpg + <key>.json {description, caption_matches}, no .txt.
  ocr-images-000000.tar     16 samples, 320x240 .png + .txt + .json {has_text, text, ...}: 8 with
        large dark text on a light background, 4 gradients with shapes, 4 random noise.
  videos-000000.tar         8 samples, .mp4 (320x240, 8 fps, 16 frames, yuv420p, H.264) + .txt + .json
        {has_text, text, frames, fps, width, height}: 4 with a burned-in subtitle in every frame, 4
        without (2 moving shapes, 2 blocky noise).

Broken shards (broken/, each with valid jpg+txt+json samples around the broken ones; MANIFEST.json
lists every case and one expected finding per offending member, kinds in FINDING_KINDS):
  dotted-basenames      img.v2.0001.jpg/.txt, img.v2.0002.jpg/.txt (first-dot split gives key "img")
  uppercase-ext         000001.JPG + 000001.TXT, 000002.Jpg + 000002.txt
  nonadjacent           a.jpg, b.jpg, b.txt, a.txt
  split (2 shards)      the last sample's .jpg ends split-000000, its .txt/.json start split-000001
  truncated             6 samples, cut inside the 4th sample's .jpg: 3 complete samples before the break
  corrupt-jpeg          a .jpg with a valid header but truncated scan data; a .jpg of random bytes
  zero-byte             a zero-byte .jpg and a zero-byte .txt
  invalid-json          a .json holding '{"description": "a red'
  non-utf8              a .txt holding b"caf\\xe9 au lait"
  bomb                  a 25000x25000 1-bit PNG (625 MP) of ~76 KB, deflate stream written by hand
  unsafe                .pyd, .pth and .pickle members holding a pickle that raises
                        RuntimeError("wdsfilter test pickle was executed") if ever unpickled
  image-token           captions with a foreign "<image>" token, and one with "<__dj__image>"
  text-only-image-only  one sample with only .txt + .json, one with only .jpg
  keys-misc             README (no extension), .DS_Store, 000010.jpg twice, a whitespace-only
                        .txt, a .json whose caption is ""
  corrupt-video         an .mp4 of random bytes, an audio-only .mp4 (1 s of AAC silence), a valid clip

Determinism notes: RGB->YUV conversion for video is done here in integer numpy (not swscale), x264
runs with one thread (its SEI string records the thread count) and without its assembly (asm=0:
the SIMD paths round differently from one CPU to the next), the audio-only clip is silence,
.webp files are lossless, and the bomb PNG does not depend on the system zlib.
"""
from __future__ import annotations

import argparse
import filecmp
import io
import json
import math
import os
import struct
import sys
import tarfile
import tempfile
import zlib

import av
import numpy as np
from PIL import Image, ImageDraw, ImageFont

FINDING_KINDS = (
    "dotted_basename", "mixed_case_extension", "nonadjacent_key", "key_across_shards", "truncated_tar",
    "corrupt_image", "empty_member", "invalid_json", "invalid_utf8", "oversized_image", "unsafe_member",
    "foreign_image_token", "missing_caption", "missing_image", "no_extension", "dotfile", "duplicate_key",
    "empty_caption", "corrupt_video", "no_video_stream")
PICKLE_MESSAGE = "wdsfilter test pickle was executed"

COLORS = {"red": (220, 30, 30), "green": (30, 170, 50), "blue": (30, 60, 220),
          "yellow": (240, 210, 30), "purple": (140, 50, 170), "orange": (245, 130, 20)}
BACKGROUNDS = {"white": (245, 245, 245), "black": (15, 15, 15), "gray": (128, 128, 128),
               "blue": (40, 70, 200), "yellow": (235, 215, 60)}
SHAPES = ("circle", "square", "triangle", "star")
STAR = [(round(k * math.cos(a), 6), round(k * math.sin(a), 6))  # rounded: no libm last-bit surprises
        for k, a in ((1 if i % 2 == 0 else 0.45, i * math.pi / 5 - math.pi / 2) for i in range(10))]
COUNT_WORDS = {1: "a", 2: "two", 3: "three"}
SIGN_TEXTS = ("SALE 50% OFF TODAY", "OPEN 24 HOURS", "FRESH COFFEE AND CAKE", "NO PARKING ANY TIME",
              "WELCOME TO THE CITY", "FREE WIFI INSIDE", "GRAND OPENING SOON", "PLEASE KEEP DOOR CLOSED")
SUBTITLES = ("HELLO AND WELCOME", "THE TRAIN LEAVES AT NINE", "LOOK AT THE RED BALL", "SEE YOU TOMORROW")


# -- tar writing -----------------------------------------------------------------------------------
def tar_bytes(members) -> bytes:
    """A GNU tar of members, a list of (name, bytes | str | dict) in tar order, with fixed metadata."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in members:
            if isinstance(data, (dict, list)):
                data = json.dumps(data)
            data = data.encode() if isinstance(data, str) else bytes(data)
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def write_tar(path, members) -> str:
    """Writes tar_bytes(members) to path (members may also be ready tar bytes)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "wb") as f:
        f.write(members if isinstance(members, bytes) else tar_bytes(members))
    return str(path)


def rng_for(name: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(name.encode()))


def _pick(rng, seq):
    return seq[int(rng.integers(len(seq)))]


# -- shape scenes --------------------------------------------------------------------------------
def random_scene(rng, unlike=None) -> dict:
    """{color, shape, count, background}; with unlike, colour and shape both differ from it."""
    while True:
        scene = {"color": _pick(rng, sorted(COLORS)), "shape": _pick(rng, SHAPES),
                 "count": int(rng.integers(1, 4)), "background": _pick(rng, sorted(BACKGROUNDS))}
        if scene["color"] == scene["background"]:
            continue
        if unlike and (scene["color"] == unlike["color"] or scene["shape"] == unlike["shape"]):
            continue
        return scene


def describe(scene) -> str:
    n = scene["count"]
    shape = scene["shape"] + ("s" if n > 1 else "")
    return f"{COUNT_WORDS[n]} {scene['color']} {shape} on a {scene['background']} background"


def _shape_points(shape, cx, cy, r):
    if shape == "triangle":
        return [(cx, cy - r), (cx + r * 0.87, cy + r * 0.5), (cx - r * 0.87, cy + r * 0.5)]
    return [(cx + r * x, cy + r * y) for x, y in STAR]


def draw_shape(draw, shape, cx, cy, r, fill):
    if shape == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
    elif shape == "square":
        draw.rectangle([cx - r, cy - r, cx + r, cy + r], fill=fill)
    else:
        draw.polygon(_shape_points(shape, cx, cy, r), fill=fill)


def gradient(size, color, spread=30) -> Image.Image:
    """A vertical gradient around color (lighter at the top)."""
    w, h = size
    ramp = np.linspace(spread / 2, -spread / 2, h)[:, None, None]
    arr = np.clip(np.array(color, dtype=np.float64)[None, None, :] + ramp, 0, 255).astype(np.uint8)
    return Image.fromarray(np.broadcast_to(arr, (h, w, 3)).copy(), "RGB")


def draw_scene(scene, size, rng) -> Image.Image:
    """Count shapes in a row of equal slots, each jittered a little, on a gradient background."""
    w, h = size
    img = gradient(size, BACKGROUNDS[scene["background"]])
    draw = ImageDraw.Draw(img)
    slot = w / scene["count"]
    for i in range(scene["count"]):
        r = int(min(slot, h) * float(rng.uniform(0.22, 0.34)))
        cx = int(slot * (i + 0.5) + rng.integers(-slot * 0.1, slot * 0.1 + 1))
        cy = int(h / 2 + rng.integers(-h * 0.15, h * 0.15 + 1))
        draw_shape(draw, scene["shape"], cx, cy, r, COLORS[scene["color"]])
    return img


def encode_image(img: Image.Image, fmt: str = "jpg") -> bytes:
    buf = io.BytesIO()
    if fmt == "jpg":
        img.save(buf, "JPEG", quality=85)
    elif fmt == "png":
        img.save(buf, "PNG")
    elif fmt == "webp":
        img.save(buf, "WEBP", lossless=True)
    else:
        raise ValueError(fmt)
    return buf.getvalue()


def make_image(rng=None, size=(96, 72), scene=None, fmt="jpg") -> bytes:
    """Encoded bytes of a shape scene (a random one unless given)."""
    rng = rng if rng is not None else np.random.default_rng(0)
    return encode_image(draw_scene(scene or random_scene(rng), size, rng), fmt)


# -- text ----------------------------------------------------------------------------------------
def _wrap(text, font, width):
    lines, line = [], ""
    for word in text.split():
        trial = f"{line} {word}".strip()
        if line and font.getlength(trial) > width:
            lines.append(line)
            line = word
        else:
            line = trial
    return lines + [line]


def draw_text_block(img, text, font_size=32, color=(20, 20, 20), box=None, bottom=None):
    """Centre text (wrapped to the image width) on img; bottom puts it that far above the lower edge."""
    draw = ImageDraw.Draw(img)
    font = ImageFont.load_default(size=font_size)
    lines = _wrap(text, font, img.width - 24)
    step = int(font_size * 1.25)
    top = (img.height - step * len(lines)) // 2 if bottom is None else img.height - bottom - step * len(lines)
    if box is not None:
        draw.rectangle([0, top - 6, img.width, top + step * len(lines) + 4], fill=box)
    for i, line in enumerate(lines):
        x = (img.width - font.getlength(line)) / 2
        draw.text((x, top + i * step), line, font=font, fill=color)
    return img


def render_text_image(text, size=(320, 240), font_size=32, background=(235, 232, 220), color=(20, 20, 20)):
    """A light image with large dark text, centred and wrapped."""
    return draw_text_block(gradient(size, background, spread=12), text, font_size, color)


def noise_image(rng, size=(320, 240), block=1, gray=False) -> Image.Image:
    w, h = size
    shape = (h // block, w // block) if gray else (h // block, w // block, 3)
    img = Image.fromarray(rng.integers(0, 256, size=shape, dtype=np.uint8), "L" if gray else "RGB")
    return img.resize(size, Image.Resampling.NEAREST).convert("RGB")


# -- video ---------------------------------------------------------------------------------------
def rgb_to_yuv420p(rgb: np.ndarray) -> np.ndarray:
    """BT.601 limited range, integer arithmetic, 2x2 averaged chroma; shape (h*3/2, w) for PyAV."""
    r, g, b = (rgb[..., i].astype(np.int32) for i in range(3))
    y = ((66 * r + 129 * g + 25 * b + 128) >> 8) + 16
    u = ((-38 * r - 74 * g + 112 * b + 128) >> 8) + 128
    v = ((112 * r - 94 * g - 18 * b + 128) >> 8) + 128
    h, w = y.shape
    sub = [(c.reshape(h // 2, 2, w // 2, 2).sum(axis=(1, 3)) + 2) >> 2 for c in (u, v)]
    return np.concatenate([y.reshape(-1)] + [c.reshape(-1) for c in sub]).astype(np.uint8).reshape(-1, w)


def encode_video(frames, fps=8) -> bytes:
    """H.264 (libx264, one thread) in mp4 from a list of equal-size RGB uint8 arrays."""
    h, w = frames[0].shape[:2]
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as container:
        # asm=0: x264's SIMD kernels (FMA, AVX-512) are not bit-exact with each other.
        stream = container.add_stream("libx264", rate=fps,
                                      options={"crf": "23", "preset": "medium", "x264-params": "asm=0"})
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        stream.codec_context.thread_count = 1
        for i, rgb in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(rgb_to_yuv420p(rgb), format="yuv420p")
            frame.pts = i
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return buf.getvalue()


def make_video(text=None, size=(320, 240), frames=16, fps=8, seed=0, noise=False) -> bytes:
    """A moving shape scene (or blocky noise), with text as a subtitle in every frame if given."""
    rng = np.random.default_rng(seed)
    scene = random_scene(rng)
    w, h = size
    out = []
    for i in range(frames):
        if noise:
            img = noise_image(rng, size, block=16)
        else:
            img = gradient(size, BACKGROUNDS[scene["background"]])
            cx = int(w * 0.15 + (w * 0.7) * i / max(frames - 1, 1))
            draw_shape(ImageDraw.Draw(img), scene["shape"], cx, h // 3, h // 7, COLORS[scene["color"]])
        if text:
            draw_text_block(img, text, font_size=28, color=(255, 255, 255), box=(0, 0, 0), bottom=12)
        out.append(np.asarray(img))
    return encode_video(out, fps)


def make_audio_only_mp4(seconds=1.0, rate=44100) -> bytes:
    """An mp4 whose only stream is AAC audio (digital silence: exact regardless of float SIMD)."""
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as container:
        stream = container.add_stream("aac", rate=rate)
        stream.layout = "mono"
        stream.codec_context.thread_count = 1
        frame = av.AudioFrame.from_ndarray(np.zeros((1, int(seconds * rate)), np.float32), format="fltp", layout="mono")
        frame.sample_rate, frame.pts = rate, 0
        container.mux(stream.encode(frame))  # PyAV cuts it into the encoder's frame size
        container.mux(stream.encode(None))
    return buf.getvalue()


# -- hostile payloads ----------------------------------------------------------------------------
def zlib_zeros(length: int) -> bytes:
    """A zlib stream of length zero bytes, written bit by bit so it never depends on the zlib
    library: one dynamic-Huffman block whose only symbols are literal 0 (code 10), end of block (11),
    length 258 (0) and distance 1 (0), so every 258 bytes cost 2 bits."""
    bits = []  # deflate order: header fields least significant bit first, Huffman codes as written

    def field(value, n):
        bits.append(format(value, f"0{n}b")[::-1])

    field(1, 1), field(2, 2)                          # BFINAL, BTYPE dynamic
    field(286 - 257, 5), field(0, 5), field(18 - 4, 4)  # HLIT, HDIST, HCLEN
    cl_lengths = {18: 1, 1: 2, 2: 2}                  # code-length codes: 18 -> 0, 1 -> 10, 2 -> 11
    for sym in (16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1):
        field(cl_lengths.get(sym, 0), 3)
    # literal/length code lengths 0->2, 1..255->0, 256->2, 257..284->0, 285->1, distance 0->1,
    # as code-length symbols: 2, 18 (138 zeros), 18 (117 zeros), 2, 18 (28 zeros), 1, 1
    for sym, zeros in ((2, 0), (18, 138), (18, 117), (2, 0), (18, 28), (1, 0), (1, 0)):
        bits.append({18: "0", 1: "10", 2: "11"}[sym])
        if zeros:
            field(zeros - 11, 7)
    matches, literals = divmod(length - 1, 258)
    bits.append("10" + "00" * matches + "10" * literals + "11")  # literal 0, (258, 1) pairs, EOB
    stream = "".join(bits)
    stream += "0" * (-len(stream) % 8)
    body = bytes(int(stream[i:i + 8][::-1], 2) for i in range(0, len(stream), 8))
    return b"\x78\x01" + body + struct.pack(">I", ((length % 65521) << 16) | 1)  # adler32 of zeros


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def bomb_png(width=25000, height=25000) -> bytes:
    """An all-black 1-bit greyscale PNG, tiny on disk; the full image is never allocated."""
    raw_length = height * (1 + (width + 7) // 8)      # each row: filter byte 0 + packed bits
    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", zlib_zeros(raw_length))
            + _png_chunk(b"IEND", b""))


def unsafe_pickle() -> bytes:
    """Hand-written protocol-2 pickle: builtins.exec('raise RuntimeError(...)')."""
    src = f"raise RuntimeError({PICKLE_MESSAGE!r})".encode()
    return b"\x80\x02cbuiltins\nexec\nX" + struct.pack("<I", len(src)) + src + b"\x85R."


# -- clean shards --------------------------------------------------------------------------------
def _scene_samples(rng, n, share=0.2):
    """(scene, caption, caption_matches) for n samples, a share of them with another scene's caption."""
    mismatched = {int(i) for i in rng.choice(n, size=round(n * share), replace=False)}
    out = []
    for mismatch in (i in mismatched for i in range(n)):
        scene = random_scene(rng)
        caption = describe(random_scene(rng, unlike=scene) if mismatch else scene)
        out.append((scene, caption, not mismatch))
    return out


def write_images(out_dir, shards=2, per_shard=32):
    rng = rng_for("images")
    samples = _scene_samples(rng, shards * per_shard)
    for s in range(shards):
        members = []
        for i in range(s * per_shard, (s + 1) * per_shard):
            scene, caption, matches = samples[i]
            key = f"{i:09d}"
            fmt = "png" if i % 8 == 3 else "webp" if i % 8 == 6 else "jpg"
            w, h = (int(v) for v in rng.integers(128, 257, size=2))
            members += [(f"{key}.{fmt}", encode_image(draw_scene(scene, (w, h), rng), fmt)),
                        (f"{key}.txt", caption),
                        (f"{key}.json", {"key": key, "caption": caption, "url": f"http://example.com/images/{key}.{fmt}",
                                         "width": w, "height": h, "status": "success", "caption_matches": matches})]
        write_tar(os.path.join(out_dir, f"images-{s:06d}.tar"), members)


def write_json_captions(out_dir, n=32):
    rng = rng_for("json-captions")
    members = []
    for i, (scene, caption, matches) in enumerate(_scene_samples(rng, n)):
        key = f"{i:09d}"
        members += [(f"{key}.jpg", make_image(rng, (192, 160), scene)),
                    (f"{key}.json", {"description": caption, "caption_matches": matches})]
    write_tar(os.path.join(out_dir, "json-captions-000000.tar"), members)


def write_ocr(out_dir):
    rng = rng_for("ocr-images")
    members = []
    for i in range(16):
        key, text = f"{i:09d}", ""
        if i < 8:
            text = SIGN_TEXTS[i]
            img = render_text_image(text, font_size=int(rng.integers(28, 41)))
            caption = f'a sign with the text "{text}"'
        elif i < 12:
            scene = random_scene(rng)
            img = draw_scene(scene, (320, 240), rng)
            caption = f"{describe(scene)}, no text"
        else:
            img = noise_image(rng, block=1 if i < 14 else 8, gray=i < 14)
            caption = "random noise"
        members += [(f"{key}.png", encode_image(img, "png")), (f"{key}.txt", caption),
                    (f"{key}.json", {"key": key, "caption": caption, "has_text": bool(text), "text": text,
                                     "width": 320, "height": 240})]
    write_tar(os.path.join(out_dir, "ocr-images-000000.tar"), members)


def write_videos(out_dir):
    members = []
    for i in range(8):
        key = f"{i:09d}"
        text = SUBTITLES[i] if i < 4 else ""
        noise = i >= 6
        clip = make_video(text or None, seed=100 + i, noise=noise)
        caption = (f'a video with the subtitle "{text}"' if text else
                   "a video of flickering noise" if noise else "a video of a moving shape")
        members += [(f"{key}.mp4", clip), (f"{key}.txt", caption),
                    (f"{key}.json", {"key": key, "caption": caption, "has_text": bool(text), "text": text,
                                     "frames": 16, "fps": 8, "width": 320, "height": 240})]
    write_tar(os.path.join(out_dir, "videos-000000.tar"), members)


def write_clean(out_dir):
    write_images(out_dir)
    write_json_captions(out_dir)
    write_ocr(out_dir)
    write_videos(out_dir)


# -- broken shards -------------------------------------------------------------------------------
def normal_members(rng, keys, size=(96, 72)):
    """Valid jpg + txt + json samples (captions match) for the given keys."""
    members = []
    for key in keys:
        scene = random_scene(rng)
        caption = describe(scene)
        members += [(f"{key}.jpg", make_image(rng, size, scene)), (f"{key}.txt", caption),
                    (f"{key}.json", {"key": key, "caption": caption, "caption_matches": True})]
    return members


class _Case:
    """Collects one case: its shards (name -> members), expected findings and extra manifest fields."""

    def __init__(self, name, base, description):
        self.name, self.description, self.rng = name, description, rng_for(name)
        self.next_key, self.shards, self.expect, self.extra = base, {}, [], {}
        self.before = self.ok()  # valid samples that go ahead of the broken ones

    def key(self) -> str:
        self.next_key += 1
        return f"{self.next_key - 1:06d}"

    def ok(self, n=2):
        return normal_members(self.rng, [self.key() for _ in range(n)])

    def put(self, shard, odd):
        """The shard holds valid samples, then the odd members, then valid samples again."""
        self.shards[shard] = self.before + odd + self.ok()

    def image(self, size=(96, 72)):
        scene = random_scene(self.rng)
        return make_image(self.rng, size, scene), describe(scene)

    def find(self, kind, shard, member):
        assert kind in FINDING_KINDS, kind
        key = member.rsplit(".", 1)[0] if "." in member else member
        self.expect.append({"kind": kind, "shard": shard, "member": member, "key": key})

    def manifest(self):
        return {"case": self.name, "shards": list(self.shards), "description": self.description,
                "expect": self.expect, **self.extra}


def case_dotted(c):
    shard, odd = "dotted-basenames-000000.tar", []
    for n in (1, 2):
        jpg, caption = c.image()
        odd += [(f"img.v2.{n:04d}.jpg", jpg), (f"img.v2.{n:04d}.txt", caption)]
        c.find("dotted_basename", shard, f"img.v2.{n:04d}.jpg")
        c.find("dotted_basename", shard, f"img.v2.{n:04d}.txt")
    c.put(shard, odd)


def case_uppercase(c):
    shard, (jpg1, cap1), (jpg2, cap2) = "uppercase-ext-000000.tar", c.image(), c.image()
    c.put(shard, [("000001.JPG", jpg1), ("000001.TXT", cap1), ("000002.Jpg", jpg2), ("000002.txt", cap2)])
    for name in ("000001.JPG", "000001.TXT", "000002.Jpg"):
        c.find("mixed_case_extension", shard, name)


def case_nonadjacent(c):
    shard, (jpg_a, cap_a), (jpg_b, cap_b) = "nonadjacent-000000.tar", c.image(), c.image()
    c.put(shard, [("a.jpg", jpg_a), ("b.jpg", jpg_b), ("b.txt", cap_b), ("a.txt", cap_a)])
    c.find("nonadjacent_key", shard, "a.txt")


def case_split(c):
    first, second, key = "split-000000.tar", "split-000001.tar", c.key()
    jpg, caption = c.image()
    c.shards[first] = c.before + [(f"{key}.jpg", jpg)]
    c.shards[second] = [(f"{key}.txt", caption), (f"{key}.json", {"key": key, "caption": caption})] + c.ok()
    c.find("key_across_shards", second, f"{key}.txt")
    c.extra.update(split_key=key, parts={first: [f"{key}.jpg"], second: [f"{key}.txt", f"{key}.json"]})


def case_truncated(c):
    shard, members = "truncated-000000.tar", c.before + c.ok(4)
    data, cut_member = tar_bytes(members), members[9][0]  # the 4th sample's .jpg
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        info = tar.getmember(cut_member)
    c.shards[shard] = data[:info.offset_data + info.size // 2]
    c.find("truncated_tar", shard, cut_member)
    c.extra.update(complete_samples_before_break=3, members_per_sample=3)


def case_corrupt_jpeg(c):
    shard, k1, k2 = "corrupt-jpeg-000000.tar", c.key(), c.key()
    jpg, caption = c.image((160, 120))
    scan = jpg.index(b"\xff\xda")  # start of scan: all before it is a valid header
    garbage = c.rng.integers(0, 256, 3000, dtype=np.uint8).tobytes()
    c.put(shard, [(f"{k1}.jpg", jpg[:scan + (len(jpg) - scan) // 3]), (f"{k1}.txt", caption),
                  (f"{k2}.jpg", garbage), (f"{k2}.txt", "random bytes")])
    c.find("corrupt_image", shard, f"{k1}.jpg")
    c.find("corrupt_image", shard, f"{k2}.jpg")


def case_zero_byte(c):
    shard, k1, k2 = "zero-byte-000000.tar", c.key(), c.key()
    (_, cap1), (jpg2, _) = c.image(), c.image()
    c.put(shard, [(f"{k1}.jpg", b""), (f"{k1}.txt", cap1), (f"{k2}.jpg", jpg2), (f"{k2}.txt", b"")])
    c.find("empty_member", shard, f"{k1}.jpg")
    c.find("empty_member", shard, f"{k2}.txt")


def case_invalid_json(c):
    shard, k, (jpg, caption) = "invalid-json-000000.tar", c.key(), c.image()
    c.put(shard, [(f"{k}.jpg", jpg), (f"{k}.txt", caption), (f"{k}.json", b'{"description": "a red')])
    c.find("invalid_json", shard, f"{k}.json")


def case_non_utf8(c):
    shard, k, (jpg, _) = "non-utf8-000000.tar", c.key(), c.image()
    c.put(shard, [(f"{k}.jpg", jpg), (f"{k}.txt", b"caf\xe9 au lait")])
    c.find("invalid_utf8", shard, f"{k}.txt")


def case_bomb(c):
    shard, k = "bomb-000000.tar", c.key()
    c.put(shard, [(f"{k}.png", bomb_png(25000, 25000)), (f"{k}.txt", "a huge black image")])
    c.find("oversized_image", shard, f"{k}.png")
    c.extra.update(width=25000, height=25000)


def case_unsafe(c):
    shard, odd = "unsafe-000000.tar", []
    for ext in ("pyd", "pth", "pickle"):
        k, (jpg, caption) = c.key(), c.image()
        odd += [(f"{k}.jpg", jpg), (f"{k}.txt", caption), (f"{k}.{ext}", unsafe_pickle())]
        c.find("unsafe_member", shard, f"{k}.{ext}")
    c.put(shard, odd)
    c.extra["raises"] = f"RuntimeError: {PICKLE_MESSAGE}"


def case_image_token(c):
    shard, odd = "image-token-000000.tar", []
    for template in ("<image> {}", "a photo of {} <image>", "<__dj__image> {}"):
        k, (jpg, caption) = c.key(), c.image()
        odd += [(f"{k}.jpg", jpg), (f"{k}.txt", template.format(caption))]
        if "<image>" in template:
            c.find("foreign_image_token", shard, f"{k}.txt")
    c.put(shard, odd)
    c.extra.update(expected_token="<__dj__image>", foreign_token="<image>")


def case_text_only_image_only(c):
    shard, k1, k2 = "text-only-image-only-000000.tar", c.key(), c.key()
    (_, cap1), (jpg2, _) = c.image(), c.image()
    c.put(shard, [(f"{k1}.txt", cap1), (f"{k1}.json", {"key": k1, "caption": cap1}), (f"{k2}.jpg", jpg2)])
    c.find("missing_image", shard, f"{k1}.txt")
    c.find("missing_caption", shard, f"{k2}.jpg")


def case_keys_misc(c):
    shard = "keys-misc-000000.tar"
    (jpg_a, cap), (jpg_b, _), (jpg11, _), (jpg12, _) = (c.image() for _ in range(4))
    c.put(shard, [("README", b"test fixture: a member without an extension\n"),
                  ("000010.jpg", jpg_a), ("000010.jpg", jpg_b), ("000010.txt", cap),
                  (".DS_Store", b"\x00\x00\x00\x01Bud1" + bytes(56)), ("000011.jpg", jpg11), ("000011.txt", " \t\n"),
                  ("000012.jpg", jpg12), ("000012.json", {"key": "000012", "caption": ""})])
    for kind, member in (("no_extension", "README"), ("duplicate_key", "000010.jpg"), ("dotfile", ".DS_Store"),
                         ("empty_caption", "000011.txt"), ("empty_caption", "000012.json")):
        c.find(kind, shard, member)
    c.extra["duplicate_member_count"] = 2


def case_corrupt_video(c):
    shard, k1, k2, k3 = "corrupt-video-000000.tar", c.key(), c.key(), c.key()
    garbage = c.rng.integers(0, 256, 4000, dtype=np.uint8).tobytes()
    c.put(shard, [(f"{k1}.mp4", garbage), (f"{k1}.txt", "random bytes"),
                  (f"{k2}.mp4", make_audio_only_mp4()), (f"{k2}.txt", "one second of silence"),
                  (f"{k3}.mp4", make_video(size=(160, 120), frames=8, seed=7)), (f"{k3}.txt", "a moving shape"),
                  (f"{k3}.json", {"key": k3, "frames": 8, "fps": 8, "width": 160, "height": 120})])
    c.find("corrupt_video", shard, f"{k1}.mp4")
    c.find("no_video_stream", shard, f"{k2}.mp4")
    c.extra["valid_clip"] = {"member": f"{k3}.mp4", "frames": 8}


CASES = (  # (name, first key of its samples, builder, description); keys never repeat across shards
    ("dotted-basenames", 100, case_dotted, "basenames with dots; first-dot splitting merges them into key 'img'"),
    ("uppercase-ext", 200, case_uppercase, "upper- and mixed-case extensions (.JPG, .TXT, .Jpg)"),
    ("nonadjacent", 300, case_nonadjacent, "members of key 'a' are not adjacent: a.jpg, b.jpg, b.txt, a.txt"),
    ("split", 400, case_split, "the last sample's .jpg ends the first shard, its .txt/.json start the second"),
    ("truncated", 500, case_truncated, "a tar of 6 samples cut in the middle of the 4th sample's .jpg data"),
    ("corrupt-jpeg", 600, case_corrupt_jpeg, "a .jpg with a valid header and truncated scan data; a .jpg of random bytes"),
    ("zero-byte", 700, case_zero_byte, "a zero-byte .jpg and a zero-byte .txt"),
    ("invalid-json", 800, case_invalid_json, "a .json member that is not valid JSON"),
    ("non-utf8", 900, case_non_utf8, "a .txt with latin-1 bytes that are invalid UTF-8"),
    ("bomb", 1000, case_bomb, "a 25000x25000 1-bit PNG: tiny on disk, 625 megapixels decoded"),
    ("unsafe", 1100, case_unsafe, ".pyd, .pth and .pickle members holding a pickle that raises if unpickled"),
    ("image-token", 1200, case_image_token, "captions with a foreign '<image>' token; one with '<__dj__image>'"),
    ("text-only-image-only", 1300, case_text_only_image_only, "one sample with only .txt+.json, one with only .jpg"),
    ("keys-misc", 1400, case_keys_misc, "README, .DS_Store, a duplicate 000010.jpg, whitespace and empty captions"),
    ("corrupt-video", 1500, case_corrupt_video, "an .mp4 of random bytes, an audio-only .mp4, a valid clip"),
)


def write_broken(out_dir) -> dict:
    """Writes broken/<shard>.tar for every case and broken/MANIFEST.json; returns the manifest."""
    broken = os.path.join(out_dir, "broken")
    os.makedirs(broken, exist_ok=True)
    cases = []
    for name, base, build, description in CASES:
        case = _Case(name, base, description)
        build(case)
        for shard, members in case.shards.items():
            write_tar(os.path.join(broken, shard), members)
        cases.append(case.manifest())
    manifest = {"finding_kinds": list(FINDING_KINDS), "cases": cases}
    with open(os.path.join(broken, "MANIFEST.json"), "w", encoding="utf-8", newline="\n") as f:
        f.write(json.dumps(manifest, indent=2) + "\n")
    return manifest


# -- entry points --------------------------------------------------------------------------------
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = f"""# sample_shards

Small deterministic WebDataset shards for tests and demos, written by
`tools/make_sample_shards.py` (regenerate: `python tools/make_sample_shards.py`; verify the
committed files: `python tools/make_sample_shards.py --check`; pillow==13.0.0 and av==18.1.0).

```
{__doc__.split(chr(10), 3)[3].strip()}
```
"""


def write_all(out_dir) -> list:
    """Writes every shard, broken/MANIFEST.json and README.md; returns the relative paths written."""
    os.makedirs(out_dir, exist_ok=True)
    write_clean(out_dir)
    write_broken(out_dir)
    with open(os.path.join(out_dir, "README.md"), "w", encoding="utf-8", newline="\n") as f:
        f.write(README)
    return list_files(out_dir)


def list_files(root) -> list:
    found = []
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        found += [os.path.relpath(os.path.join(folder, f), root).replace(os.sep, "/") for f in sorted(files)]
    return sorted(found)


def check(out_dir) -> list:
    """Relative paths that differ between out_dir and a fresh generation (missing or extra included)."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = write_all(tmp)
        have = list_files(out_dir) if os.path.isdir(out_dir) else []
        return sorted(p for p in set(fresh) | set(have)
                      if p not in fresh or p not in have
                      or not filecmp.cmp(os.path.join(tmp, p), os.path.join(out_dir, p), shallow=False))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "sample_shards"), help="output folder")
    parser.add_argument("--check", action="store_true", help="regenerate into a temp folder and compare")
    args = parser.parse_args(argv)
    if args.check:
        differing = check(args.out)
        for path in differing:
            print(f"differs: {path}")
        print(f"{len(differing)} differing file(s) in {args.out}" if differing else f"{args.out} is up to date")
        return 1 if differing else 0
    for path in write_all(args.out):
        print(f"{os.path.getsize(os.path.join(args.out, path)):>9}  {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
