"""Typed, validated settings for one environment, loaded from ``cluster_config/<env>.yaml``.

This module is the single place where settings are checked. Everything downstream (the CDK
stacks, the ParallelCluster config renderer, the planner) receives a ``Settings`` object and
can trust it. A bad file fails here with a message naming the file, the field and the fix.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
import unicodedata
from datetime import datetime, timedelta, timezone
from pathlib import Path, PurePosixPath
from typing import Any, Literal, Optional, get_args

import yaml
from pydantic import (BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator,
                      model_validator)
from training.config import IDENTITY_KEYS, overridden  # torch-free, from jobs/ (cluster_config/__init__.py)

from cluster_config.offerings import GPUS_PER_INSTANCE, GRAFANA_REGIONS, check_offered, zones

CONFIG_DIR = Path(__file__).resolve().parent

# FSx for Lustre SSD, both persistent types: 1.2 TiB, 2.4 TiB, then increments of 2.4 TiB (values in GiB).
# MB/s per TiB of storage each deployment type offers.
FSX_THROUGHPUTS = {"PERSISTENT_2": (125, 250, 500, 1000), "PERSISTENT_1": (50, 100, 200)}


# Where the cluster's generated files (config, model list, agents' and capacity-end settings) lie in
# the assets bucket; the head node reads them from there.
CONFIG_PREFIX = "cluster/"


# Each model's jobs run as a POSIX user of the model's name, so that no job of one model can write or delete
# another's folders. Its uid (and its group's gid) follows from the name, so that every node, booting on its
# own without a directory service, makes the same user; node_scripts/directory_setup.sh (model_uid) applies
# the same formula. Names the cluster's images already give a user are not model names.
MODEL_UID_BASE, MODEL_UID_RANGE = 40000, 20000
SYSTEM_USERS = frozenset({"root", "ec2-user", "ubuntu", "rocky", "centos", "ssm-user", "slurm", "munge", "nobody",
                          "admin", "dcv", "dcvsmgr", "pcluster-admin", "sshd", "chrony", "nfsnobody"})


def model_uid(name: str) -> int:
    """The uid and gid of the model's user and group on every node."""
    return MODEL_UID_BASE + int(hashlib.sha256(name.encode()).hexdigest()[:8], 16) % MODEL_UID_RANGE


class SettingsError(ValueError):
    """A settings file is missing or invalid; the message says where and how to fix it."""


class _Strict(BaseModel):
    # Unknown keys are typos until proven otherwise; settings never change after loading; .nan and .inf
    # are no sane value of anything here.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic takes true as 1 and false as 0, and YAML reads true/false, yes/no and on/off as
        # booleans: `nodes: true` would be one node. No number here is ever written as a boolean.
        if isinstance(value, bool) and info.field_name:
            annotation = cls.model_fields[info.field_name].annotation
            types = get_args(annotation) or (annotation,)  # Optional[float]: (float, NoneType)
            if bool not in types and (int in types or float in types):
                kind = "whole number" if int in types else "number"
                raise ValueError(f"{str(value).lower()} is a boolean, not a {kind} (YAML reads true/false, yes/no and "
                                 f"on/off as booleans); write a {kind}")
        return value


# SSH allow-list breadth. A private range reaches the head node only over a VPN or peering, an internet
# range reaches its public address directly: wider than these is everybody, not an allow-list.
SSH_WIDEST_PREFIX = 8
SSH_WIDEST_PUBLIC_PREFIX = 16
# RFC 1918's private ranges. The VPC's block lies in one: addresses inside it are routed within the VPC, so
# an internet range would hide the hosts that own those addresses from the cluster. AWS also accepts
# 100.64.0.0/10 (RFC 6598's carrier-grade NAT space, for secondary blocks such as EKS pods) and even
# public ranges; neither is the cluster's one block, which a VPN or peered network must route to.
PRIVATE_BLOCKS = tuple(ipaddress.IPv4Network(block) for block in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))


class NetworkSettings(_Strict):
    vpc_cidr: str = "10.0.0.0/16"
    # Empty: no SSH at all, administrators use SSM Session Manager. Otherwise a short allow-list.
    ssh_allowed_cidrs: list[str] = Field(default_factory=list)

    @field_validator("vpc_cidr")
    @classmethod
    def _vpc_cidr(cls, value: str) -> str:
        network = _parse_cidr(value)
        # AWS accepts /16 to /28; the cluster's subnets need at least a /20.
        if not 16 <= network.prefixlen <= 20:
            raise ValueError(f"{value} is not a usable VPC block; use a /16 to /20 block, e.g. 10.0.0.0/16")
        if not any(network.subnet_of(block) for block in PRIVATE_BLOCKS):
            why = ("an internet range, and inside the VPC it would hide the internet hosts at those addresses"
                   if network.is_global else "not a private range of RFC 1918")
            raise ValueError(
                f"{value} is {why}; use a block of RFC 1918's 10.0.0.0/8, 172.16.0.0/12 or 192.168.0.0/16, e.g. 10.0.0.0/16"
            )
        return value

    @field_validator("ssh_allowed_cidrs")
    @classmethod
    def _ssh_cidrs(cls, values: list[str]) -> list[str]:
        fix = "remove it to use SSM Session Manager (the default), or list your office/VPN range, e.g. 203.0.113.0/24"
        for value in values:
            network = _parse_cidr(value)
            if network.prefixlen == 0:
                raise ValueError(f"{value} opens SSH to the whole internet; {fix}")
            if network.prefixlen < SSH_WIDEST_PREFIX:
                raise ValueError(
                    f"{value} opens SSH to {network.num_addresses:,} addresses, more than a /{SSH_WIDEST_PREFIX}; {fix}"
                )
            private = any(network.subnet_of(block) for block in PRIVATE_BLOCKS)
            if not private and network.prefixlen < SSH_WIDEST_PUBLIC_PREFIX:
                raise ValueError(
                    f"{value} is an internet range of {network.num_addresses:,} addresses, and the head node has a "
                    f"public address in its public subnet: list no more than a /{SSH_WIDEST_PUBLIC_PREFIX} of "
                    f"the internet (your office or VPN egress), or a private range reached over your VPN; or {fix}"
                )
        return values


PCLUSTER_VERSION = "3.16.1"  # the schema we validate against and the custom resource we deploy (Slurm 25.11.8)
# ParallelCluster 3.16.1's default for both bootstrap timeouts (pcluster/constants.py
# NODE_BOOTSTRAP_TIMEOUT); a shorter one only makes slow bootstraps fail sooner.
PCLUSTER_BOOTSTRAP_TIMEOUT_S = 2100
# The most instances one Capacity Block for ML holds (EC2 User Guide, "Capacity Blocks for ML").
CAPACITY_BLOCK_MAX_INSTANCES = 64
# AWS begins terminating a Capacity Block's instances this long before the block ends (EC2 User Guide).
CAPACITY_BLOCK_END_NOTICE = timedelta(minutes=30)
# The shipped examples (prod.yaml's Capacity Blocks, the accounts of one repeated digit): `python -m
# cluster_config deploy-check` refuses them before any deploy, so their dates are illustrations that the
# settings do not hold against the clock (the shipped files keep loading after their dates).
EXAMPLE_RESERVATIONS = frozenset({"cr-0a1b2c3d4e5f60718", "cr-0a1b2c3d4e5f60729"})


def is_example_account(account: str) -> bool:
    return len(set(account)) == 1


# A bootstrap still running after this long is stuck, and a node waits for the timeout before it is replaced.
MAX_BOOTSTRAP_TIMEOUT_S = 4 * 3600


def _bootstrap_timeout(field: str, value: int) -> int:
    if value < PCLUSTER_BOOTSTRAP_TIMEOUT_S:
        raise ValueError(
            f"{value} s is below ParallelCluster's default bootstrap timeout of {PCLUSTER_BOOTSTRAP_TIMEOUT_S} s, "
            f"and a bootstrap that runs out of it fails the node; set {field}: {PCLUSTER_BOOTSTRAP_TIMEOUT_S} or more"
        )
    if value > MAX_BOOTSTRAP_TIMEOUT_S:
        raise ValueError(
            f"{value} s is above {MAX_BOOTSTRAP_TIMEOUT_S} s: a bootstrap that long is stuck, and the node waits out "
            f"the timeout before it is replaced; set {field} between {PCLUSTER_BOOTSTRAP_TIMEOUT_S} and {MAX_BOOTSTRAP_TIMEOUT_S}"
        )
    return value


# A root volume above 16 TiB (gp3's largest for years) is a typo: the nodes keep their data on FSx.
MAX_EBS_GIB = 16384
# Sane ceilings of counts: a queue of more nodes, or a reservation of more instances, is a typo.
MAX_NODES = 1000


class HeadNodeSettings(_Strict):
    instance_type: str
    root_volume_gib: int = Field(200, ge=40, le=MAX_EBS_GIB)
    # DevSettings.Timeouts.HeadNodeBootstrapTimeout: the head node's OnNodeConfigured builds the jobs'
    # PyTorch venv from PyPI, and the CUDA torch wheel with its nvidia-* libraries is ~3-4 GB (~6 min
    # at 10 MB/s) plus the install; ParallelCluster's default (2,100 s in 3.16.1) leaves little margin
    # for a slow mirror, and running out of it rolls back the whole cluster creation.
    bootstrap_timeout_s: int = 3600

    @field_validator("bootstrap_timeout_s")
    @classmethod
    def _timeout(cls, value: int) -> int:
        return _bootstrap_timeout("head_node.bootstrap_timeout_s", value)


class CapacityReservationSettings(_Strict):
    id: str
    instance_count: int = Field(gt=0, le=MAX_NODES)
    # odcr: an On-Demand Capacity Reservation (nodes start and stop at will, CapacityType ONDEMAND).
    # capacity_block: a Capacity Block for ML (fixed dates, at most 64 instances; CapacityType
    # CAPACITY_BLOCK, and ParallelCluster needs every node static). Both ids start with cr-.
    kind: Literal["odcr", "capacity_block"] = "odcr"
    # A Capacity Block's end, with its zone (e.g. 2027-01-18T11:30:00Z): the plan flags a model that
    # would still be training when AWS terminates the block's instances.
    end: Optional[datetime] = None

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        if not re.fullmatch(r"cr-[0-9a-f]{17}", value):
            raise ValueError(
                f"{value!r} is not a capacity reservation id; expected 'cr-' followed by 17 "
                "lowercase hex digits, e.g. cr-0123456789abcdef0 (EC2 console > Capacity Reservations)"
            )
        return value

    @field_validator("end")
    @classmethod
    def _end(cls, value: Optional[datetime]) -> Optional[datetime]:
        return _aware(value)

    @model_validator(mode="after")
    def _block_size(self) -> "CapacityReservationSettings":
        if self.kind == "capacity_block" and self.instance_count > CAPACITY_BLOCK_MAX_INSTANCES:
            raise ValueError(
                f"instance_count {self.instance_count} is above {CAPACITY_BLOCK_MAX_INSTANCES}, the most instances "
                "one Capacity Block holds (EC2 User Guide, Capacity Blocks for ML); list each block you bought "
                "as its own capacity_reservations entry (e.g. 80 nodes as two blocks of 40)"
            )
        if self.end is not None and self.kind != "capacity_block":
            raise ValueError(
                f"end is set for {self.id}, an ODCR: its instances keep running On-Demand after it ends; "
                "remove end (only a Capacity Block's end stops training)"
            )
        return self


class EfaSettings(_Strict):
    enabled: bool = True
    gdr_support: bool = True  # GPUDirect RDMA: p4d/p5 instances


class RootVolumeSettings(_Strict):
    size_gib: int = Field(200, ge=35, le=MAX_EBS_GIB)
    iops: int = Field(3000, ge=3000, le=16000)
    throughput_mib_s: int = Field(125, ge=125, le=1000)


class GpuQueueSettings(_Strict):
    name: str = "gpu"
    instance_type: str
    # Follows from instance_type where cluster_config/hardware.py knows it; required for another type.
    gpus_per_instance: int = Field(gt=0, le=16)
    min_count: int = Field(0, ge=0, le=MAX_NODES)
    max_count: int = Field(gt=0, le=MAX_NODES)
    # One compute resource each (render.py). Several: a Capacity Block holds at most 64 instances,
    # so a larger reserved queue is several blocks. All of one kind: CapacityType is per queue.
    capacity_reservations: list[CapacityReservationSettings] = Field(default_factory=list)
    placement_group: bool = True
    efa: EfaSettings = EfaSettings()
    root_volume: RootVolumeSettings = RootVolumeSettings()
    price_per_instance_hour_usd: float = Field(gt=0, le=1000)
    # Nodes kept out of every model's share (its Slurm QOS), so that a job requeued after a node
    # failure restarts at once instead of waiting for ParallelCluster to replace the node. What N
    # spares buy and cost, and which models give up the nodes: `python -m cluster_config plan --env
    # ENV --spares N` (docs/goodput.md).
    spare_nodes: int = Field(0, ge=0, le=MAX_NODES)
    # With a Capacity Block end: minutes before capacity_end (AWS's termination notice) from which
    # Slurm starts nothing on the queue (a maintenance reservation); room for a save that overran its
    # limit to finish under SIGTERM (KillWait). Synth checks it (cluster_config/capacity_end.py).
    capacity_end_lead_min: int = Field(10, gt=0, le=24 * 60)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return _queue_name("gpu_queue", value, "gpu", "jobs/acceptance.sh")

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "capacity_reservation" in data:
            raise ValueError(
                "capacity_reservation is now capacity_reservations, a list (one entry per reservation or "
                "Capacity Block); write capacity_reservations: [{id: cr-..., instance_count: N, kind: odcr}]"
            )
        return data

    @model_validator(mode="before")
    @classmethod
    def _gpus(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("instance_type") not in GPUS_PER_INSTANCE:
            return data
        known, given = GPUS_PER_INSTANCE[data["instance_type"]], data.get("gpus_per_instance")
        if given is not None and given != known:
            raise ValueError(
                f"gpus_per_instance {given} differs from the {known} GPUs of a {data['instance_type']}: the jobs would "
                f"ask Slurm for {given} GPUs a node and the plan would size for them; remove gpus_per_instance "
                "(it follows from instance_type)"
            )
        return {**data, "gpus_per_instance": known}

    @model_validator(mode="after")
    def _counts(self) -> "GpuQueueSettings":
        _check_counts(self.min_count, self.max_count)
        reservations = self.capacity_reservations
        if not reservations:
            return self
        ids = [r.id for r in reservations]
        twice = sorted({i for i in ids if ids.count(i) > 1})
        if twice:
            raise ValueError(
                f"capacity_reservations lists {', '.join(twice)} more than once; list each reservation once "
                "(every Capacity Block you buy has its own id)"
            )
        kinds = {r.kind for r in reservations}
        if len(kinds) > 1:
            by_kind = "; ".join(f"{k}: {', '.join(r.id for r in reservations if r.kind == k)}" for k in sorted(kinds))
            raise ValueError(
                f"capacity_reservations mixes kinds ({by_kind}), but ParallelCluster's CapacityType is per queue "
                "(ONDEMAND for an ODCR, CAPACITY_BLOCK for a Capacity Block); keep one kind in gpu_queue"
            )
        total = self.reserved_count
        split = f" ({' + '.join(str(r.instance_count) for r in reservations)})" if len(reservations) > 1 else ""
        if self.capacity_type == "CAPACITY_BLOCK":
            if self.max_count != total:
                raise ValueError(
                    f"max_count {self.max_count} differs from the Capacity Blocks' total instance_count {total}"
                    f"{split}: ParallelCluster runs each block's instances as static nodes, all of them; "
                    f"set max_count: {total} (and min_count: {total}), or list the blocks you hold"
                )
            if self.min_count != self.max_count:
                raise ValueError(
                    f"min_count {self.min_count} differs from max_count {self.max_count}, but capacity_reservations "
                    f"are of kind capacity_block: ParallelCluster launches a Capacity Block's nodes only as static "
                    f"nodes; set min_count: {self.max_count} (or use kind: odcr for On-Demand Capacity Reservations)"
                )
            if self.placement_group:
                raise ValueError(
                    "placement_group is true, but a Capacity Block places its instances itself and a placement group "
                    "on top causes insufficient-capacity errors (ParallelCluster warns); set placement_group: false"
                )
            return self
        if self.max_count > total:
            raise ValueError(
                f"max_count {self.max_count} is above the capacity reservations' total instance_count {total}{split}; "
                f"lower max_count to {total} or enlarge the reservations"
            )
        last = reservations[-1]
        if self.max_count <= total - last.instance_count:
            raise ValueError(
                f"max_count {self.max_count} leaves the last of capacity_reservations ({last.id}) no node: nodes "
                f"fill the reservations in order{split}; raise max_count above {total - last.instance_count} "
                f"or remove {last.id}"
            )
        return self

    @property
    def capacity_type(self) -> str:
        """ParallelCluster's queue CapacityType for the reservations (one kind per queue)."""
        reservations = self.capacity_reservations
        return "CAPACITY_BLOCK" if reservations and reservations[0].kind == "capacity_block" else "ONDEMAND"

    @property
    def capacity_end(self) -> Optional[datetime]:
        """When AWS begins terminating the reservations' instances: the earliest Capacity Block end,
        less the 30-minute notice (a model's nodes may sit in any block); None without an end."""
        ends = [r.end for r in self.capacity_reservations if r.end is not None]
        return min(ends) - CAPACITY_BLOCK_END_NOTICE if ends else None

    @property
    def reserved_count(self) -> int:
        """Instances the capacity reservations hold together (0 without any)."""
        return sum(r.instance_count for r in self.capacity_reservations)

    def node_counts(self) -> list[tuple[int, int]]:
        """(MinCount, MaxCount) per capacity reservation, in order: min_count and max_count fill the
        reservations in the order listed (a Capacity Block: all of its instances, static)."""
        counts, min_left, max_left = [], self.min_count, self.max_count
        for reservation in self.capacity_reservations:
            high = min(reservation.instance_count, max_left)
            low = min(high, min_left)
            counts.append((low, high))
            min_left, max_left = min_left - low, max_left - high
        return counts


class CpuQueueSettings(_Strict):
    name: str = "cpu"
    instance_type: str
    min_count: int = Field(0, ge=0, le=MAX_NODES)
    max_count: int = Field(gt=0, le=MAX_NODES)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return _queue_name("cpu_queue", value, "cpu", "jobs/backup.sh, jobs/preprocess.sh and jobs/sync_dataset.sh")

    @model_validator(mode="after")
    def _counts(self) -> "CpuQueueSettings":
        _check_counts(self.min_count, self.max_count)
        return self


def _queue_name(key: str, value: str, fixed: str, scripts: str) -> str:
    # The jobs bundle submits to the queue by this name in #SBATCH --partition lines, which sbatch reads
    # before any of the settings could reach the script: another name would leave those jobs pending.
    if value != fixed:
        raise ValueError(f"{value!r}: the jobs bundle submits to the partition {fixed!r} by name ({scripts}); "
                         f"set {key}.name: {fixed}")
    return value


def _check_counts(min_count: int, max_count: int) -> None:
    if min_count > max_count:
        raise ValueError(f"min_count {min_count} is above max_count {max_count}; lower min_count")


# Where a file system may not be mounted: the operating system's and ParallelCluster's own directories
# (mounted over, their files vanish) or anything under them; and the usual parents of mounts themselves
# (ParallelCluster's SharedStorageMountDirValidator refuses both kinds).
SYSTEM_DIRS = ("/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib64", "/opt", "/proc", "/root", "/run",
               "/sbin", "/sys", "/tmp", "/usr", "/var")
MOUNT_PARENTS = ("/mnt", "/media", "/srv")
# A sane ceiling of one file system's size: 2 PiB.
MAX_FSX_GIB = 2400 * 900


class FileSystemSettings(_Strict):
    storage_capacity_gib: int
    throughput_per_tib: int  # MB/s per TiB
    mount_dir: str
    data_compression: Literal["LZ4", "NONE"] = "LZ4"

    @field_validator("storage_capacity_gib")
    @classmethod
    def _capacity(cls, value: int) -> int:
        if value > MAX_FSX_GIB:
            raise ValueError(f"{value} GiB is above {MAX_FSX_GIB} GiB (2 PiB), more than any training run here needs; "
                             "lower it to a multiple of 2400")
        if value not in (1200, 2400) and (value <= 0 or value % 2400):
            above = (value // 2400 + 1) * 2400 if value > 1200 else 1200
            below = 1200 if above <= 2400 else above - 2400
            nearest = f"{below} or {above}" if below != above else f"{above}"
            raise ValueError(
                f"{value} GiB is not a valid FSx for Lustre persistent SSD size; use 1200, 2400 or a multiple of 2400 "
                f"(nearest: {nearest})"
            )
        return value

    @field_validator("mount_dir")
    @classmethod
    def _mount_dir(cls, value: str) -> str:
        if not re.fullmatch(r"/[A-Za-z0-9_\-/]+", value) or value.endswith("/") or "//" in value:
            raise ValueError(f"{value!r} must be an absolute path without a trailing slash, e.g. /fsx/data")
        system = [d for d in SYSTEM_DIRS if value == d or value.startswith(d + "/")]
        if system or value in MOUNT_PARENTS:
            where = f"on or under {system[0]}" if system else f"on {value}"
            raise ValueError(f"{value!r} mounts the file system {where}, which the operating system or ParallelCluster "
                             "uses; mount it elsewhere, e.g. /fsx/data")
        return value

    @property
    def throughput_mb_s(self) -> float:
        """Aggregate throughput the file system is provisioned for."""
        return self.storage_capacity_gib / 1024 * self.throughput_per_tib


# S3's rules for a bucket name: 3 to 63 lowercase letters, digits, dots and hyphens, starting and ending
# with a letter or digit, no two dots in a row, not an IP address.
BUCKET_NAME = re.compile(r"^(?!\d+\.\d+\.\d+\.\d+$)(?!.*\.\.)[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


class KeptBuckets(_Strict):
    """Buckets a destroyed deployment kept (`cdk destroy` retains them), adopted by name instead of new
    ones: the new file systems link to them, so a new cluster sees the old data and checkpoints.
    Their names are the stack's outputs DataBucketName, CheckpointBucketName and BackupBucketName."""

    data: Optional[str] = None
    checkpoints: Optional[str] = None
    backups: Optional[str] = None

    @field_validator("data", "checkpoints", "backups")
    @classmethod
    def _bucket_name(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and not BUCKET_NAME.match(value):
            raise ValueError(f"{value!r} is not an S3 bucket name (3-63 lowercase letters, digits, dots and "
                             f"hyphens); copy it from the old stack's outputs (aws cloudformation describe-stacks) "
                             f"or `aws s3 ls`")
        return value


class StorageSettings(_Strict):
    # PERSISTENT_2 (default): S3 links are data repository associations. PERSISTENT_1: for regions
    # without PERSISTENT_2; the file system's own ImportPath/ExportPath/AutoImportPolicy link S3.
    deployment_type: Literal["PERSISTENT_2", "PERSISTENT_1"] = "PERSISTENT_2"
    data: FileSystemSettings
    checkpoints: FileSystemSettings
    logs: FileSystemSettings
    # What training reads per GPU per second, for the planner's throughput check.
    data_read_mb_s_per_gpu: float = Field(2.0, ge=0, le=10000)
    # Come back to your data: after `cdk destroy`, name the kept buckets here and `cdk deploy` adopts them.
    keep_buckets: KeptBuckets = Field(default_factory=KeptBuckets)

    @model_validator(mode="after")
    def _distinct_mounts(self) -> "StorageSettings":
        mounts = [self.data.mount_dir, self.checkpoints.mount_dir, self.logs.mount_dir]
        if len(set(mounts)) != len(mounts):
            raise ValueError(f"mount_dir values must differ, got {mounts}")
        for outer, fs in self.file_systems().items():
            for inner, other in self.file_systems().items():
                if other.mount_dir.startswith(fs.mount_dir + "/"):
                    raise ValueError(
                        f"{inner}.mount_dir {other.mount_dir} lies inside {outer}.mount_dir {fs.mount_dir}: it would "
                        f"hide that part of {outer}, or stay empty where {outer} mounts last; mount each file system "
                        "beside the others, e.g. /fsx/data, /fsx/checkpoints, /fsx/logs"
                    )
        kept = [name for name in (self.keep_buckets.data, self.keep_buckets.checkpoints, self.keep_buckets.backups) if name]
        if len(set(kept)) != len(kept):
            raise ValueError(f"keep_buckets names one bucket twice ({kept}): data, checkpoints and backups each "
                             f"need their own (backups must stay unreachable from the file systems' links)")
        offered = FSX_THROUGHPUTS[self.deployment_type]
        for name, fs in self.file_systems().items():
            if fs.throughput_per_tib not in offered:
                raise ValueError(
                    f"{name}.throughput_per_tib: {fs.throughput_per_tib} MB/s/TiB is not offered for "
                    f"{self.deployment_type}; use one of {', '.join(map(str, offered))} (deployment_type sets the tiers)"
                )
        return self

    def file_systems(self) -> dict[str, FileSystemSettings]:
        return {"data": self.data, "checkpoints": self.checkpoints, "logs": self.logs}


# Training-config keys a model's entry sets (cluster_config/model_configs.py), and the entry's field for each.
ENTRY_KEYS = {"name": "name", "model.preset": "preset", "data.path": "dataset", "data.tokenizer": "tokenizer",
              "data.seq_len": "seq_len", "train.steps": "steps", "train.global_batch_size": "global_batch_size"}


def _data_path(value: str) -> None:
    # jobs/preprocess.sh reads a model's paths back as words split on spaces, and the trainer expands
    # $ in them: plain characters only.
    if not re.fullmatch(r"[A-Za-z0-9._/-]+", value):
        raise ValueError(f"{value!r} holds a space or a character the shell treats specially; use letters, "
                         "digits and . _ - / only")


class MegatronSettings(_Strict):
    """How Megatron-LM trains a model (``megatron:`` in its entry): the layout of its ranks and what
    each keeps. Checked against Megatron-LM's own rules at synth, with the model's architecture
    (cluster_config/megatron.py: the plan and the job files refuse a layout Megatron would)."""

    tensor_parallel: int = Field(1, gt=0, le=64)  # --tensor-model-parallel-size: within a node (NVLink)
    pipeline_parallel: int = Field(1, gt=0, le=256)  # --pipeline-model-parallel-size: stages of layers
    micro_batch_size: int = Field(1, gt=0, le=4096)  # sequences per rank per forward; gradients accumulate
    # --sequence-parallel: norms and dropout on 1/TP of the sequence; default: on with tensor parallel.
    sequence_parallel: Optional[bool] = None
    # --recompute-activations (selective: attention only) or full (each layer keeps only its input).
    recompute: Literal["none", "selective", "full"] = "selective"
    precision: Literal["bf16", "fp16"] = "bf16"
    distributed_optimizer: bool = True  # --use-distributed-optimizer: optimizer state sharded over DP
    save_every: int = Field(1000, gt=0, le=10**8)  # --save-interval, in iterations (optimizer steps)

    @property
    def sequence_parallel_on(self) -> bool:
        return self.tensor_parallel > 1 if self.sequence_parallel is None else self.sequence_parallel


class ModelPlan(_Strict):
    """One model sharing the cluster, described once: its job script and training config are derived
    from this entry (cluster_config/model_jobs.py), in every environment."""

    name: str
    nodes: int = Field(gt=0, le=MAX_NODES)  # its share of the GPU queue, enforced by its Slurm QOS
    # The architecture (jobs/training/models/presets.py): a shorthand (llama2-7b), a Hugging Face config shipped as
    # jobs/training/architectures/<name>/config.json (llama3.1-8b), or an absolute path to a config.json
    # that exists at synth too (the plan sizes the model from it).
    preset: str
    # jobs/training/configs/<recipe>.yaml: optimizer, parallelism, micro-batch, checkpoint cadence;
    # default: the recipe named like the preset (a path: like its folder).
    recipe: Optional[str] = None
    seq_len: int = Field(gt=0, le=2**20)  # tokens per sequence; the dataset is tokenized at this length
    global_batch_size: int = Field(gt=0, le=2**20)  # sequences per optimizer step
    steps: int = Field(gt=0, le=10**8)  # optimizer steps; tokens = steps x global_batch_size x seq_len
    dataset: str  # token shards, under storage.data.mount_dir (jobs/preprocess.sh MODEL=<name> writes them)
    tokenizer: str  # folder with tokenizer.json, under storage.data.mount_dir (or a path starting with /)
    # Further training-config keys for this model, e.g. {train.micro_batch_size: 4}; never one the entry
    # sets itself (ENTRY_KEYS) nor the model's identity (its folders: training.config.IDENTITY_KEYS).
    overrides: dict[str, Any] = Field(default_factory=dict)
    # Nodes held in the model's allocation beyond ``nodes``, idle until a training node fails: the job
    # relaunches the step at once with a hot spare in the failed node's place, which loads the lost
    # node's shards from their buddy copy (recovery inside the job: cluster_config/goodput.py). They count
    # against gpu_queue.max_count like training nodes. `python -m cluster_config plan` shows, per model, the
    # GPU-hours a hot spare keeps idle against those it saves, at 1x and goodput.stress_factor x the failures.
    hot_spares: int = Field(0, ge=0, le=MAX_NODES)
    # With no hot spare free, the job goes on training with fewer nodes, down to this many, its global batch kept
    # by more micro-batches a step, until Slurm has nodes for its whole allocation again (jobs/train.sh, a planned
    # requeue); None: it waits for a replacement (requeue). The plan counts both (cluster_config/goodput.py).
    min_nodes: Optional[int] = Field(None, gt=0, le=MAX_NODES)
    # Trained by Megatron-LM instead of the project's trainer: its layout (docs/megatron.md). Its job
    # script runs jobs/megatron_lm/pretrain.sh with arguments derived from this entry.
    megatron: Optional[MegatronSettings] = None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not re.fullmatch(r"[a-z][a-z0-9-]{0,30}", value):
            raise ValueError(f"{value!r} must be lowercase letters, digits and '-', starting with a letter (it names directories)")
        if value == "ops":
            raise ValueError("'ops' is the Slurm account of the non-training jobs; name the model otherwise")
        if value in SYSTEM_USERS:
            raise ValueError(f"{value!r} is a user of the cluster's images, and a model's jobs run as a user of the "
                             "model's name; name the model otherwise")
        return value

    @field_validator("dataset")
    @classmethod
    def _relative(cls, value: str) -> str:
        _data_path(value)
        if value.startswith("/") or ".." in value.split("/") or not value.strip("/"):
            raise ValueError(f"{value!r} must be a folder under storage.data.mount_dir, e.g. tokenized/model1")
        return value.strip("/")

    @field_validator("tokenizer")
    @classmethod
    def _tokenizer(cls, value: str) -> str:
        _data_path(value)
        if ".." in value.split("/") or not value.strip("/"):
            raise ValueError(f"{value!r} must be a folder under storage.data.mount_dir (e.g. tokenizers/llama2) "
                             "or an absolute path")
        return value

    @model_validator(mode="after")
    def _min_nodes(self) -> "ModelPlan":
        if self.min_nodes is not None and self.min_nodes >= self.nodes:
            raise ValueError(f"{self.name}: min_nodes {self.min_nodes} must be below its nodes ({self.nodes}): the fewest "
                             f"nodes it goes on with after losing one; remove it to wait for a replacement instead")
        return self

    @model_validator(mode="after")
    def _overrides(self) -> "ModelPlan":
        for key in self.overrides:
            entry = overridden(key, tuple(ENTRY_KEYS))
            if entry:
                raise ValueError(f"{self.name}: overrides set {entry}, which the entry sets itself; "
                                 f"set {ENTRY_KEYS[entry]}: in the entry instead")
            identity = overridden(key, IDENTITY_KEYS)
            if identity:
                raise ValueError(f"{self.name}: overrides set {identity}, but a model's checkpoints and logs lie in "
                                 f"folders named after it (its jobs look for them there); remove {key}")
        return self

    @property
    def recipe_name(self) -> str:
        if self.recipe or not self.preset.startswith("/"):
            return self.recipe or self.preset
        path = PurePosixPath(self.preset)  # a config.json (or its folder): the recipe named like its folder
        return (path.parent if path.name == "config.json" else path).name


class PlanSettings(_Strict):
    """Assumptions of the plan (``python -m cluster_config plan``): how fast, by when, how big."""

    # Model FLOPs utilization of a step whose communication is hidden and which recomputes nothing;
    # each model's own MFU is estimated from it and its layout (cluster_config/plan.py: estimate_mfu).
    # 0.40: Meta trained Llama 3 405B at 38-43 % BF16 MFU on 8,192-16,384 H100 ("The Llama 3 Herd of
    # Models", 2024, Table 4); torchtitan's Llama 3.1 8B FSDP runs reach 33-39 %. Measured on one H100
    # (benchmarks/results/gpu_check_H100, communication absent): model7's rank 0 compiled 52-55 % (eager
    # 33-40 %), the 70B and 13B recipes at 2 layers 45 % and 38 %: kept at 0.40 until the acceptance run
    # measures the real layouts with their communication (plan --measured).
    # Below 1 %, days and failures grow past any meaning.
    mfu: float = Field(0.40, ge=0.01, le=1)
    deadline_days: Optional[float] = Field(None, gt=0, le=3650)  # flag models that finish later than this
    vocab_size: int = Field(32000, gt=0, le=2**20)  # the tokenizer's vocabulary (Llama 2's: 32,000)
    # Share of GPU memory held back for the CUDA context, NCCL buffers and allocator fragmentation.
    memory_headroom: float = Field(0.10, ge=0, lt=1)
    gpu_memory_gib: Optional[float] = Field(None, gt=0, le=1024)  # default: from gpu_queue.instance_type
    gpu_peak_tflops: Optional[float] = Field(None, gt=0, le=10000)  # dense bf16; default: from the instance type
    # A node's host memory, GiB; default: from gpu_queue.instance_type (cluster_config/hardware.py). The
    # in-memory snapshots (its own and its buddy's) must fit beside the data loaders and pinned staging.
    host_memory_gib: Optional[float] = Field(None, gt=0, le=65536)
    # Share of host memory held back for the OS, the training processes themselves (Python, CUDA and NCCL
    # host state) and the page cache.
    host_memory_headroom: float = Field(0.10, ge=0, lt=1)


class GoodputSettings(_Strict):
    """What the plan assumes of failures and recovery (cluster_config/goodput.py, docs/goodput.md)."""

    # Unexpected interruptions per 1,000 node-days. 3.8: Llama 3's pre-training, 419 in 54 days on
    # 16,384 H100 = 2,048 nodes (Dubey et al. 2024, "The Llama 3 Herd of Models", section 3.3.4);
    # Kokolis et al. 2024 (arXiv 2410.21680) measured 2.3 and 6.5 on two research clusters.
    # At most 1,000: every node failing once a day.
    failures_per_1000_node_days: float = Field(3.8, ge=0, le=1000)
    # From a failure to the restarted job's first step, when a node is free to restart on: detection
    # (a dead peer fails the collective within train.timeout_s, 100 s; a hang waits for the progress
    # watchdog, at least 180 s), the requeue (Slurm's prolog health check, its hold on a requeued
    # job) and the restart (rendezvous, NCCL start-up, reading the checkpoint: ~2 min for the 70B).
    # An assumption: the recovery benchmark measured 28 s on the local cluster, with a tiny model
    # and an 8 s watchdog (docs/training.md, Benchmarks), a floor rather than a production figure.
    recovery_s: float = Field(600, ge=0, le=86400)
    # Recovery inside the job (a hot spare free in the model's allocation, snapshots on): the step is
    # relaunched in the same allocation, survivors load their own snapshot from node memory and the hot
    # spare the lost node's shards from their buddy copy over EFA (cluster_config/hardware.py), then redo
    # the steps since the last snapshot (half an interval on average). Detection, from the failure to the
    # job step's end (measured on the local cluster: 0.4 s for a node's killed workers, 24 s for a lost node whose
    # sockets close; a node that goes silent is found by the trainer's peer heartbeats within train.peer_timeout_s
    # and a beat, training/resilience/heartbeat.py, where NCCL's collectives would wait out train.timeout_s):
    detection_s: float = Field(30, ge=0, le=86400)
    # ... and the relaunch and start-up: the new job step's processes, imports, rendezvous and NCCL's
    # communicators, up to the snapshot's load (its transfer is counted apart, from the bytes).
    relaunch_s: float = Field(60, ge=0, le=86400)
    # Growing a run on fewer nodes back to its whole allocation, with snapshots: the planned stop keeps the state in
    # the nodes' memory (a snapshot of the stop step, no save to FSx) and the job requeues itself asking for those
    # nodes. This is that stop and the requeue until the job runs again; the restart is relaunch_s and the returning
    # node's shards come over EFA (B / E), as in the job. Its parts: tests/training/test_slurm_relaunch.py.
    grow_back_requeue_s: float = Field(200, ge=0, le=86400)
    # At most this much training between two in-memory snapshots: each model's checkpoint.snapshot_every
    # is the most steps that fit in it at the plan's estimated step time (cluster_config/model_configs.py).
    snapshot_minutes: float = Field(5, gt=0, le=24 * 60)
    # How long a used hot spare stays out of the allocation: Slurm cannot add a node to a running job, so
    # the failed node's replacement joins the model's next job, after the time limit (the jobs' --time,
    # 24 h: cluster_config/model_jobs.py TIME_LIMIT) or a requeue. An assumption of the job script's design.
    hot_spare_refill_h: float = Field(24, gt=0, le=24 * 365)
    # The plan shows every model at goodput.failures_per_1000_node_days and at this many times it:
    # 6: from the all-cause failure rate measured on Meta's research clusters, which at our size gives
    # about six times as many failures as the rate above.
    stress_factor: float = Field(6, ge=1, le=1000)
    # A failed node's replacement, waited for when no spare node is free: clustermgtd finds the
    # DOWN/DRAINED static node within its 60 s loop and terminates it, the Capacity Block frees the
    # slot after several minutes of clean-up, and the new instance boots and runs the compute
    # bootstrap, which ParallelCluster fails after compute_bootstrap_timeout_s (2,100 s = 35 min).
    node_replacement_min: float = Field(25, gt=0, le=1440)
    # Slow-but-alive nodes (a throttling GPU, a degraded link, a noisy neighbour) per 1,000 node-days.
    # An assumption: no public fleet figure separates them from failures (MegaScale and ByteRobust evict
    # them in-house without a rate); set it from your own `straggler` events (metrics.jsonl).
    stragglers_per_1000_node_days: float = Field(1.0, ge=0, le=1000)
    # How much slower a straggler makes its model's steps: 0.10, the trainer's default margin.
    straggler_slowdown: float = Field(0.10, gt=0, le=10)
    # Without eviction, how long a slow node stays in its job before a person acts on the TrainingStraggler
    # warning (within the working day, nights and weekends included).
    straggler_unattended_h: float = Field(24, gt=0, le=24 * 365)
    # When the models' jobs start, with its zone (e.g. 2027-01-04T13:30:00Z); with the Capacity
    # Blocks' end (gpu_queue.capacity_reservations[].end) a model finishing after it is flagged.
    training_start: Optional[datetime] = None
    # Effective training time ratio (productive / wall time) below which a model is flagged.
    min_ettr: float = Field(0.95, gt=0, le=1)

    @field_validator("training_start")
    @classmethod
    def _start(cls, value: Optional[datetime]) -> Optional[datetime]:
        return _aware(value)


def _aware(value: Optional[datetime]) -> Optional[datetime]:
    if value is not None and value.tzinfo is None:
        raise ValueError(f"{value.isoformat()} has no time zone; write it in UTC with a Z, e.g. {value.isoformat()}Z")
    return value


class AlertsSettings(_Strict):
    """Who is told when something breaks, and when a silent model counts as stalled (docs/monitoring.md)."""

    # Addresses subscribed to the environment's SNS alert topic; each confirms the e-mail AWS sends.
    email: list[str] = Field(default_factory=list)
    # TrainingStalled fires after max(this, 5 x the model's median step time) without a step.
    stall_floor_s: int = Field(600, gt=0, le=86400)
    # An Amazon Managed Grafana workspace over the Prometheus workspace, which people reach in a browser
    # (`python -m cluster_config dashboard --env <name>` puts the repository's dashboard in it). Off by
    # default: it signs people in through IAM Identity Center, which must be enabled first.
    grafana: bool = False
    # A guard on spend: an AWS Budgets cost budget at the plan's expected cost (`plan`: the models' $ to finish),
    # a month's actual or forecast spend above it published to the alert topic (stacks/alerts_stack.py). Off by
    # default: Budgets bills each budget beyond the free ones of an account.
    budget: bool = False

    @field_validator("email")
    @classmethod
    def _emails(cls, value: list[str]) -> list[str]:
        for address in value:
            if not re.fullmatch(r"[^@\s]+@[^@\s]+\.[^@\s]+", address):
                raise ValueError(f"{address!r} is not an e-mail address, e.g. ml-oncall@example.com")
        if len(set(value)) != len(value):
            raise ValueError("an address is listed twice; list each once")
        return value


# AWS's tag rules, shared by the services the stacks tag (CloudFormation, EC2, FSx): a key of 1 to 128
# characters, a value of up to 256, letters, digits, spaces and _ . : / = + - @; keys starting with aws:
# (in any case) are AWS's own. ParallelCluster reserves parallelcluster: and takes at most 40 tags,
# keeping the rest of AWS's 50 a resource for its own (pcluster/constants.py MAX_TAGS_COUNT, 3.16.1).
TAG_KEY_MAX, TAG_VALUE_MAX, MAX_TAGS = 128, 256, 40
TAG_SYMBOLS = "_.:/=+-@"


def _tag_problem(key: str, value: str) -> Optional[str]:
    """What AWS or ParallelCluster refuses in the tag ``key: value``, with the fix; None when nothing."""
    if not key:
        return "a tag has an empty key; name it, or remove the tag"
    if len(key) > TAG_KEY_MAX:
        return f"key {key!r} is {len(key)} characters; AWS takes at most {TAG_KEY_MAX}: shorten it"
    if key.lower().startswith("aws:"):
        return (f"key {key!r} starts with {key[:4]!r}, a prefix AWS reserves for its own tags (in any case); "
                f"rename it, e.g. {key[4:] or 'owner'}")
    if key.startswith("parallelcluster:"):
        return f"key {key!r} starts with 'parallelcluster:', which ParallelCluster reserves for its own tags; rename it"
    if len(value) > TAG_VALUE_MAX:
        return f"{key}: the value is {len(value)} characters; AWS takes at most {TAG_VALUE_MAX}: shorten it"
    for where, text in ((f"key {key!r}", key), (f"{key}: the value", value)):
        odd = [c for c in text if unicodedata.category(c)[0] not in "LNZ" and c not in TAG_SYMBOLS]
        if odd:
            return (f"{where} holds {odd[0]!r}; AWS tags take letters, digits, spaces and {' '.join(TAG_SYMBOLS)} "
                    "only: replace it")
    return None


class Settings(_Strict):
    name: str
    account: str
    region: str
    availability_zone: str
    cluster_name: str
    network: NetworkSettings = NetworkSettings()
    head_node: HeadNodeSettings
    gpu_queue: GpuQueueSettings
    cpu_queue: CpuQueueSettings
    storage: StorageSettings
    models: list[ModelPlan] = Field(default_factory=list)
    plan: PlanSettings = PlanSettings()
    goodput: GoodputSettings = GoodputSettings()
    alerts: AlertsSettings = AlertsSettings()
    # DevSettings.Timeouts.ComputeNodeBootstrapTimeout. ParallelCluster's default holds what the compute
    # nodes' custom actions add at boot (python3.11 from dnf: about a minute). It is also Slurm's
    # ResumeTimeout, how long a node may take to come up before it counts as failed, so a larger
    # value only delays replacing a stuck node: keep the default unless boots are known to be slower.
    compute_bootstrap_timeout_s: int = PCLUSTER_BOOTSTRAP_TIMEOUT_S
    containers: bool = False  # Pyxis on, Enroot configured on every node: jobs run in an image (docs/containers.md)
    create_cluster: bool = False  # let `cdk deploy` create the cluster through ParallelCluster's custom resource
    tags: dict[str, str] = Field(default_factory=dict)

    @field_validator("account")
    @classmethod
    def _account(cls, value: str) -> str:
        if not re.fullmatch(r"\d{12}", value):
            raise ValueError(f"{value!r} is not an AWS account id; write the 12 digits in quotes, e.g. \"123456789012\"")
        return value

    @field_validator("compute_bootstrap_timeout_s")
    @classmethod
    def _compute_timeout(cls, value: int) -> int:
        return _bootstrap_timeout("compute_bootstrap_timeout_s", value)

    @field_validator("region")
    @classmethod
    def _region(cls, value: str) -> str:
        if not re.fullmatch(r"[a-z]{2}(-[a-z]+)+-\d", value):
            raise ValueError(f"{value!r} is not an AWS region name, e.g. ap-southeast-3")
        return value

    @field_validator("tags")
    @classmethod
    def _tags(cls, value: dict[str, str]) -> dict[str, str]:
        if len(value) > MAX_TAGS:
            raise ValueError(f"{len(value)} tags, but ParallelCluster takes at most {MAX_TAGS} (AWS allows 50 a "
                             "resource, and ParallelCluster adds its own); remove some")
        for key, text in value.items():
            problem = _tag_problem(key, text)
            if problem:
                raise ValueError(problem)
        return value

    @field_validator("cluster_name")
    @classmethod
    def _cluster_name(cls, value: str) -> str:
        # 40, not ParallelCluster's usual 60: with Slurm accounting (the database stack, always here) it
        # appends up to 24 characters to the name (pcluster/constants.py, PCLUSTER_NAME_MAX_LENGTH_SLURM_ACCOUNTING).
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9-]{0,39}", value):
            raise ValueError(f"{value!r} is not a valid ParallelCluster name with Slurm accounting: a letter, then "
                             "letters, digits and '-', at most 40 characters in all, e.g. llm-prod")
        return value

    @model_validator(mode="after")
    def _cross_checks(self, info: ValidationInfo) -> "Settings":
        if not (self.availability_zone.startswith(self.region) and len(self.availability_zone) == len(self.region) + 1):
            raise ValueError(
                f"availability_zone {self.availability_zone!r} is not in region {self.region!r}; "
                f"use the zone of the capacity reservation, e.g. {self.region}a"
            )
        region_zones = zones(self.region)  # none for a region without offerings data: check_offered says so below
        if region_zones and self.availability_zone not in region_zones:
            raise ValueError(
                f"availability_zone {self.availability_zone!r} is not a zone of {self.region} (its zones: "
                f"{', '.join(region_zones)}); use the zone of the capacity reservation (aws ec2 "
                "describe-capacity-reservations shows it as AvailabilityZone)"
            )
        held = max(self.gpu_queue.reserved_count, self.gpu_queue.min_count)
        if not self.models and held:
            raise ValueError(
                f"models: none listed, but gpu_queue holds {held} nodes (capacity_reservations or min_count) that "
                "would be paid for and sit idle; list the models that train on them (see models: in prod.yaml), "
                "or remove the reservations and set gpu_queue.min_count: 0"
            )
        names = [model.name for model in self.models]
        if len(set(names)) != len(names):
            raise ValueError(f"models: names must be unique, got {names}")
        by_uid: dict[int, str] = {}
        for name in names:
            other = by_uid.setdefault(model_uid(name), name)
            if other != name:
                raise ValueError(f"models: {other} and {name} would get the same user id {model_uid(name)} (derived "
                                 "from the name, so that every node makes the same users); rename one of them")
        by_dataset: dict[str, ModelPlan] = {}
        for model in self.models:  # one dataset, one tokenization: else one model's preprocess rewrites the other's
            first = by_dataset.setdefault(model.dataset, model)
            if (first.tokenizer, first.seq_len) != (model.tokenizer, model.seq_len):
                raise ValueError(
                    f"models: {first.name} and {model.name} share dataset {model.dataset} but tokenize it differently "
                    f"({first.tokenizer} at seq_len {first.seq_len}, {model.tokenizer} at {model.seq_len}): preprocessing "
                    "one would rewrite the shards the other trains on; give each its own dataset, or both the same "
                    "tokenizer and seq_len")
        offered = check_offered(self.region, {
            "head_node.instance_type": self.head_node.instance_type,
            "gpu_queue.instance_type": self.gpu_queue.instance_type,
            "cpu_queue.instance_type": self.cpu_queue.instance_type,
        })
        if offered:
            # One line per key; the region's offerings ship in cluster_config/instance_offerings.json.
            raise ValueError("\n  ".join(offered))
        if self.alerts.grafana and self.region not in GRAFANA_REGIONS:
            raise ValueError(
                f"alerts.grafana: Amazon Managed Grafana is not offered in {self.region} (it is in "
                f"{', '.join(sorted(GRAFANA_REGIONS))}); set it to false and use a Grafana of your own with SigV4 to "
                "the Prometheus workspace, or python -m training.status (docs/monitoring.md)")
        planned, spares = sum(model.nodes for model in self.models), self.gpu_queue.spare_nodes
        hot = sum(model.hot_spares for model in self.models)
        if planned + hot + spares > self.gpu_queue.max_count:
            kept = f" and gpu_queue.spare_nodes keeps {spares} out of every share" if spares else ""
            held = f" and {hot} hot spares (models' hot_spares)" if hot else ""
            fewer = (", lower spare_nodes" if spares else "") + (", lower some models' hot_spares" if hot else "")
            raise ValueError(
                f"models: the plan needs {planned} nodes{held}{kept} but gpu_queue.max_count is "
                f"{self.gpu_queue.max_count}; give fewer nodes to some models{fewer} or raise max_count"
            )
        if not self._holds_examples():
            self._check_dates_ahead((info.context or {}).get("now") or datetime.now(timezone.utc))
        start, end = self.goodput.training_start, self.gpu_queue.capacity_end
        if start is not None and end is not None and start >= end:
            raise ValueError(
                f"goodput.training_start {start.isoformat()} is not before {end.isoformat()}, when AWS begins "
                "terminating the Capacity Blocks' instances (30 minutes before the earliest "
                "gpu_queue.capacity_reservations end); fix the start or the blocks' end"
            )
        return self

    def _holds_examples(self) -> bool:
        """Whether the shipped example account or Capacity Blocks are still in (deploy-check refuses them)."""
        reservations = {r.id for r in self.gpu_queue.capacity_reservations}
        return is_example_account(self.account) or bool(reservations & EXAMPLE_RESERVATIONS)

    def _check_dates_ahead(self, now: datetime) -> None:
        # A date typed in the past (the wrong year) would pass every other check: the plan would count the
        # models' days from a start long gone and call every finish early.
        at = f"(it is now {now.isoformat(timespec='minutes')})"
        for index, block in enumerate(self.gpu_queue.capacity_reservations):
            if block.end is not None and block.end <= now:
                raise ValueError(
                    f"gpu_queue.capacity_reservations.{index}.end: {block.end.isoformat()} has passed {at}, and no node "
                    f"starts in an ended Capacity Block; set the end of {block.id} (aws ec2 describe-capacity-reservations "
                    f"--capacity-reservation-ids {block.id} shows it as EndDate), or, to destroy the environment after "
                    "the block, remove end"
                )
        start = self.goodput.training_start
        if start is not None and start <= now:
            raise ValueError(
                f"goodput.training_start: {start.isoformat()} has passed {at}, and the plan counts the models' days "
                "from it to check them against the Capacity Blocks' end; set when the models' jobs will start, or "
                "remove training_start once they have started"
            )


def available_environments(config_dir: Path = CONFIG_DIR) -> list[str]:
    return sorted(path.stem for path in config_dir.glob("*.yaml"))


def load_settings(env_name: str, config_dir: Path = CONFIG_DIR, now: Optional[datetime] = None) -> Settings:
    """Read ``<config_dir>/<env_name>.yaml`` into validated ``Settings`` or raise ``SettingsError``.

    ``now`` (with its zone; default: the current time) is what the Capacity Blocks' end and the training
    start must lie after."""
    path = config_dir / f"{env_name}.yaml"
    if not path.is_file():
        available = ", ".join(available_environments(config_dir)) or "none"
        raise SettingsError(
            f"no environment {env_name!r}: {path} does not exist. Available: {available}. "
            f"Add a file {config_dir.name}/{env_name}.yaml to create one (copy dev.yaml)."
        )
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise SettingsError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise SettingsError(f"{path}: expected a mapping of settings at the top level")
    if raw.get("name", env_name) != env_name:
        raise SettingsError(f"{path}: name: {raw['name']!r} differs from the file name; set name: {env_name}")
    try:
        return Settings.model_validate({**raw, "name": env_name}, context={"now": now})
    except ValidationError as exc:
        raise SettingsError(_describe(path, exc)) from None


def _describe(path: Path, exc: ValidationError) -> str:
    lines = [f"{path}: invalid settings"]
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "(top level)"
        if error["type"] == "extra_forbidden":
            allowed = ", ".join(_allowed_keys(error["loc"][:-1]))
            message = f"unknown key; remove it or fix the spelling (allowed here: {allowed})"
        elif error["type"] == "missing":
            message = "required; add it"
        else:
            message = error["msg"].removeprefix("Value error, ")
        # Cross-field checks name their keys themselves.
        lines.append(f"  {message}" if where == "(top level)" else f"  {where}: {message}")
    return "\n".join(lines)


def _allowed_keys(loc: tuple[Any, ...]) -> list[str]:
    """Field names of the model found by following ``loc`` from ``Settings``."""
    model: Any = Settings
    for part in loc:
        if isinstance(part, int):
            continue
        annotation = model.model_fields[part].annotation
        for candidate in (annotation, *getattr(annotation, "__args__", ())):
            if isinstance(candidate, type) and issubclass(candidate, BaseModel):
                model = candidate
                break
    return list(model.model_fields)


def _parse_cidr(value: str) -> ipaddress.IPv4Network:
    try:
        return ipaddress.IPv4Network(value)
    except ValueError:
        raise ValueError(f"{value!r} is not an IPv4 CIDR block, e.g. 10.0.0.0/16") from None
