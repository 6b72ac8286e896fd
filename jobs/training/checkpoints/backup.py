"""Back the newest complete checkpoint up to S3, write-once, then verify every object against the local files.

    python -m training.checkpoints.backup /fsx/checkpoints/model1 s3://my-backup-bucket/model1 [--logs /fsx/logs/model1]

Uploads ``<step dir>/*`` to ``<prefix>/<step dir>/`` (and the log folder, if given, to
``<prefix>/logs/<step dir>/``) with SHA-256 checksums (S3 checks every part on arrival), then asks S3
for each object's size and checksum and compares them with checksums computed from the local files;
``<prefix>/verified/<step dir>`` is written only after every object matches, the same "pointer last"
rule as on FSx: the newest backup is the highest step listed under ``verified/``.

Backups are write-once: every upload is conditional (``If-None-Match: *``), so S3 refuses to replace
an existing key, and the backup bucket's policy refuses cluster nodes any write without it. An object
already in S3 with the right size and checksum is not uploaded again, so a rerun after an
interruption sends only what is missing; an object with other bytes is reported, never replaced.
The step folder must be ``step_<digits>`` directly inside the checkpoint folder (``latest`` is not
followed elsewhere). ``jobs/backup.sh`` runs this as its own CPU job once training has completed.
Progress: a bar on a terminal, a percent/rate/ETA line every 30 s in the job log. Exit codes
(docs/cli.md): 1 when S3 holds something other than the local files, 2 when there is nothing valid
to back up.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import boto3
from botocore.exceptions import ClientError
from cli import ArgumentParser, fail
from cli.progress import Progress

log = logging.getLogger(__name__)
PART_BYTES = 64 * 2**20  # multipart threshold and part size; the expected checksum depends on it
STEP_NAME = re.compile(r"step_[0-9]+")  # checkpoint.py's step folders; nothing else may be backed up
VERIFIED = "verified"  # <prefix>/verified/<step>: written last, once every object of the step matches
# S3's answers to a conditional write whose key exists (412), or that raced another write of it (409).
REFUSED_OVERWRITE = ("PreconditionFailed", "ConditionalRequestConflict")


class BackupError(RuntimeError):
    """The checkpoint could not be backed up, or S3 holds something other than the local files."""


class VerificationFailed(BackupError):
    """S3 holds something other than the local files (``verified/<step>`` is not written)."""


def backup(checkpoint_dir: str | Path, s3_uri: str, *, logs_dir: str | Path | None = None, client=None,
           workers: int = 8) -> str:
    """Upload and verify the checkpoint named by ``latest`` (and ``logs_dir``); returns the S3 URI of the step folder."""
    bucket, prefix = _parse(s3_uri)
    step_dir = _latest_complete(Path(checkpoint_dir))
    keys = {f: f"{prefix}{step_dir.name}/{rel}" for f, rel in _files(step_dir)}
    if logs_dir is not None:
        keys |= {f: f"{prefix}logs/{step_dir.name}/{rel}" for f, rel in _files(Path(logs_dir))}
    client = client or boto3.client("s3")

    def head(key: str) -> dict | None:
        try:
            return client.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise

    def upload_and_verify(path: Path) -> tuple[bool, str | None]:
        """(uploaded, problem): skips an object S3 already holds intact, else uploads a new one and checks it."""
        key, size, expected = keys[path], path.stat().st_size, _s3_sha256(path)
        found = head(key)
        uploaded = False
        if found is None:
            try:
                _put_new(client, path, bucket, key)
                uploaded = True
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") not in REFUSED_OVERWRITE:
                    raise
            found = head(key) or {}
        progress.update(size)
        if not _matches(found, size, expected):
            reported = found.get("ChecksumSHA256") or "none"
            return uploaded, (f"{key}: S3 has {found.get('ContentLength')} bytes, SHA-256 {reported}; local {size} bytes, "
                              f"{expected} (backups are write-once: the object is kept, not replaced)")
        return uploaded, None

    files = sorted(keys)
    total = sum(f.stat().st_size for f in files)
    log.info("backing up %d files (%.2f GiB) from %s to s3://%s/%s%s/", len(files), total / 2**30, step_dir,
             bucket, prefix, step_dir.name)
    with Progress(total, f"backup {step_dir.name}", write=log.info) as progress, ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(upload_and_verify, files))
    uploaded = sum(sent for sent, _ in results)
    problems = [problem for _, problem in results if problem]
    if problems:
        raise VerificationFailed(f"backup verification failed, {VERIFIED}/{step_dir.name} not written:\n  "
                                 + "\n  ".join(sorted(problems)))
    verified = f"{prefix}{VERIFIED}/{step_dir.name}"
    if head(verified) is None:
        client.put_object(Bucket=bucket, Key=verified, Body=f"{step_dir.name}\n".encode(), ChecksumAlgorithm="SHA256",
                          IfNoneMatch="*")
    target = f"s3://{bucket}/{prefix}{step_dir.name}/"
    log.info("backed up and verified %d files (%d uploaded, %d already in S3): %s", len(files), uploaded,
             len(files) - uploaded, target)
    return target


def _put_new(client, path: Path, bucket: str, key: str) -> None:
    """Write ``path`` to a key that must not exist yet (S3 refuses otherwise): one PutObject below
    PART_BYTES, else a multipart upload of PART_BYTES parts whose completion carries the condition.
    boto3's transfer manager cannot pass If-None-Match, hence the explicit parts."""
    if path.stat().st_size < PART_BYTES:
        client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes(), ChecksumAlgorithm="SHA256", IfNoneMatch="*")
        return
    upload_id = client.create_multipart_upload(Bucket=bucket, Key=key, ChecksumAlgorithm="SHA256")["UploadId"]
    try:
        parts = []
        with open(path, "rb") as f:
            while chunk := f.read(PART_BYTES):
                number = len(parts) + 1
                sent = client.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=chunk,
                                          ChecksumAlgorithm="SHA256")
                parts.append({"PartNumber": number, "ETag": sent["ETag"], "ChecksumSHA256": sent["ChecksumSHA256"]})
        client.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts},
                                         IfNoneMatch="*")
    except BaseException:
        # No parts left behind to pay for (the bucket's lifecycle rule would also drop them after 7 days).
        client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
        raise


def _files(folder: Path) -> list[tuple[Path, str]]:
    """(file, key suffix) of every file under ``folder``; a link to a file outside it is refused."""
    if not folder.is_dir():
        raise BackupError(f"{folder} is not a folder — check the path")
    inside = folder.resolve()
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    outside = [p for p in files if not p.resolve().is_relative_to(inside)]
    if outside:
        raise BackupError(f"{outside[0]} links to {outside[0].resolve()}, outside {folder} — "
                          "a backup holds this folder's own files only; replace the link with the file")
    return [(p, p.relative_to(folder).as_posix()) for p in files]


def _matches(head: dict, size: int, expected: str) -> bool:
    """S3's size and SHA-256 (whole or composite, "<b64>-<parts>") equal the local file's."""
    return head.get("ContentLength") == size and (head.get("ChecksumSHA256") or "").split("-")[0] == expected


def _latest_complete(root: Path) -> Path:
    """The step folder ``root/latest`` names: ``step_<digits>`` directly inside ``root`` (not a link to
    elsewhere, e.g. another model's folder), holding a complete checkpoint."""
    try:
        name = (root / "latest").read_text().strip()
    except OSError:
        raise BackupError(f"no checkpoint to back up: {root}/latest does not exist — "
                          "check the folder, or train until a checkpoint is saved") from None
    if not STEP_NAME.fullmatch(name):
        raise BackupError(f"{root}/latest names {name!r}, not a step folder of this model — "
                          f"write the name of one of {root}/step_<digits> into it")
    step_dir = root / name
    if step_dir.is_symlink() or step_dir.resolve().parent != root.resolve():
        raise BackupError(f"{step_dir} is a link to {step_dir.resolve()}, outside {root} — "
                          "back up this model's own checkpoint folder: point latest at a real step folder")
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
    """The checksum S3 reports for this file uploaded by _put_new: whole-object SHA-256 below the
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
    parser = ArgumentParser(prog="python -m training.checkpoints.backup", description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint_dir", help="the model's checkpoint folder (holds `latest`)")
    parser.add_argument("s3_uri", help="s3://bucket/prefix to copy the checkpoint to")
    parser.add_argument("--logs", help="the model's log folder, copied to <prefix>/logs/<step>/")
    parser.add_argument("--workers", type=int, default=8, help="files transferred at once (default 8)")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error(f"--workers {args.workers}: needs at least 1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        backup(args.checkpoint_dir, args.s3_uri, logs_dir=args.logs, workers=args.workers)
    except VerificationFailed as exc:
        print(f"problem: {exc}", file=sys.stderr)
        return 1
    except BackupError as exc:
        return fail(exc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
