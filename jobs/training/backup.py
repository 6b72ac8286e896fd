"""Back the newest complete checkpoint up to S3, then verify every object against the local files.

    python -m training.backup /fsx/checkpoints/model1 s3://my-checkpoint-bucket/model1

Uploads ``<step dir>/*`` to ``<prefix>/<step dir>/`` with SHA-256 checksums (S3 checks every part
on arrival), then asks S3 for each object's size and checksum and compares them with checksums
computed from the local files; ``<prefix>/latest`` is written only after that succeeds, the same
"pointer last" rule as on FSx. The batch script runs this once, from the batch shell. Progress:
a bar on a terminal, a percent/rate/ETA line every 30 s in the job log. Exit codes (docs/cli.md):
1 when S3 holds something other than the local files, 2 when there is nothing valid to back up.
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

    def upload_and_verify(path: Path) -> str | None:
        key = keys[path]
        client.upload_file(str(path), bucket, key, ExtraArgs={"ChecksumAlgorithm": "SHA256"}, Config=TRANSFER)
        head = client.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
        size, expected = path.stat().st_size, _s3_sha256(path)
        reported = head.get("ChecksumSHA256", "")
        progress.update(size)
        if head["ContentLength"] != size or reported.split("-")[0] != expected:
            return f"{key}: S3 has {head['ContentLength']} bytes, SHA-256 {reported or 'none'}; local {size} bytes, {expected}"
        return None

    total = sum(f.stat().st_size for f in files)
    log.info("uploading %d files (%.2f GiB) from %s to s3://%s/%s%s/", len(files), total / 2**30, step_dir,
             bucket, prefix, step_dir.name)
    with Progress(total, f"backup {step_dir.name}", write=log.info) as progress, ThreadPoolExecutor(workers) as pool:
        problems = [p for p in pool.map(upload_and_verify, files) if p]
    if problems:
        raise VerificationFailed("backup verification failed, latest pointer not written:\n  " + "\n  ".join(problems))
    client.put_object(Bucket=bucket, Key=f"{prefix}latest", Body=f"{step_dir.name}\n".encode(), ChecksumAlgorithm="SHA256")
    target = f"s3://{bucket}/{prefix}{step_dir.name}/"
    log.info("backed up and verified %d files: %s", len(files), target)
    return target


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
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        backup(args.checkpoint_dir, args.s3_uri)
    except VerificationFailed as exc:
        print(f"problem: {exc}", file=sys.stderr)
        return 1
    except BackupError as exc:
        return fail(exc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
