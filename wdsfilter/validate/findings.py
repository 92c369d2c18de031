"""What the validator can find: the kinds, their severity, and the Finding record.

The one table below is the contract: docs/validate.md prints it, the JSON schema uses these names,
and sample_shards/broken/MANIFEST.json expects them.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from typing import Dict, Iterable, List

ERROR = "error"
WARNING = "warning"
SEVERITIES = (ERROR, WARNING)

# kind -> (severity, what to do). Errors break training (a crash, a hang, code execution, an OOM,
# or nothing left to train on); warnings lose or mislabel some samples and deserve a look.
KINDS: Dict[str, tuple] = {
    # 1. all filtered
    "all_filtered": (ERROR, "the shard has samples but none would reach training; the message gives the drop reasons and the fix when one is known"),
    "empty_shard": (WARNING, "the shard holds no sample (img2dataset writes one when every URL of a shard fails); readers skip it. Remove it or leave it"),
    # 2. keys
    "dotted_basename": (WARNING, "dots in file basenames make compound extensions (key 'img', ext 'v2.0001.jpg'); use --rekey last-dot"),
    "no_extension": (WARNING, "member without an extension; ignored by webdataset, remove it when writing shards"),
    "reserved_extension": (WARNING, "an extension starting with '__' (x.__key__, x.__marker__): the name of a sample's metadata field; the member is ignored. Rename it when writing shards"),
    "dotfile": (WARNING, "hidden file (.DS_Store, ._foo); ignored, remove it when writing shards"),
    "mixed_case_extension": (WARNING, "upper-case extension (.JPG); webdataset (and open_clip, wdsfilter) lower-case extensions, but HF datasets' webdataset loader keeps the case (a 'JPG' column of raw bytes, never decoded as an image) and DALI's readers.webdataset is case sensitive by default (case_sensitive_extensions=True). Write lower-case extensions"),
    "nonadjacent_key": (WARNING, "members of one key are not next to each other; plain webdataset makes two half-samples (wdsfilter's stages merge them). Write each sample's members together"),
    "scattered_key": (ERROR, "members of one key are too far apart in the tar to be put together (tar *.txt *.json *.jpg, directory order); readers see fragments and lose the samples. Rewrite with wdsfilter sort-shard or tar --sort=name"),
    "key_across_shards": (ERROR, "a sample's members are split between two shards; both halves are lost. Write each sample inside one shard"),
    "duplicate_key": (WARNING, "the same member name appears twice; only the first is used. Deduplicate keys when writing"),
    "oversized_sample": (WARNING, "one sample's members add up past max_sample_bytes; the stages let its bytes go and drop it"),
    "missing_image": (WARNING, "sample has no member under the image key; check --image-key"),
    "missing_caption": (WARNING, "sample has no caption under the caption key; check --caption-key"),
    # 3. image sizes
    "oversized_image": (ERROR, "image above --max-pixels/--max-side (read from its header): decoding it risks an OOM"),
    "undersized_image": (WARNING, "image smaller than --min-side"),
    "extreme_aspect": (WARNING, "image aspect ratio above --max-aspect"),
    # 4. corrupt content
    "truncated_tar": (ERROR, "the tar breaks off; the samples before the break are readable. Re-create or re-download the shard"),
    "unreadable_tar": (ERROR, "the shard cannot be opened or is not a tar at all"),
    "shard_command_failed": (ERROR, "the shard's pipe: command or download failed (non-zero exit); the shard may be incomplete. Check the command or URL"),
    "remote_object_missing": (ERROR, "the remote shard does not exist (the message names the URL and the credentials used); fix the URL or upload it"),
    "remote_unreachable": (ERROR, "the store or web server could not be reached: its host name does not resolve, the connection was refused or timed out, or TLS failed (the message says which); check the URL or endpoint and the network"),
    "remote_access_denied": (ERROR, "the remote shard cannot be read with these credentials (the message names where they came from); grant read access or pass others (--storage-option, AWS_PROFILE, GOOGLE_APPLICATION_CREDENTIALS, HF_TOKEN)"),
    "remote_read_failed": (ERROR, "reading the remote shard failed after its retries, or the object changed while it was read; the message names the URL and the last error. Validate it again"),
    "remote_size_mismatch": (ERROR, "the remote object's size differs from the size sizes.json records for it: it was replaced or cut. Re-upload it or regenerate sizes.json"),
    "corrupt_image": (ERROR, "the image does not decode (bad header, or its data is cut short)"),
    "empty_member": (WARNING, "zero-byte member; ignored"),
    "invalid_json": (WARNING, "the .json member is not valid JSON"),
    "invalid_utf8": (WARNING, "the text member is not UTF-8"),
    "empty_caption": (WARNING, "the caption is empty or only whitespace (or only special tokens)"),
    "caption_not_text": (WARNING, "the caption field holds a JSON number, list or object, not text; point --caption-key at a text field"),
    "corrupt_video": (ERROR, "PyAV cannot open the video, or its data is cut short"),
    "oversized_member": (ERROR, "a member over its kind's byte cap (--max-text-bytes, --max-image-bytes, ...): the stages stream past it unread and drop a sample that needed it"),
    "special_member": (WARNING, "a symbolic link, hard link, device or FIFO member: tar readers do not follow it, so its sample has no bytes for it. Store the file itself"),
    "corrupt_member": (WARNING, "a compressed member (.gz) does not decompress; its sample is read without it"),
    "oversized_video": (ERROR, "video frames above --max-pixels (from the header, or refused by FFmpeg's decoder when the header understates them): scoring refuses it as video_too_large"),
    "no_video_stream": (WARNING, "the video file has no video stream (audio only?)"),
    # 5. safety
    "unsafe_member": (ERROR, "pickle/torch payload that a default webdataset decoder would execute; the validator never loads it. Remove it or store tensors as .npy"),
    # 6. special tokens
    "foreign_image_token": (WARNING, "caption carries an image token other than the configured one; set --image-token (the stages normalise it)"),
    # 7. layout
    "too_few_shards": (ERROR, "fewer shards than ranks x loader workers: some readers get no shard and DDP hangs. Reshard, or use fewer workers"),
    "uneven_shards": (WARNING, "shard sample count far from the median; ranks get uneven work"),
    # 8. tolerance
    "too_many_dropped": (ERROR, "more samples are dropped than --max-drop allows (overall, or for one reason); the message gives the share. Fix the data, or allow more"),
}

# Kinds that cost one sample each: an error (the sample does not reach training) but not the
# shard's or the set's. With --max-drop they are judged by their share of the samples instead of
# failing one by one; whole-shard problems (all_filtered, truncated_tar, key_across_shards,
# scattered_key, unsafe_member, ...) stay errors whatever the tolerance.
SAMPLE_KINDS = ("corrupt_image", "corrupt_video", "oversized_image", "oversized_member", "oversized_video")


def severity(kind: str) -> str:
    return KINDS[kind][0]


def hint(kind: str) -> str:
    return KINDS[kind][1]


def at_level(kind: str, fail_on: str) -> bool:
    """True when a finding of this kind fails a run with --fail-on fail_on."""
    return fail_on == WARNING or severity(kind) == ERROR


@dataclass
class Finding:
    kind: str
    shard: str
    member: str = ""
    key: str = ""
    message: str = ""

    def __post_init__(self):
        if self.kind not in KINDS:  # a typo here would silently vanish from every count
            raise ValueError(f"unknown finding kind {self.kind!r}")

    @property
    def severity(self) -> str:
        return KINDS[self.kind][0]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["severity"] = self.severity
        return d


class FindingLog:
    """Findings of one shard: every one counted, the first `limit` of each kind kept in full, so a
    shard of a million bad members still makes a small result."""

    def __init__(self, shard: str, limit: int = 100):
        self.shard = shard
        self.limit = limit
        self.counts: Counter = Counter()
        self.items: List[Finding] = []

    def add(self, kind: str, member: str = "", key: str = "", message: str = "") -> None:
        self.counts[kind] += 1
        if self.counts[kind] <= self.limit:
            self.items.append(Finding(kind, self.shard, member, key or "", message))

    def extend(self, findings: Iterable[Finding]) -> None:
        for f in findings:
            self.add(f.kind, f.member, f.key, f.message)

    @property
    def omitted(self) -> Dict[str, int]:
        return {k: n - self.limit for k, n in self.counts.items() if n > self.limit}
