"""Credentials refused for real (issue 22 items 3 and 5): moto's S3 server enforcing IAM
(remotekit.iam_s3_server: access control on, every request checked against its signer's
policies). A user who may only read the bucket gets a one-line configuration error (exit 2)
before any scoring from `score --out s3://...` and `filter --write-shards s3://...`, naming the
folder, the refused write and where the credentials came from (the environment, a profile,
storage options), never the secret; with no credentials at all, the same line says none were
found. Forbidden reads: validate names the credential source too."""
import json
import os

import pytest
from click.testing import CliRunner

pytest.importorskip("s3fs")
pytest.importorskip("moto")

from remotekit import BUCKET, _clear_fsspec_cache, iam_s3_server, three_shards  # noqa: E402
from wdsfilter.cli import main  # noqa: E402

SCORER = "scorekit:BrightnessScorer"
CREDENTIAL_VARS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                   "AWS_DEFAULT_PROFILE")


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    return three_shards(tmp_path_factory)


@pytest.fixture(scope="module")
def iam(local):
    with iam_s3_server(local[0]) as (endpoint, users):
        yield endpoint, users


@pytest.fixture(scope="module")
def run_folder(local, tmp_path_factory):
    """A local scoring run of the shards: what `filter --write-shards` filters."""
    out = str(tmp_path_factory.mktemp("run") / "out")
    r = _cli("score", local[0], "--scorer", SCORER, "--out", out, "--device", "cpu", "--workers", "0",
             "--no-progress", "--batch-size", "4", "--format", "jsonl")
    assert r.exit_code == 0, r.output
    return out


@pytest.fixture
def creds(iam, tmp_path, monkeypatch):
    """as_(user, source): the credentials of `user` (None: none at all) given through `source`
    (env, profile, option); returns the --storage-option arguments it needs."""
    endpoint, users = iam
    for k in CREDENTIAL_VARS:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    os.makedirs(tmp_path / "tmp")
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)

    def as_(user, source="env"):
        _clear_fsspec_cache()  # a client made with other credentials is not reused
        if user is None:
            return []
        key, secret = users[user]
        if source == "env":
            monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
            monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
        elif source == "profile":
            path = tmp_path / "credentials"
            path.write_text(f"[wdsf]\naws_access_key_id = {key}\naws_secret_access_key = {secret}\n")
            monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(path))
            (tmp_path / "config").write_text("[profile wdsf]\nregion = us-east-1\n")
            monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
            monkeypatch.setenv("AWS_PROFILE", "wdsf")
        else:
            return ["--storage-option", f"key={key}", "--storage-option", f"secret={secret}"]
        return []
    yield as_
    _clear_fsspec_cache()


def _cli(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


SOURCES = {"env": "the environment (AWS_ACCESS_KEY_ID)", "profile": "the AWS profile 'wdsf'",
           "option": "storage options (key, secret)"}


def _one_error_line(output: str) -> str:
    [line] = [ln for ln in output.splitlines() if "error:" in ln]
    return line


def _bucket_keys(iam, prefix: str):
    """What the bucket holds under `prefix`, listed with the reader's credentials."""
    import boto3
    endpoint, users = iam
    client = boto3.session.Session().client(  # a new session: the default one keeps the files it read
        "s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id=users["reader"][0],
        aws_secret_access_key=users["reader"][1])
    return [o["Key"] for o in client.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])]


@pytest.mark.parametrize("source", SOURCES)
def test_a_read_only_user_is_refused_writes_before_any_work(iam, creds, local, run_folder, tmp_path, source):
    options = creds("reader", source)
    secret = iam[1]["reader"][1]
    score = _cli("score", local[0], "--scorer", SCORER, "--out", f"s3://{BUCKET}/runs/{source}", "--device", "cpu",
                 "--workers", "0", "--no-progress", *options)
    filtered = _cli("filter", run_folder, "--min", "brightness=0.5", "--write-shards", f"s3://{BUCKET}/kept/{source}",
                    *options)
    for r, option, url in ((score, "--out", f"runs/{source}"), (filtered, "--write-shards", f"kept/{source}")):
        assert r.exit_code == 2, r.output
        line = _one_error_line(r.output)
        assert f"{option} s3://{BUCKET}/{url}: access denied for writing" in line, line
        assert f"credentials: {SOURCES[source]}" in line and "Traceback" not in r.output
        assert secret not in r.output
    assert "shard(s) to score" not in score.output  # refused before the key check, the models, the probe
    assert _bucket_keys(iam, "runs/") == [] and _bucket_keys(iam, "kept/") == []
    assert not os.listdir(tmp_path / "tmp")  # no staging copy left
    for root, _, names in os.walk(run_folder):  # nor a secret in what the filter wrote locally
        for name in names:
            with open(os.path.join(root, name), "rb") as f:
                assert secret.encode() not in f.read(), name


def test_no_credentials_at_all_is_one_line_naming_them(iam, creds, local, run_folder):
    creds(None)
    score = _cli("score", local[0], "--scorer", SCORER, "--out", f"s3://{BUCKET}/runs/anyone", "--device", "cpu",
                 "--workers", "0", "--no-progress")
    filtered = _cli("filter", run_folder, "--min", "brightness=0.5", "--write-shards", f"s3://{BUCKET}/kept/anyone")
    listed = _cli("validate", f"s3://{BUCKET}/shards/")
    for r, where in ((score, f"--out s3://{BUCKET}/runs/anyone"), (filtered, f"--write-shards s3://{BUCKET}/kept/anyone"),
                     (listed, f"s3://{BUCKET}/shards/")):
        assert r.exit_code == 2, r.output
        line = _one_error_line(r.output)
        assert line.split("error: ", 1)[1].startswith(where) and "no credentials were found" in line, line
        assert "AWS_ACCESS_KEY_ID" in line and "Traceback" not in r.output
    # every shard refused for that one reason: one line (exit 2), not a report of identical findings
    alone = _cli("validate", f"s3://{BUCKET}/shards/shard-0000.tar", f"s3://{BUCKET}/shards/shard-0001.tar")
    assert alone.exit_code == 2 and "none of the 2 shard(s) could be opened" in _one_error_line(alone.output)
    assert "no credentials were found" in alone.output, alone.output
    # beside a shard that is read, the refused one is a finding
    report = json.loads(_cli("validate", local[1][0], f"s3://{BUCKET}/shards/shard-0000.tar", "--format",
                             "json").output)
    shard = report["shards"][1]
    assert shard["findings"] == {"remote_access_denied": 1}, shard
    assert "no credentials were found" in report["findings"][0]["message"]


@pytest.mark.parametrize("source", SOURCES)
def test_forbidden_reads_name_the_credential_source(iam, creds, source, local):
    options = creds("nobody", source)
    secret = iam[1]["nobody"][1]
    listed = _cli("validate", f"s3://{BUCKET}/shards/", *options)
    assert listed.exit_code == 2 and secret not in listed.output, listed.output
    line = _one_error_line(listed.output)
    assert f"s3://{BUCKET}/shards/: listing is forbidden" in line and f"credentials: {SOURCES[source]}" in line
    alone = _cli("validate", f"s3://{BUCKET}/shards/shard-0000.tar", *options)  # every shard refused: one line
    line = _one_error_line(alone.output)
    assert alone.exit_code == 2 and "access denied" in line and f"credentials: {SOURCES[source]}" in line, line
    assert secret not in alone.output
    r = _cli("validate", local[1][0], f"s3://{BUCKET}/shards/shard-0000.tar", "--format", "json", *options)
    assert r.exit_code == 1 and secret not in r.output
    report = json.loads(r.output)
    assert report["shards"][1]["findings"] == {"remote_access_denied": 1}
    message = report["findings"][0]["message"]
    assert "access denied" in message and f"credentials: {SOURCES[source]}" in message, message


def test_a_refused_validate_output_is_found_late_and_names_the_credentials(iam, creds, local):
    """validate's --output and --stats-dir are written at the end (a probe object would stay behind
    where the user may not delete): refused, one line, exit 3, naming the object, the refused write
    and the credential source; nothing written."""
    creds("reader", "env")
    secret = iam[1]["reader"][1]
    for option, url in (("--output", f"s3://{BUCKET}/reports/r.json"), ("--stats-dir", f"s3://{BUCKET}/stats/")):
        r = _cli("validate", local[0], option, url, "--format", "json")
        assert r.exit_code == 3 and secret not in r.output, r.output
        line = _one_error_line(r.output)
        assert f"writing s3://{BUCKET}/" in line and "access denied for writing" in line, line
        assert f"credentials: {SOURCES['env']}" in line
    assert _bucket_keys(iam, "reports/") == [] and _bucket_keys(iam, "stats/") == []
