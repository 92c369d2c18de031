"""Conditional writes of whole objects in a bucket (s3://, gs://): the store's own compare-and-set,
with which a writer never creates over, replaces or deletes another writer's object unseen.

    version = put_file(fs, path, "scores/00.parquet", expect=None)   # create only: it must not exist
    version = put_bytes(fs, path, data, expect=version)               # replace only the version it read
    delete(fs, path, expect=version)

A version is the object's S3 ETag or GCS generation, as a string (`version_of` reads it from a
listing or info() entry). The conditions: S3 `If-None-Match: *` / `If-Match: <ETag>` on PutObject,
CompleteMultipartUpload and DeleteObject (AWS, MinIO, moto); GCS `ifGenerationMatch` (0: must not
exist) on simple and resumable uploads and on DELETE. A condition that fails is `Conflict`.

Large files go up in parts of `part` bytes (an S3 multipart upload completed under the
condition, a GCS resumable upload begun under it), read one part at a time: an upload holds at
most one part in memory. A failed upload leaves no object (the multipart upload is aborted, the
resumable session deleted).
"""
from __future__ import annotations

import base64
import hashlib
import logging
import mimetypes
import os
from contextlib import contextmanager
from typing import BinaryIO, Iterator, Optional

PART_BYTES = 16 << 20
log = logging.getLogger("wdsfilter")


class Conflict(OSError):
    """The object is not in the state the write was conditional on: another writer created,
    replaced or deleted it (HTTP 412, or a 404 where a version was expected)."""


def is_gcs(fs) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    return "gs" in protocol or "gcs" in protocol


def version_of(info: dict) -> Optional[str]:
    """An object's version in a listing or info() entry: its GCS generation, else its S3 ETag."""
    version = info.get("generation") or info.get("ETag") or info.get("etag")
    return str(version) if version is not None else None


def put_bytes(fs, path: str, data: bytes, expect: Optional[str]) -> str:
    """`data` as the object `path`, only if it does not exist (expect=None) or is still the
    version `expect`; its new version. Conflict otherwise."""
    import io
    return _put(fs, path, io.BytesIO(data), len(data), expect, PART_BYTES)


def put_file(fs, path: str, local: str, expect: Optional[str], part: int = PART_BYTES) -> str:
    """The local file as the object `path`, on put_bytes' condition; its new version."""
    with open(local, "rb") as f:
        return _put(fs, path, f, os.fstat(f.fileno()).st_size, expect, part)


def _put(fs, path: str, f: BinaryIO, size: int, expect: Optional[str], part: int) -> str:
    with _refused_as_conflict(fs, path, f"{_condition(expect)} failed"):  # gone: the version expected is too
        if is_gcs(fs):
            return _gcs_put(fs, path, f, size, expect, part)
        return _s3_put(fs, path, f, size, expect, part)


def delete(fs, path: str, expect: str) -> None:
    """Delete the object only if it is still the version `expect` (gone already: nothing to do).
    Conflict when another writer replaced it. A store that does not take the condition on a
    delete (S3-compatible stores without conditional deletes) gets a plain delete: the writer's
    ownership was checked just before (runfolder/lease.py)."""
    with _refused_as_conflict(fs, path, f"the delete of version {expect} failed: it was replaced", gone_is_done=True):
        bucket, key, _ = fs.split_path(path)
        if is_gcs(fs):
            fs.call("DELETE", f"{fs._location}/storage/v1/b/{{}}/o/{{}}", bucket, key, ifGenerationMatch=expect)
            return
        try:
            fs.call_s3("delete_object", Bucket=bucket, Key=key, IfMatch=expect)
        except OSError as e:
            if not _not_implemented(e):
                raise
            log.debug(f"{path}: the store takes no condition on a delete ({e}); deleted plainly")
            fs.call_s3("delete_object", Bucket=bucket, Key=key)


@contextmanager
def _refused_as_conflict(fs, path: str, failed: str, gone_is_done: bool = False) -> Iterator[None]:
    """The one reading of a refused condition: HTTP 412 as each client raises it (FileExistsError,
    botocore's PreconditionFailed in an OSError, a status of 412) becomes Conflict("path: failed");
    a missing object too, unless `gone_is_done` (a delete). The cached listing of `path` is dropped
    either way: the object may have changed."""
    try:
        yield
    except FileNotFoundError as e:
        if not gone_is_done:
            raise Conflict(f"{path}: {failed} ({type(e).__name__})") from None
    except FileExistsError as e:
        raise Conflict(f"{path}: {failed} ({type(e).__name__})") from None
    except OSError as e:
        if _precondition_failed(e):
            raise Conflict(f"{path}: {failed}") from None
        raise
    finally:
        fs.invalidate_cache(path)


def holds_file(fs, path: str, local: str, part: int = PART_BYTES) -> Optional[str]:
    """The object's version if it holds exactly the bytes of `local` (its S3 ETag is their MD5, or
    the multipart ETag of `part`-byte parts; its GCS md5Hash), else None. Tells an upload whose
    answer was lost (the object is this writer's) from another writer's object."""
    try:
        fs.invalidate_cache(path)
        info = fs.info(path)
    except FileNotFoundError:
        return None
    size = os.path.getsize(local)
    if int(info.get("size") or 0) != size:
        return None
    if is_gcs(fs):
        digest = hashlib.md5()
        with open(local, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        same = info.get("md5Hash") == base64.b64encode(digest.digest()).decode()
    else:
        same = (info.get("ETag") or "").strip('"') == _s3_etag(local, size, part)
    return version_of(info) if same else None


def _s3_etag(local: str, size: int, part: int) -> str:
    """The ETag S3 gives the file as _s3_put uploads it: the MD5 of one PUT, or the MD5 of the
    parts' MD5s and their count."""
    with open(local, "rb") as f:
        if size <= 2 * part:
            return hashlib.md5(f.read()).hexdigest()
        digests = [hashlib.md5(block).digest() for block in iter(lambda: f.read(part), b"")]
    return f"{hashlib.md5(b''.join(digests)).hexdigest()}-{len(digests)}"


def _condition(expect: Optional[str]) -> str:
    return "the create (it must not exist)" if expect is None else f"the replace of version {expect}"


def _precondition_failed(e: BaseException) -> bool:
    """HTTP 412: botocore's PreconditionFailed (s3fs wraps it in an OSError), or a client error
    carrying that status."""
    for err in (e, e.__cause__, e.__context__):
        response = getattr(err, "response", None)
        if isinstance(response, dict) and ((response.get("Error") or {}).get("Code") == "PreconditionFailed"
                                           or (response.get("ResponseMetadata") or {}).get("HTTPStatusCode") == 412):
            return True
        if 412 in (getattr(err, "code", None), getattr(err, "status", None)):
            return True
    return "PreconditionFailed" in str(e)


def _not_implemented(e: BaseException) -> bool:
    text = f"{e} {e.__cause__ or ''}"
    return "NotImplemented" in text or "501" in text


# -- S3 -------------------------------------------------------------------------------------------
def _s3_put(fs, path: str, f: BinaryIO, size: int, expect: Optional[str], part: int) -> str:
    bucket, key, _ = fs.split_path(path)
    condition = {"IfNoneMatch": "*"} if expect is None else {"IfMatch": expect}
    content_type = mimetypes.guess_type(path)[0]
    kind = {"ContentType": content_type} if content_type else {}
    if size <= 2 * part:
        out = fs.call_s3("put_object", Bucket=bucket, Key=key, Body=f.read(), **kind, **condition)
        return out["ETag"]
    upload = fs.call_s3("create_multipart_upload", Bucket=bucket, Key=key, **kind)["UploadId"]
    try:
        parts = []
        for number, block in enumerate(iter(lambda: f.read(part), b""), 1):
            out = fs.call_s3("upload_part", Bucket=bucket, Key=key, UploadId=upload, PartNumber=number, Body=block)
            parts.append({"PartNumber": number, "ETag": out["ETag"]})
        out = fs.call_s3("complete_multipart_upload", Bucket=bucket, Key=key, UploadId=upload,
                         MultipartUpload={"Parts": parts}, **condition)
        return out["ETag"]
    except BaseException:
        try:
            fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload)
        except Exception:  # noqa: BLE001 - the upload's own error is the one to report
            pass
        raise


# -- GCS ------------------------------------------------------------------------------------------
def _gcs_put(fs, path: str, f: BinaryIO, size: int, expect: Optional[str], part: int) -> str:
    """A simple (multipart/related) upload, or a resumable one for files over two parts; both
    under `ifGenerationMatch` ("0": must not exist). gcsfs's own uploads take only the "0" case."""
    from urllib.parse import quote
    bucket, key, _ = fs.split_path(path)
    generation = "0" if expect is None else str(expect)
    content_type = mimetypes.guess_type(path)[0] or "application/octet-stream"
    if size <= 2 * part:
        import json
        meta = json.dumps({"name": key, "contentType": content_type})
        body = (f"--==0==\nContent-Type: application/json; charset=UTF-8\n\n{meta}\n--==0==\n"
                f"Content-Type: {content_type}\n\n").encode() + f.read() + b"\n--==0==--"
        out = fs.call("POST", f"{fs._location}/upload/storage/v1/b/{quote(bucket)}/o", uploadType="multipart",
                      headers={"Content-Type": 'multipart/related; boundary="==0=="'}, data=body, json_out=True,
                      ifGenerationMatch=generation)
        return str(out["generation"])
    headers, _ = fs.call("POST", f"{fs._location}/upload/storage/v1/b/{quote(bucket)}/o?name={quote(key)}",
                         uploadType="resumable", json={"name": key, "contentType": content_type},
                         headers={"X-Upload-Content-Type": content_type}, ifGenerationMatch=generation)
    location = headers["Location"]
    location = location[0] if isinstance(location, list) else location
    return _gcs_chunks(fs, location, f, size, part, content_type)


def _gcs_chunks(fs, location: str, f: BinaryIO, size: int, part: int, content_type: str) -> str:
    from fsspec.asyn import sync
    from gcsfs.core import upload_chunk
    out, offset = None, 0
    try:
        for block in iter(lambda: f.read(part), b""):
            out = sync(fs.loop, upload_chunk, fs, location, block, offset, size, content_type)
            offset += len(block)
    except BaseException:
        try:
            fs.call("DELETE", location)
        except Exception:  # noqa: BLE001 - the upload's own error is the one to report
            pass
        raise
    return str((out or {})["generation"])
