"""Back the newest complete checkpoint up to S3, then verify every object against the local files.

    python -m training.backup /fsx/checkpoints/model1 s3://my-backup-bucket/model1

Uploads ``<step dir>/*`` to ``<prefix>/<step dir>/`` with SHA-256 checksums (S3 checks every part
on arrival), then asks S3 for each object's size and checksum and compares them with checksums
computed from the local files; ``<prefix>/latest`` is written only after every object matches, the
same "pointer last" rule as on FSx. An object already in S3 with the right size and checksum is not
uploaded again, so a rerun after an interruption sends only what is missing or different.
``jobs/backup.sh`` runs this as its own CPU job once training has completed. Progress: a bar on a
terminal, a percent/rate/ETA line every 30 s in the job log. Exit codes (docs/cli.md): 1 when S3
holds something other than the local files, 2 when there is nothing valid to back up.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.exceptions import ClientError
from cli import ArgumentParser, fail
from cli.progress import Progress

log = logging.getLogger(__name__)
PART_BYTES = 64 * 2**20  # multipart threshold and part size; the expected checksum depends on it
TRANSFER = TransferConfig(multipart_threshold=PART_BYTES, multipart_chunksize=PART_BYTES, max_concurrency=8)


class BackupError(RuntimeError):
    """The checkpoint could not be backed up, or S3 holds something other than the local files."""


class VerificationFailed(BackupError):
    """S3 holds something other than the local files (``latest`` is not written)."""


def backup(checkpoint_dir: str | Path, s3_uri: str, *, client=None, workers: int = 8) -> str:
    """Upload and verify the checkpoint named by ``latest``; returns the S3 URI of the step folder."""
    bucket, prefix = _parse(s3_uri)
    root = Path(checkpoint_dir)
    step_dir = _latest_complete(root)
    client = client or boto3.client("s3")
    files = sorted(p for p in step_dir.rglob("*") if p.is_file())
    keys = {f: f"{prefix}{step_dir.name}/{f.relative_to(step_dir).as_posix()}" for f in files}

    def head(key: str) -> dict | None:
        try:
            return client.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise

    def upload_and_verify(path: Path) -> tuple[bool, str | None]:
        """(uploaded, problem): skips an object S3 already holds intact, else uploads and checks it."""
        key, size, expected = keys[path], path.stat().st_size, _s3_sha256(path)
        found = head(key)
        if found and _matches(found, size, expected):
            progress.update(size)
            return False, None
        client.upload_file(str(path), bucket, key, ExtraArgs={"ChecksumAlgorithm": "SHA256"}, Config=TRANSFER)
        found = head(key) or {}
        progress.update(size)
        if not _matches(found, size, expected):
            reported = found.get("ChecksumSHA256") or "none"
            return True, f"{key}: S3 has {found.get('ContentLength')} bytes, SHA-256 {reported}; local {size} bytes, {expected}"
        return True, None

    total = sum(f.stat().st_size for f in files)
    log.info("backing up %d files (%.2f GiB) from %s to s3://%s/%s%s/", len(files), total / 2**30, step_dir,
             bucket, prefix, step_dir.name)
    with Progress(total, f"backup {step_dir.name}", write=log.info) as progress, ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(upload_and_verify, files))
    uploaded = sum(sent for sent, _ in results)
    problems = [problem for _, problem in results if problem]
    if problems:
        raise VerificationFailed("backup verification failed, latest pointer not written:\n  " + "\n  ".join(sorted(problems)))
    client.put_object(Bucket=bucket, Key=f"{prefix}latest", Body=f"{step_dir.name}\n".encode(), ChecksumAlgorithm="SHA256")
    target = f"s3://{bucket}/{prefix}{step_dir.name}/"
    log.info("backed up and verified %d files (%d uploaded, %d already in S3): %s", len(files), uploaded,
             len(files) - uploaded, target)
    return target


def _matches(head: dict, size: int, expected: str) -> bool:
    """S3's size and SHA-256 (whole or composite, "<b64>-<parts>") equal the local file's."""
    return head.get("ContentLength") == size and (head.get("ChecksumSHA256") or "").split("-")[0] == expected


def _latest_complete(root: Path) -> Path:
    try:
        step_dir = root / (root / "latest").read_text().strip()
    except OSError:
        raise BackupError(f"no checkpoint to back up: {root}/latest does not exist — "
                          "check the folder, or train until a checkpoint is saved") from None
    missing = [name for name in (".metadata", "train_meta.json") if not (step_dir / name).is_file()]
    if missing:
        raise BackupError(f"{step_dir} is not a complete checkpoint (missing {', '.join(missing)}) — "
                          "point latest at a complete one")
    return step_dir


def _parse(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://") or len(uri) <= 5:
        raise BackupError(f"{uri!r} is not an S3 URI — write it as s3://bucket/prefix")
    bucket, _, prefix = uri[5:].partition("/")
    return bucket, (prefix.strip("/") + "/") if prefix.strip("/") else ""


def _s3_sha256(path: Path) -> str:
    """The checksum S3 reports for this file uploaded with TRANSFER: whole-object SHA-256 below the
    multipart threshold, otherwise the SHA-256 of the concatenated part digests ("composite")."""
    parts = []
    with open(path, "rb") as f:
        while chunk := f.read(PART_BYTES):
            parts.append(hashlib.sha256(chunk).digest())
    if path.stat().st_size < PART_BYTES:
        digest = parts[0] if parts else hashlib.sha256(b"").digest()
    else:
        digest = hashlib.sha256(b"".join(parts)).digest()
    return base64.b64encode(digest).decode()


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m training.backup", description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint_dir", help="the model's checkpoint folder (holds `latest`)")
    parser.add_argument("s3_uri", help="s3://bucket/prefix to copy the checkpoint to")
    parser.add_argument("--workers", type=int, default=8, help="files transferred at once (default 8)")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error(f"--workers {args.workers}: needs at least 1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        backup(args.checkpoint_dir, args.s3_uri, workers=args.workers)
    except VerificationFailed as exc:
        print(f"problem: {exc}", file=sys.stderr)
        return 1
    except BackupError as exc:
        return fail(exc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
