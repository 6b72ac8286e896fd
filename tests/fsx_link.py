"""Stand-in for FSx for Lustre's links to S3, the one part of the storage design that cannot run here.

``links_of(app)`` reads every link the storage stack declares (data repository associations, and
the import/export paths of a file system linked without them), with bucket names as the cluster
config renders them. ``Link`` then does to a local folder and a real S3 API (moto_server) what FSx
does to the file system and the bucket: export copies new and changed files under the linked path
to the bucket and deletes the objects of files deleted there; import brings new and changed objects
of the linked prefix into the folder. Both run when called, where FSx runs them continuously.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath


@dataclass
class Link:
    file_system: str  # data | checkpoints | logs
    mount_path: PurePosixPath  # what the link covers, as nodes see it (mount dir + FileSystemPath)
    bucket: str
    prefix: str  # "" or "some/prefix/"
    import_events: tuple[str, ...]
    export_events: tuple[str, ...]
    _exported: set[str] = field(default_factory=set)

    @property
    def s3_root(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    def covers(self, s3_uri: str) -> bool:
        """Whether FSx would export to (and import from) this S3 location."""
        return s3_uri.startswith(self.s3_root)

    def key(self, node_path: str) -> str | None:
        """The S3 key a file at ``node_path`` (e.g. /fsx/checkpoints/model1/latest) exports to, if any."""
        path = PurePosixPath(node_path)
        if path != self.mount_path and self.mount_path not in path.parents:
            return None
        return self.prefix + path.relative_to(self.mount_path).as_posix()

    def export(self, root: Path, s3) -> None:
        """Auto-export: ``root`` is the host folder standing in for ``mount_path``."""
        present = {p.relative_to(root).as_posix(): p for p in root.rglob("*") if p.is_file()}
        for rel, path in present.items():
            key, body = self.prefix + rel, path.read_bytes()
            in_s3 = _get(s3, self.bucket, key)
            event = "NEW" if in_s3 is None else "CHANGED" if in_s3 != body else None
            if event in self.export_events:
                s3.put_object(Bucket=self.bucket, Key=key, Body=body)
        if "DELETED" in self.export_events:
            for rel in self._exported - present.keys():
                s3.delete_object(Bucket=self.bucket, Key=self.prefix + rel)
        self._exported = set(present)

    def import_(self, root: Path, s3) -> None:
        """Auto-import (new and changed objects; lazy loading is modelled as an eager copy)."""
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix):
            for obj in page.get("Contents", []):
                path = root / obj["Key"][len(self.prefix):]
                body = _get(s3, self.bucket, obj["Key"])
                event = "NEW" if not path.exists() else "CHANGED" if path.read_bytes() != body else None
                if event in self.import_events:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_bytes(body)


def _get(s3, bucket: str, key: str) -> bytes | None:
    try:
        return s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    except s3.exceptions.NoSuchKey:
        return None


def links_of(app, bucket_names: dict[str, str]) -> list[Link]:
    """Every FSx link of a synthesized app's storage stack. ``bucket_names``: the storage stack's
    bucket attribute (``checkpoint_bucket``...) -> the name to use for it."""
    storage = app.stacks["storage"]
    # An adopted bucket (storage.keep_buckets) is no resource of the stack: its links name it literally.
    names = {storage.get_logical_id(getattr(storage, attr).node.default_child): name for attr, name in bucket_names.items()
             if getattr(storage, attr).node.default_child is not None}
    file_systems = {storage.get_logical_id(fs): key for key, fs in storage.file_systems.items()}
    mounts = {key: PurePosixPath(fs.mount_dir) for key, fs in app.settings.storage.file_systems().items()}
    resources = app.template_json("storage")["Resources"]
    links = []
    for logical_id, resource in resources.items():
        props = resource.get("Properties", {})
        if resource["Type"] == "AWS::FSx::DataRepositoryAssociation":
            key = file_systems[props["FileSystemId"]["Ref"]]
            s3_config = props.get("S3", {})
            links.append(_link(key, mounts[key] / props["FileSystemPath"].lstrip("/"),
                               _resolve(props["DataRepositoryPath"], names),
                               s3_config.get("AutoImportPolicy", {}).get("Events", []),
                               s3_config.get("AutoExportPolicy", {}).get("Events", [])))
        elif resource["Type"] == "AWS::FSx::FileSystem":
            lustre = props.get("LustreConfiguration", {})
            if "ImportPath" in lustre or "ExportPath" in lustre:
                # A file system linked without associations: whole file system, one path each way.
                key = file_systems[logical_id]
                policy = lustre.get("AutoImportPolicy", "NONE")
                imports = [] if policy == "NONE" else policy.split("_")
                if "ImportPath" in lustre:
                    links.append(_link(key, mounts[key], _resolve(lustre["ImportPath"], names), imports, []))
                if "ExportPath" in lustre:  # exported by data repository tasks; counted as a full export
                    links.append(_link(key, mounts[key], _resolve(lustre["ExportPath"], names), [],
                                       ["NEW", "CHANGED", "DELETED"]))
    return links


def _link(file_system: str, mount_path: PurePosixPath, uri: str, imports, exports) -> Link:
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    prefix = prefix.strip("/")
    return Link(file_system, mount_path, bucket, prefix + "/" if prefix else "", tuple(imports), tuple(exports))


def _resolve(value, names: dict[str, str]) -> str:
    """A CloudFormation string value (plain, Ref, Fn::Join) with bucket Refs replaced by names."""
    if isinstance(value, str):
        return value
    if set(value) == {"Ref"}:
        return names[value["Ref"]]
    if set(value) == {"Fn::Join"}:
        separator, parts = value["Fn::Join"]
        return separator.join(_resolve(part, names) for part in parts)
    raise ValueError(f"cannot resolve {value!r}: only strings, bucket Refs and Fn::Join are modelled")
