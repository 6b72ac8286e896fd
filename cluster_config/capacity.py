"""Day zero: find, buy and watch the Capacity Blocks the environment's settings describe.

    python -m cluster_config capacity --env prod --start-after 2027-01-04 --start-before 2027-01-11
        offerings that fit: gpu_queue.instance_type, one block per gpu_queue.capacity_reservations entry
        (its instance_count), plan.deadline_days long (--days), in the settings' region; per Availability
        Zone and start: each block's offering, the dates and the total upfront price, and the command to buy
    ... --buy cb-... cb-...
        prints what would be bought and the total, and buys nothing (exit 1)
    ... --buy cb-... cb-... --confirm-total-usd 930263.04 [--write]
        buys, when the total echoes the offerings' total to the cent: a block is paid up front and cannot
        be cancelled. Then the settings' edit (block ids, ends, availability_zone, goodput.training_start =
        the blocks' start + TRAINING_START_AFTER), printed, or made in cluster_config/<env>.yaml with --write
    python -m cluster_config capacity --env prod --status
        each block of the settings: state (payment-pending, scheduled, active, expired), zone, start, end

EC2's DescribeCapacityBlockOfferings, PurchaseCapacityBlock and DescribeCapacityReservations. Bad input:
``CapacityError`` naming the flag or field and the fix (exit 2).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal
from pathlib import Path

import boto3

from cluster_config.settings import CONFIG_DIR, EXAMPLE_RESERVATIONS, Settings

# From the blocks' start to the models' jobs (goodput.training_start): the GPU nodes boot and join (the
# head node and the CPU queue are up already), then the acceptance run's go or no-go (docs/deploy.md, Day zero).
TRAINING_START_AFTER = timedelta(hours=2)
PLATFORM = "Linux/UNIX"


class CapacityError(ValueError):
    """A flag or the settings cannot describe a purchase; the message names it and the fix."""


@dataclass(frozen=True)
class Offering:
    id: str
    zone: str
    count: int
    start: datetime
    end: datetime
    fee: Decimal

    @classmethod
    def of(cls, raw: dict) -> "Offering":
        return cls(raw["CapacityBlockOfferingId"], raw["AvailabilityZone"], raw["InstanceCount"],
                   raw["StartDate"].astimezone(timezone.utc), raw["EndDate"].astimezone(timezone.utc),
                   Decimal(raw["UpfrontFee"]))


def _client(settings: Settings, endpoint_url: str | None):
    return boto3.session.Session(region_name=settings.region).client("ec2", endpoint_url=endpoint_url)


def _day(flag: str, text: str) -> datetime:
    try:
        return datetime.combine(date.fromisoformat(text), time(0), tzinfo=timezone.utc)
    except ValueError:
        raise CapacityError(f"{flag} {text} is not a date; write it as YYYY-MM-DD (UTC), e.g. 2027-01-04") from None


def block_counts(settings: Settings) -> list[int]:
    """One Capacity Block per gpu_queue.capacity_reservations entry, of its instance_count."""
    where = f"cluster_config/{settings.name}.yaml gpu_queue.capacity_reservations"
    reservations = settings.gpu_queue.capacity_reservations
    if not reservations or any(r.kind != "capacity_block" for r in reservations):
        raise CapacityError(f"{where}: lists no Capacity Block (kind: capacity_block); list one entry per block you "
                            "want, e.g. {id: cr-0123456789abcdef0, instance_count: 40, kind: capacity_block}")
    return [r.instance_count for r in reservations]


def find(settings: Settings, start_after: str, start_before: str, days: int | None = None,
         endpoint_url: str | None = None, now: datetime | None = None) -> dict[tuple[str, datetime], list[Offering]]:
    """(zone, start) -> one offering per block of the settings, for the starts where every block is offered."""
    earliest, latest = _day("--start-after", start_after), _day("--start-before", start_before)
    now = now or datetime.now(timezone.utc)
    if earliest < now.replace(hour=0, minute=0, second=0, microsecond=0):
        raise CapacityError(f"--start-after {start_after} has passed (it is now {now:%Y-%m-%d}); give a future date")
    if latest <= earliest:
        raise CapacityError(f"--start-before {start_before} is not after --start-after {start_after}; widen the window")
    days = days or int(settings.plan.deadline_days)
    if days < 1 or (days > 14 and days % 7) or days > 182:
        raise CapacityError(f"--days {days}: a Capacity Block lasts 1-14 days, then 7-day steps up to 182; pick one")
    ec2 = _client(settings, endpoint_url)
    by_count: dict[int, list[Offering]] = {}
    for count in sorted(set(block_counts(settings))):
        raw = ec2.describe_capacity_block_offerings(
            InstanceType=settings.gpu_queue.instance_type, InstanceCount=count, CapacityDurationHours=days * 24,
            StartDateRange=earliest, EndDateRange=latest + timedelta(days=days))["CapacityBlockOfferings"]
        by_count[count] = [Offering.of(o) for o in raw if o["StartDate"].astimezone(timezone.utc) < latest]
    found: dict[tuple[str, datetime], list[Offering]] = {}
    for offering in by_count[block_counts(settings)[0]]:
        key = (offering.zone, offering.start)
        picks = [next((o for o in by_count[c] if (o.zone, o.start) == key), None) for c in block_counts(settings)]
        if all(picks):
            found[key] = picks
    return found


def format_offerings(settings: Settings, found: dict, start_after: str, start_before: str, days: int | None) -> str:
    counts = block_counts(settings)
    head = (f"Capacity Blocks for {settings.name}: {len(counts)} x ({' + '.join(map(str, counts))}) "
            f"{settings.gpu_queue.instance_type} in {settings.region}, {days or int(settings.plan.deadline_days)} days, "
            f"starting {start_after} to {start_before}")
    if not found:
        return head + ("\n  none offered: widen the window (--start-before), try fewer days (--days), or ask your "
                       "AWS account team")
    lines = [head, "  zone             start (UTC)        end (UTC)          upfront USD  offerings (one per block)"]
    for (zone, start), picks in sorted(found.items(), key=lambda item: (item[0][1], item[0][0])):
        total = sum(o.fee for o in picks)
        lines.append(f"  {zone:16} {start:%Y-%m-%d %H:%M}   {picks[0].end:%Y-%m-%d %H:%M}   {total:>12,.2f}  "
                     f"{' '.join(o.id for o in picks)}")
    lines.append(f"To buy one line: python -m cluster_config capacity --env {settings.name} --start-after {start_after} "
                 f"--start-before {start_before} --buy <its offerings>  (prints the total to confirm; buys nothing)")
    if settings.availability_zone not in {zone for zone, _ in found}:
        lines.append(f"note: none in availability_zone {settings.availability_zone}; buying elsewhere moves the cluster's "
                     "subnets to the blocks' zone (the edit sets availability_zone), before the first deploy")
    return "\n".join(lines)


def chosen(found: dict, offering_ids: list[str], settings: Settings) -> list[Offering]:
    """The offerings of one (zone, start) that ``--buy`` names, one per block of the settings, in order."""
    counts = block_counts(settings)
    if len(offering_ids) != len(counts):
        raise CapacityError(f"--buy names {len(offering_ids)} offering(s), but gpu_queue.capacity_reservations lists "
                            f"{len(counts)} block(s); give one offering per block, as the listing's line shows")
    for picks in found.values():
        if [o.id for o in picks] == offering_ids:
            return picks
    raise CapacityError(f"--buy {' '.join(offering_ids)}: not one line of the offerings in this window (an offering "
                        "changes as others buy); list them again and copy one line's offerings")


def total_usd(offerings: list[Offering]) -> Decimal:
    return sum((o.fee for o in offerings), Decimal(0))


def purchase(settings: Settings, offerings: list[Offering], confirm_total_usd: str | None,
             endpoint_url: str | None = None) -> list[dict]:
    """Buy the blocks, only when ``confirm_total_usd`` equals their total to the cent; the new reservations."""
    total = total_usd(offerings)
    if confirm_total_usd is None:
        raise CapacityError(f"not bought: {len(offerings)} Capacity Block(s) for USD {total:,.2f} in all, paid up front "
                            f"and not cancellable; to buy, add --confirm-total-usd {total:.2f}")
    try:
        confirmed = Decimal(confirm_total_usd.replace(",", ""))
    except ArithmeticError:
        raise CapacityError(f"--confirm-total-usd {confirm_total_usd!r} is not an amount; write it as {total:.2f}") from None
    if confirmed.quantize(Decimal("0.01")) != total.quantize(Decimal("0.01")):
        raise CapacityError(f"not bought: --confirm-total-usd {confirm_total_usd} is not the total, USD {total:.2f} "
                            "(paid up front, not cancellable); check the offerings and confirm that amount")
    ec2 = _client(settings, endpoint_url)
    bought = []
    for offering in offerings:  # one at a time: a refusal midway leaves the ones before it bought, and says so
        try:
            bought.append(ec2.purchase_capacity_block(CapacityBlockOfferingId=offering.id,
                                                      InstancePlatform=PLATFORM)["CapacityReservation"])
        except Exception as exc:
            done = ", ".join(r["CapacityReservationId"] for r in bought) or "none"
            raise CapacityError(f"buying {offering.id} failed ({exc}); bought before it: {done}. Put those in the "
                                "settings (their edit: --status after adding them) and list offerings again") from None
    return bought


def settings_edit(settings: Settings, reservations: list[dict]) -> dict[str, str]:
    """The settings' new values, by dotted key: the blocks' ids and ends, their zone, the training start."""
    zones = {r["AvailabilityZone"] for r in reservations}
    if len(zones) != 1:
        raise CapacityError(f"the blocks are in {', '.join(sorted(zones))}: a cluster's GPU queue and its subnet are in "
                            "one Availability Zone; buy blocks of one zone")
    start = max(r["StartDate"] for r in reservations).astimezone(timezone.utc)
    edit = {"availability_zone": zones.pop(),
            "goodput.training_start": _iso(start + TRAINING_START_AFTER)}
    for index, reservation in enumerate(reservations):
        edit[f"gpu_queue.capacity_reservations.{index}"] = (
            f"{{id: {reservation['CapacityReservationId']}, instance_count: {reservation['TotalInstanceCount']}, "
            f"kind: capacity_block, end: {_iso(reservation['EndDate'])}}}")
    return edit


def _iso(when: datetime) -> str:
    return when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def write_edit(settings: Settings, edit: dict[str, str], config_dir: Path = CONFIG_DIR) -> Path:
    """Make ``edit`` in ``<config_dir>/<env>.yaml`` line by line, keeping its comments."""
    path = config_dir / f"{settings.name}.yaml"
    lines = path.read_text().splitlines(keepends=True)
    entry = re.compile(r"^(\s*- )\{id: cr-[0-9a-f]{17}[^}]*\}")
    entries = [i for i, line in enumerate(lines) if entry.match(line)]
    blocks = sorted(k for k in edit if k.startswith("gpu_queue.capacity_reservations."))
    if len(entries) != len(blocks):
        raise CapacityError(f"{path}: found {len(entries)} one-line capacity_reservations entries for {len(blocks)} "
                            "block(s); make the edit printed without --write by hand")
    for index, key in zip(entries, blocks):
        lines[index] = entry.sub(lambda m: m.group(1) + edit[key], lines[index])
    for key, pattern in (("availability_zone", r"^(availability_zone:\s*)\S+"),
                         ("goodput.training_start", r"^(\s+training_start:\s*)\S+")):
        hits = [i for i, line in enumerate(lines) if re.match(pattern, line)]
        if len(hits) != 1:
            raise CapacityError(f"{path}: no single {key}: line; make the edit printed without --write by hand")
        lines[hits[0]] = re.sub(pattern, lambda m: m.group(1) + edit[key], lines[hits[0]])
    path.write_text("".join(lines))
    return path


def format_edit(settings: Settings, edit: dict[str, str]) -> str:
    lines = [f"The edit of cluster_config/{settings.name}.yaml (--write makes it):"]
    lines += [f"  {key}: {value}" for key, value in edit.items()]
    return "\n".join(lines)


def status(settings: Settings, endpoint_url: str | None = None) -> list[dict]:
    ids = [r.id for r in settings.gpu_queue.capacity_reservations]
    if not ids:
        raise CapacityError(f"cluster_config/{settings.name}.yaml gpu_queue.capacity_reservations: none listed; buy "
                            "blocks first (capacity --start-after ... --start-before ...)")
    if examples := [i for i in ids if i in EXAMPLE_RESERVATIONS]:
        raise CapacityError(f"cluster_config/{settings.name}.yaml gpu_queue.capacity_reservations: {', '.join(examples)} "
                            "are the shipped examples; buy your blocks first (capacity --start-after ... --start-before "
                            "... --buy ...) and write their ids (--write)")
    return _client(settings, endpoint_url).describe_capacity_reservations(CapacityReservationIds=ids)["CapacityReservations"]


def format_status(reservations: list[dict]) -> str:
    lines = ["  block                 state       zone             instances  start (UTC)        end (UTC)"]
    for r in reservations:
        lines.append(f"  {r['CapacityReservationId']:21} {r['State']:11} {r['AvailabilityZone']:16} "
                     f"{r['TotalInstanceCount']:>9}  {r['StartDate'].astimezone(timezone.utc):%Y-%m-%d %H:%M}   "
                     f"{r['EndDate'].astimezone(timezone.utc):%Y-%m-%d %H:%M}")
    return "\n".join(lines)
