"""Sync a local folder to S3 with a SHA-256 manifest, and verify it.

    python -m data_pipeline.upload sync LOCAL_DIR s3://bucket/prefix [--workers 8] [--part-mb 64]
    python -m data_pipeline.upload verify s3://bucket/prefix [--deep]
    python -m data_pipeline.upload restore s3://bucket/prefix LOCAL_DIR

sync hashes every file, skips those already in S3 with the same size and SHA-256 (stored as
object metadata ``sha256`` at upload), uploads the rest in parallel (multipart above
``--part-mb``), and writes ``s3://bucket/prefix/manifest.json`` ({path: {size, sha256}}) last, so
a manifest means a complete upload; an interrupted sync resumes by running it again.
A key that is not in S3 yet is written with ``If-None-Match: *`` (S3 refuses it if another writer
created it meanwhile): the data bucket keeps ``tokenized/`` and ``tokenizers/`` write-once, refusing any
write without that header there (stacks/storage_stack.py), so a file that changed after its sync cannot
replace the synced one: sync the changed dataset to a new folder. Elsewhere (``raw/``) a changed file
replaces the old one, whose version the bucket keeps.
verify checks every manifest entry against the objects (presence, size, stored SHA-256; with
``--deep`` it downloads and re-hashes) and exits 1 naming each bad file.
restore copies every manifest entry back into LOCAL_DIR and checks its SHA-256 (files already there
with the right size and SHA-256 are kept): for a folder no FSx link lazy-loads, e.g. a local NVMe
cache or a file system without a data repository association. All three show progress
(a bar on a terminal, a percent/rate/ETA line every 30 s in logs). Exit codes: docs/cli.md.

Credentials come from the usual AWS chain (instance role on the cluster); ``--endpoint-url`` or
``AWS_ENDPOINT_URL`` points at another S3 API (tests use a local one).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from cli import ArgumentParser, fail
from cli.progress import Progress

MANIFEST = "manifest.json"


class UploadError(Exception):
    pass


def parse_s3_url(url: str) -> tuple[str, str]:
    if not url.startswith("s3://") or len(url) <= 5:
        raise UploadError(f"{url!r} is not an S3 URL — write it as s3://bucket/prefix")
    bucket, _, prefix = url[5:].partition("/")
    return bucket, prefix.strip("/")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


def _client(endpoint_url: str | None, workers: int):
    import boto3
    from botocore.config import Config
    return boto3.client("s3", endpoint_url=endpoint_url,
                        config=Config(max_pool_connections=max(10, workers * 2),
                                      retries={"mode": "adaptive", "max_attempts": 10}))


def _key(prefix: str, rel: str) -> str:
    return f"{prefix}/{rel}" if prefix else rel


def _check_bucket(s3, bucket: str) -> None:
    from botocore.exceptions import ClientError
    try:
        s3.head_bucket(Bucket=bucket)
    except ClientError as e:
        code = e.response.get("Error", {}).get("Code", "")
        if code in ("404", "NoSuchBucket"):
            raise UploadError(f"bucket {bucket!r} does not exist — check the name (cdk deploy prints it)") from None
        if code in ("403", "AccessDenied"):
            raise UploadError(f"access denied to bucket {bucket!r} — check the IAM policy of these credentials") from None
        raise


def _remote_sha(s3, bucket: str, key: str) -> tuple[int, str | None] | None:
    from botocore.exceptions import ClientError
    try:
        head = s3.head_object(Bucket=bucket, Key=key)
    except ClientError as e:
        if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return None
        raise
    return head["ContentLength"], head.get("Metadata", {}).get("sha256")


def _remote_body(s3, bucket: str, key: str) -> bytes | None:
    from botocore.exceptions import ClientError
    try:
        return s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    except ClientError as e:
        if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return None
        raise


# Why a write to the data bucket was refused, by S3's error code: a conditional put (If-None-Match) lost to
# another sync, or a write-once prefix (tokenized/, tokenizers/) refusing to replace a key.
RACED = ("PreconditionFailed", "ConditionalRequestConflict")
WRITE_ONCE = ("AccessDenied", "403")
REFUSALS = {
    RACED: "was written by another sync meanwhile — run the sync again (it skips what matches) or sync to a new folder",
    WRITE_ONCE: ("exists with other content and may not be replaced (the data bucket keeps tokenized/ and "
                 "tokenizers/ write-once) — sync the changed dataset to a new folder"),
}


def _write(bucket: str, key: str, put, refused: tuple[str, ...]) -> None:
    """``put``, with S3's ``refused`` error codes turned into one clear line (``REFUSALS``)."""
    from botocore.exceptions import ClientError
    try:
        put()
    except ClientError as e:
        if e.response.get("Error", {}).get("Code", "") in refused:
            raise UploadError(f"s3://{bucket}/{key} {REFUSALS[refused]}") from None
        raise


def _put_new(s3, path: Path, bucket: str, key: str, part_bytes: int, metadata: dict) -> None:
    """Write ``path`` to a key that must not exist yet: one PutObject below ``part_bytes``, else a multipart
    upload whose completion carries If-None-Match (boto3's transfer manager cannot pass it)."""
    if path.stat().st_size < part_bytes:
        _write(bucket, key, lambda: s3.put_object(Bucket=bucket, Key=key, Body=path.read_bytes(),
                                                  Metadata=metadata, IfNoneMatch="*"), RACED)
        return
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key=key, Metadata=metadata)["UploadId"]
    try:
        parts = []
        with open(path, "rb") as f:
            while chunk := f.read(part_bytes):
                sent = s3.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=len(parts) + 1, Body=chunk)
                parts.append({"PartNumber": len(parts) + 1, "ETag": sent["ETag"]})
        _write(bucket, key, lambda: s3.complete_multipart_upload(
            Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}, IfNoneMatch="*"), RACED)
    except BaseException:
        s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)  # no parts left to pay for
        raise


def sync(local_dir, url: str, *, endpoint_url=None, workers: int = 8, part_mb: int = 64) -> dict:
    from boto3.s3.transfer import TransferConfig

    local_dir = Path(local_dir)
    if not local_dir.is_dir():
        raise UploadError(f"local folder {local_dir} does not exist — check the path")
    bucket, prefix = parse_s3_url(url)
    files = sorted(p for p in local_dir.rglob("*") if p.is_file() and p.name != MANIFEST)
    if not files:
        raise UploadError(f"no files under {local_dir} — check the path (nothing to upload)")
    s3 = _client(endpoint_url, workers)
    _check_bucket(s3, bucket)
    transfer = TransferConfig(multipart_threshold=part_mb << 20, multipart_chunksize=part_mb << 20,
                              max_concurrency=workers)

    def one(path: Path) -> tuple[str, dict, bool]:
        rel = path.relative_to(local_dir).as_posix()
        entry = {"size": path.stat().st_size, "sha256": sha256_file(path)}
        key = _key(prefix, rel)
        remote = _remote_sha(s3, bucket, key)
        if remote == (entry["size"], entry["sha256"]):
            progress.update(entry["size"])
            return rel, entry, False
        if remote is None:
            _put_new(s3, path, bucket, key, part_mb << 20, {"sha256": entry["sha256"]})
        else:
            _write(bucket, key, lambda: s3.upload_file(str(path), bucket, key, Config=transfer,
                                                       ExtraArgs={"Metadata": {"sha256": entry["sha256"]}}), WRITE_ONCE)
        progress.update(entry["size"])
        return rel, entry, True

    with Progress(sum(p.stat().st_size for p in files), f"sync {local_dir} -> {url}") as progress, \
            ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(one, files))
    manifest = {"version": 1, "files": {rel: entry for rel, entry, _ in results}}
    body, key = json.dumps(manifest, indent=1).encode(), _key(prefix, MANIFEST)
    if _remote_body(s3, bucket, key) is None:
        _write(bucket, key, lambda: s3.put_object(Bucket=bucket, Key=key, Body=body,
                                                  ContentType="application/json", IfNoneMatch="*"), RACED)
    elif _remote_body(s3, bucket, key) != body:
        _write(bucket, key, lambda: s3.put_object(Bucket=bucket, Key=key, Body=body, ContentType="application/json"),
               WRITE_ONCE)
    uploaded = [rel for rel, _, up in results if up]
    return {"url": url, "files": len(results), "uploaded": len(uploaded),
            "skipped": len(results) - len(uploaded),
            "uploaded_bytes": sum(manifest["files"][r]["size"] for r in uploaded),
            "manifest": f"s3://{bucket}/{_key(prefix, MANIFEST)}"}


def verify(url: str, *, endpoint_url=None, deep: bool = False, workers: int = 8) -> list[str]:
    """Problems found (empty when every manifest entry matches its object)."""
    bucket, prefix = parse_s3_url(url)
    s3 = _client(endpoint_url, workers)
    _check_bucket(s3, bucket)
    manifest = _read_manifest(s3, bucket, prefix, url)

    def check(item) -> str | None:
        try:
            return _check(item)
        finally:
            progress.update(item[1]["size"])

    def _check(item) -> str | None:
        rel, want = item
        key = _key(prefix, rel)
        remote = _remote_sha(s3, bucket, key)
        if remote is None:
            return f"{rel}: missing at s3://{bucket}/{key}"
        size, sha = remote
        if size != want["size"]:
            return f"{rel}: size {size} in S3, manifest says {want['size']}"
        if sha != want["sha256"]:
            return f"{rel}: SHA-256 {sha or 'none'} in S3 metadata, manifest says {want['sha256']}"
        if deep:
            h = hashlib.sha256()
            for chunk in s3.get_object(Bucket=bucket, Key=key)["Body"].iter_chunks(8 << 20):
                h.update(chunk)
            if h.hexdigest() != want["sha256"]:
                return f"{rel}: content SHA-256 {h.hexdigest()}, manifest says {want['sha256']}"
        return None

    total = sum(entry["size"] for entry in manifest.values())
    with Progress(total, f"verify {url}{' (deep)' if deep else ''}") as progress, ThreadPoolExecutor(workers) as pool:
        return [p for p in pool.map(check, sorted(manifest.items())) if p]


def restore(url: str, local_dir, *, endpoint_url=None, workers: int = 8) -> dict:
    """Download what ``url``'s manifest lists into ``local_dir``, each file checked against its SHA-256."""
    bucket, prefix = parse_s3_url(url)
    s3 = _client(endpoint_url, workers)
    _check_bucket(s3, bucket)
    manifest = _read_manifest(s3, bucket, prefix, url)
    local_dir = Path(local_dir)

    def one(item) -> tuple[bool, str | None]:
        try:
            return _one(item)
        finally:
            progress.update(item[1]["size"])

    def _one(item) -> tuple[bool, str | None]:
        """(downloaded, problem)"""
        rel, want = item
        path = local_dir / rel
        if path.is_file() and path.stat().st_size == want["size"] and sha256_file(path) == want["sha256"]:
            return False, None
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.part")
        s3.download_file(bucket, _key(prefix, rel), str(tmp))
        got = sha256_file(tmp)
        if got != want["sha256"]:
            tmp.unlink()
            return True, f"{rel}: downloaded SHA-256 {got}, manifest says {want['sha256']}"
        tmp.replace(path)  # only complete, checked files get their real name
        return True, None

    total = sum(entry["size"] for entry in manifest.values())
    with Progress(total, f"restore {url} -> {local_dir}") as progress, ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(one, sorted(manifest.items())))
    downloaded = sum(fetched for fetched, _ in results)
    return {"url": url, "dir": str(local_dir), "files": len(results), "downloaded": downloaded,
            "skipped": len(results) - downloaded, "problems": [p for _, p in results if p]}


def _read_manifest(s3, bucket: str, prefix: str, url: str) -> dict:
    from botocore.exceptions import ClientError
    try:
        body = s3.get_object(Bucket=bucket, Key=_key(prefix, MANIFEST))["Body"].read()
    except ClientError as e:
        if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey"):
            raise UploadError(f"no {MANIFEST} at {url} — run `sync` first") from None
        raise
    return json.loads(body)["files"]


def main(argv=None) -> int:
    p = ArgumentParser(prog="python -m data_pipeline.upload", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    # The options shared by both commands are given after the command, as the usage lines show.
    common = ArgumentParser(add_help=False)
    common.add_argument("--endpoint-url", default=os.environ.get("AWS_ENDPOINT_URL"),
                        help="S3 API endpoint (default: AWS)")
    common.add_argument("--workers", type=int, default=8, help="parallel transfers")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sync", parents=[common], help="upload changed files and write the manifest")
    s.add_argument("local_dir")
    s.add_argument("url", help="s3://bucket/prefix")
    s.add_argument("--part-mb", type=int, default=64, help="multipart threshold and part size")
    v = sub.add_parser("verify", parents=[common], help="check the objects against the manifest")
    v.add_argument("url", help="s3://bucket/prefix")
    v.add_argument("--deep", action="store_true", help="download and re-hash every object")
    r = sub.add_parser("restore", parents=[common], help="download the manifest's files and check their SHA-256")
    r.add_argument("url", help="s3://bucket/prefix")
    r.add_argument("local_dir")
    a = p.parse_args(argv)
    if a.workers < 1:
        p.error(f"--workers {a.workers}: needs at least 1")
    from boto3.exceptions import Boto3Error
    from botocore.exceptions import (BotoCoreError, ClientError, EndpointConnectionError,
                                     NoCredentialsError, PartialCredentialsError)
    try:
        if a.cmd == "sync":
            print(json.dumps(sync(a.local_dir, a.url, endpoint_url=a.endpoint_url,
                                  workers=a.workers, part_mb=a.part_mb)))
            return 0
        if a.cmd == "restore":
            result = restore(a.url, a.local_dir, endpoint_url=a.endpoint_url, workers=a.workers)
            for problem in result.pop("problems"):
                print(f"problem: {problem}", file=sys.stderr)
                result["bad"] = result.get("bad", 0) + 1
            print(json.dumps(result))
            return 1 if result.get("bad") else 0
        problems = verify(a.url, endpoint_url=a.endpoint_url, deep=a.deep, workers=a.workers)
        for problem in problems:
            print(f"problem: {problem}", file=sys.stderr)
        print(json.dumps({"url": a.url, "ok": not problems, "bad": len(problems)}))
        return 1 if problems else 0
    except UploadError as e:
        return fail(e)
    except (NoCredentialsError, PartialCredentialsError):
        return fail("no AWS credentials found", "use the instance role on the cluster, or set "
                    "AWS_PROFILE / AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY")
    except EndpointConnectionError as e:
        return fail(f"cannot reach S3: {e}", "check --endpoint-url / AWS_ENDPOINT_URL and the network")
    except (ClientError, BotoCoreError, Boto3Error) as e:
        return fail(f"S3 request failed: {e}", "check the bucket, the IAM policy and the region")


if __name__ == "__main__":
    sys.exit(main())
