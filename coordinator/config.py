"""Server configuration: Kafka-style dotted keys, validated by msgspec.

A TOML file may spell keys flat (``"group.connect.session.timeout.ms" = 10000``) or as
nested tables (``[group.connect]`` ...); both flatten to the dotted key. ``--set KEY=VALUE``
overrides the file. Unknown keys and out-of-bounds values stop start-up with a message that
names the key.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

MS_HOUR = 3_600_000
MAX_RECORD_STRING_BYTES = 32_767


class ConfigError(ValueError):
    """A configuration problem, with a message that names the offending key."""


class ServerConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Every server configuration key with its default; bounds live in the annotations."""

    session_timeout_ms: Annotated[int, Meta(ge=1_000, le=MS_HOUR)] = 10_000
    heartbeat_interval_ms: Annotated[int, Meta(ge=100, le=600_000)] = 3_000
    max_size: Annotated[int, Meta(ge=1, le=1_000_000)] = 10_000
    server_assignors: tuple[str, ...] = ("balanced", "round-robin")
    assignment_interval_ms: Annotated[int, Meta(ge=0, le=15_000)] = 1_000
    assignor_offload_enable: bool = True
    assignor_run_timeout_ms: Annotated[int, Meta(ge=100, le=MS_HOUR)] = 30_000
    background_threads: Annotated[int, Meta(ge=1, le=64)] = 2
    scheduled_rebalance_max_delay_ms: Annotated[int, Meta(ge=0, le=24 * MS_HOUR)] = 300_000
    max_frame_bytes: Annotated[int, Meta(ge=1_024, le=2**31 - 1)] = 8 * 1024 * 1024
    max_connections: Annotated[int, Meta(ge=1, le=1_000_000)] = 1_000
    connection_read_timeout_ms: Annotated[int, Meta(ge=100, le=MS_HOUR)] = 30_000
    connection_idle_timeout_ms: Annotated[int, Meta(ge=1_000, le=24 * MS_HOUR)] = 600_000
    admin_max_body_bytes: Annotated[int, Meta(ge=1_024, le=2**31 - 1)] = 1024 * 1024
    # The admin listener's own budget: well below a process's usual 1,024 descriptors, so
    # that slow or idle HTTP clients can never take those the Kafka listener needs.
    admin_max_connections: Annotated[int, Meta(ge=1, le=100_000)] = 64
    admin_read_timeout_ms: Annotated[int, Meta(ge=100, le=MS_HOUR)] = 10_000
    # Ids and names are stored in records as int16-length strings: 32,767 bytes at most.
    max_id_bytes: Annotated[int, Meta(ge=16, le=MAX_RECORD_STRING_BYTES)] = 255
    max_url_bytes: Annotated[int, Meta(ge=16, le=MAX_RECORD_STRING_BYTES)] = 2_048
    max_metadata_bytes: Annotated[int, Meta(ge=1_024, le=2**31 - 1)] = 256 * 1024
    max_owned_units: Annotated[int, Meta(ge=1, le=10_000_000)] = 10_000
    max_group_units: Annotated[int, Meta(ge=1, le=10_000_000)] = 100_000
    max_describe_groups: Annotated[int, Meta(ge=1, le=1_000_000)] = 1_000
    # The lists Kafka's own APIs may carry. Kafka has no such limits; what its clients
    # send is small (a worker lists 1-3 protocols, a consumer one per assignor; a leave
    # names one member, or an admin tool a whole group; a lookup names a few groups or
    # topics; there are 5 states and 3 group types to filter by), so these are generous,
    # and at them one request's work is a few milliseconds and its answer well under a
    # frame (ids being at most group.connect.max.id.bytes).
    max_join_protocols: Annotated[int, Meta(ge=1, le=100_000)] = 64
    max_leave_members: Annotated[int, Meta(ge=1, le=1_000_000)] = 1_000
    max_find_coordinator_keys: Annotated[int, Meta(ge=1, le=1_000_000)] = 1_000
    max_metadata_topics: Annotated[int, Meta(ge=1, le=1_000_000)] = 1_000
    max_list_filters: Annotated[int, Meta(ge=1, le=10_000)] = 16
    max_groups: Annotated[int, Meta(ge=1, le=10_000_000)] = 10_000
    # A group with no members and no connectors is deleted after this long (7 days, as
    # Kafka keeps a consumer group's offsets).
    empty_group_retention_ms: Annotated[int, Meta(ge=1_000, le=365 * 24 * MS_HOUR)] = (
        7 * 24 * MS_HOUR)
    shutdown_timeout_ms: Annotated[int, Meta(ge=0, le=600_000)] = 10_000
    log_segment_bytes: Annotated[int, Meta(ge=4_096, le=2**31 - 1)] = 64 * 1024 * 1024
    log_compaction_interval_ms: Annotated[int, Meta(ge=1_000, le=24 * MS_HOUR)] = 600_000
    log_tombstone_retention_ms: Annotated[int, Meta(ge=0, le=30 * 24 * MS_HOUR)] = 24 * MS_HOUR
    metrics_per_group_max: Annotated[int, Meta(ge=0, le=100_000)] = 100
    # Classic groups (Kafka's own keys and defaults).
    initial_rebalance_delay_ms: Annotated[int, Meta(ge=0, le=MS_HOUR)] = 3_000
    classic_min_session_timeout_ms: Annotated[int, Meta(ge=1, le=MS_HOUR)] = 6_000
    classic_max_session_timeout_ms: Annotated[int, Meta(ge=1, le=24 * MS_HOUR)] = 1_800_000
    classic_group_type: Literal["classic", "connect"] = "classic"
    # How long a bridged worker's SyncGroup waits for the assignment another worker is
    # computing (0: answered at once with what it may run now).
    classic_sync_wait_ms: Annotated[int, Meta(ge=0, le=MS_HOUR)] = 10_000
    # How long a bridged worker's JoinGroup in a pending round waits for the group's other
    # bridged workers to rejoin (a broker's join barrier; 0: answered at once).
    classic_join_wait_ms: Annotated[int, Meta(ge=0, le=MS_HOUR)] = 10_000
    # How many members only told MEMBER_ID_REQUIRED (not joined yet) all classic groups
    # hold together; each group's count against group.connect.max.size too.
    classic_max_pending_members: Annotated[int, Meta(ge=1, le=10_000_000)] = 1_000
    # Which live conversions between group types are allowed (Kafka's
    # group.consumer.migration.policy, for connect groups).
    connect_migration_policy: Literal["bidirectional", "upgrade", "downgrade", "disabled"] = (
        "bidirectional")
    # Proxy mode (coordinator/proxy): in front of a real Kafka cluster.
    proxy_upstream: tuple[str, ...] = ()
    proxy_groups: str | None = None
    proxy_advertised_host: str | None = None
    proxy_coordinator_node_id: Annotated[int, Meta(ge=0, le=2**31 - 1)] = 2_000_000_000
    proxy_upstream_connect_timeout_ms: Annotated[int, Meta(ge=100, le=600_000)] = 5_000

    def __post_init__(self) -> None:
        self._check_proxy()
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ConfigError(
                "group.connect.heartbeat.interval.ms must be below "
                f"group.connect.session.timeout.ms ({self.heartbeat_interval_ms} >= "
                f"{self.session_timeout_ms})"
            )
        if self.classic_min_session_timeout_ms > self.classic_max_session_timeout_ms:
            raise ConfigError(
                "group.min.session.timeout.ms must not exceed group.max.session.timeout.ms "
                f"({self.classic_min_session_timeout_ms} > {self.classic_max_session_timeout_ms})"
            )

    def _check_proxy(self) -> None:
        for address in self.proxy_upstream:
            host, sep, port = address.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
                raise ConfigError(f"proxy.upstream: expected HOST:PORT, got {address!r}")
        if self.proxy_upstream and not self.proxy_groups:
            raise ConfigError("proxy.groups (a regular expression of the group ids this "
                              "coordinator owns) is required with proxy.upstream")
        if self.proxy_groups is not None:
            try:
                re.compile(self.proxy_groups)
            except re.error as error:
                raise ConfigError(f"proxy.groups is not a regular expression: {error}") from None

    @property
    def proxy_mode(self) -> bool:
        return bool(self.proxy_upstream)


# Dotted key -> field name; the dotted names are the public ones (README, --set, TOML).
CONFIG_KEYS: dict[str, str] = {
    "group.connect.session.timeout.ms": "session_timeout_ms",
    "group.connect.heartbeat.interval.ms": "heartbeat_interval_ms",
    "group.connect.max.size": "max_size",
    "group.connect.server.assignors": "server_assignors",
    "group.connect.assignment.interval.ms": "assignment_interval_ms",
    "group.connect.assignor.offload.enable": "assignor_offload_enable",
    "group.connect.assignor.run.timeout.ms": "assignor_run_timeout_ms",
    "group.coordinator.background.threads": "background_threads",
    "scheduled.rebalance.max.delay.ms": "scheduled_rebalance_max_delay_ms",
    "server.max.frame.bytes": "max_frame_bytes",
    "server.max.connections": "max_connections",
    "server.connection.read.timeout.ms": "connection_read_timeout_ms",
    "server.connection.idle.timeout.ms": "connection_idle_timeout_ms",
    "server.admin.max.body.bytes": "admin_max_body_bytes",
    "server.admin.max.connections": "admin_max_connections",
    "server.admin.read.timeout.ms": "admin_read_timeout_ms",
    "group.connect.max.id.bytes": "max_id_bytes",
    "group.connect.max.url.bytes": "max_url_bytes",
    "group.connect.max.metadata.bytes": "max_metadata_bytes",
    "group.connect.max.owned.units": "max_owned_units",
    "group.connect.max.units": "max_group_units",
    "group.connect.max.describe.groups": "max_describe_groups",
    "group.connect.max.join.protocols": "max_join_protocols",
    "group.connect.max.leave.members": "max_leave_members",
    "group.connect.max.find.coordinator.keys": "max_find_coordinator_keys",
    "group.connect.max.metadata.topics": "max_metadata_topics",
    "group.connect.max.list.filters": "max_list_filters",
    "group.coordinator.max.groups": "max_groups",
    "group.connect.empty.group.retention.ms": "empty_group_retention_ms",
    "server.shutdown.timeout.ms": "shutdown_timeout_ms",
    "log.segment.bytes": "log_segment_bytes",
    "log.compaction.interval.ms": "log_compaction_interval_ms",
    "log.tombstone.retention.ms": "log_tombstone_retention_ms",
    "metrics.per_group.max": "metrics_per_group_max",
    "group.initial.rebalance.delay.ms": "initial_rebalance_delay_ms",
    "group.min.session.timeout.ms": "classic_min_session_timeout_ms",
    "group.max.session.timeout.ms": "classic_max_session_timeout_ms",
    "group.connect.classic.group.type": "classic_group_type",
    "group.connect.classic.sync.wait.ms": "classic_sync_wait_ms",
    "group.connect.classic.join.wait.ms": "classic_join_wait_ms",
    "group.connect.classic.max.pending.members": "classic_max_pending_members",
    "group.connect.migration.policy": "connect_migration_policy",
    "proxy.upstream": "proxy_upstream",
    "proxy.groups": "proxy_groups",
    "proxy.advertised.host": "proxy_advertised_host",
    "proxy.coordinator.node.id": "proxy_coordinator_node_id",
    "proxy.upstream.connect.timeout.ms": "proxy_upstream_connect_timeout_ms",
}
# Keys whose --set value is taken as written (a regular expression, a host name).
RAW_STRING_KEYS = frozenset({"proxy.groups", "proxy.advertised.host"})
FIELD_KEYS = {field: key for key, field in CONFIG_KEYS.items()}


def _flatten(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for name, value in table.items():
        key = f"{prefix}{name}"
        if isinstance(value, dict) and key not in CONFIG_KEYS:
            flat.update(_flatten(value, key + "."))
        else:
            flat[key] = value
    return flat


def unknown_key_message(kind: str, key: str, known: Iterable[str]) -> str:
    """`unknown KIND 'KEY'`, the closest known key when one is near (a typo), then them all."""
    import difflib

    names = sorted(known)
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.8)
    guess = f": did you mean {close[0]!r}?" if close else ""
    return f"unknown {kind} {key!r}{guess} (known: {', '.join(names)})"


def _parse_set(item: str) -> tuple[str, Any]:
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"--set expects KEY=VALUE, got {item!r}")
    if key not in CONFIG_KEYS:
        raise ConfigError(unknown_key_message("config key", key, CONFIG_KEYS))
    field = CONFIG_KEYS[key]
    if field in ("server_assignors", "proxy_upstream"):
        return key, [name.strip() for name in raw.split(",") if name.strip()]
    if key in RAW_STRING_KEYS:
        return key, raw
    # TOML scalar syntax gives ints, booleans and quoted strings their natural types.
    try:
        return key, tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return key, raw


def build_config(values: Mapping[str, Any]) -> ServerConfig:
    """Validate a flat mapping of dotted keys into a ServerConfig."""
    unknown = sorted(set(values) - set(CONFIG_KEYS))
    if unknown:
        raise ConfigError(unknown_key_message("config key", unknown[0], CONFIG_KEYS))
    fields = {CONFIG_KEYS[key]: value for key, value in values.items()}
    try:
        return msgspec.convert(fields, ServerConfig)
    except msgspec.ValidationError as error:
        message = str(error)
        # msgspec names the field as `$.field_name`; say the public dotted key instead.
        for field, key in FIELD_KEYS.items():
            message = message.replace(f"`$.{field}`", f"`{key}`")
        raise ConfigError(f"invalid configuration: {message}") from None


def load_config(path: Path | None, overrides: Iterable[str] = ()) -> ServerConfig:
    values: dict[str, Any] = {}
    if path is not None:
        try:
            values = _flatten(tomllib.loads(path.read_text()))
        except OSError as error:
            raise ConfigError(f"cannot read config file {path}: {error.strerror}") from None
        except tomllib.TOMLDecodeError as error:
            raise ConfigError(f"config file {path} is not valid TOML: {error}") from None
    for item in overrides:
        key, value = _parse_set(item)
        values[key] = value
    return build_config(values)


# Per-group overrides (admin `PUT /groups/{group}/config`). -1 / None mean "server default".
# The group's type is set through the same body; the coordinator reads that key itself.
GROUP_TYPE_KEY = "connect.classic.group.type"
GROUP_CONFIG_KEYS: dict[str, str] = {
    "connect.session.timeout.ms": "session_timeout_ms",
    "connect.heartbeat.interval.ms": "heartbeat_interval_ms",
    "connect.assignment.interval.ms": "assignment_interval_ms",
    "connect.assignor.offload.enable": "assignor_offload_enable",
    "scheduled.rebalance.max.delay.ms": "scheduled_rebalance_max_delay_ms",
}


class GroupConfig(msgspec.Struct, frozen=True, kw_only=True):
    session_timeout_ms: int = -1
    heartbeat_interval_ms: int = -1
    assignment_interval_ms: int = -1
    assignor_offload_enable: bool | None = None
    scheduled_rebalance_max_delay_ms: int = -1


_GROUP_BOUNDS: dict[str, tuple[int, int]] = {
    "session_timeout_ms": (1_000, MS_HOUR),
    "heartbeat_interval_ms": (100, 600_000),
    "assignment_interval_ms": (0, 15_000),
    "scheduled_rebalance_max_delay_ms": (0, 24 * MS_HOUR),
}


def parse_group_config(body: Mapping[str, Any], current: GroupConfig) -> GroupConfig:
    """Merge admin JSON into the current overrides; null or -1 resets a key to the default."""
    changes: dict[str, Any] = {}
    for key, value in body.items():
        if key not in GROUP_CONFIG_KEYS:
            raise ConfigError(unknown_key_message(
                "group config key", key, [*GROUP_CONFIG_KEYS, GROUP_TYPE_KEY]))
        field = GROUP_CONFIG_KEYS[key]
        if field == "assignor_offload_enable":
            if value is not None and not isinstance(value, bool):
                raise ConfigError(f"{key} must be true, false or null")
            changes[field] = value
            continue
        if value is None or value == -1:
            changes[field] = -1
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key} must be an integer, got {value!r}")
        low, high = _GROUP_BOUNDS[field]
        if not low <= value <= high:
            raise ConfigError(f"{key} must be between {low} and {high} (or -1), got {value}")
        changes[field] = value
    return msgspec.structs.replace(current, **changes)
