"""Cellfleet clients: `Client` (blocking) and `AsyncClient` (asyncio).

Both sign every request by the rule in ``proto/cellfleet/v1/envelope.proto``
(Ed25519 over the call's domain tag followed by the exact body bytes), send
it over mutual TLS, retry what is safe to retry and route each Cell's
requests to the node that owns it. Their semantics are those of the Rust
crate ``cellfleet-client``:

* A command is retried with the *same* signed envelope (the same command
  id), so the Cell's ledger answers a second delivery with the stored
  outcome: never a second execution. When the retry budget runs out while an
  attempt may have applied, the command is resolved; if even that cannot
  prove its fate, :class:`UnknownOutcome` is raised (retry it later with the
  same id, or resolve it).
* Each answer names the owner's endpoint; the next request for that Cell
  goes straight there (a bounded cache), falling back to the configured
  nodes when it fails.

Python's gRPC does not say whether a failed call was ever sent, so before
sending on a channel not known to be connected, the client waits (at most
``CONNECT_TIMEOUT_S``) for the channel to become ready: a channel that never
does raises :class:`Unreachable` (never sent, safe to retry), and once every
configured node was unreachable since a node last answered, the call ends
instead of spending its whole budget, as in the Rust crate. Any other
failure without a Cellfleet error detail counts as "may have been
delivered" (a command is then settled by resolve, never reported as not
applied).

One difference from the Rust crate: Python's gRPC checks the node's
certificate against the cluster CA only, not that it is a node's
certificate (the Rust crate checks its role), and a refused certificate
looks like an unreachable node.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import time
import tomllib
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Optional

import grpc
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import load_pem_private_key

from cellfleet.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    client_pb2,
    client_pb2_grpc,
    envelope_pb2,
    errors_pb2,
)

COMMAND_TAG = b"cellfleet.v1.command\x00"
QUERY_TAG = b"cellfleet.v1.query\x00"
RESOLVE_TAG = b"cellfleet.v1.resolve\x00"
ADMIN_TAG = b"cellfleet.v1.admin\x00"
ERROR_DETAIL_METADATA = "cellfleet-error-bin"
ERROR_DETAIL_BYTES_MAX = 16 * 1024
DEFAULT_CONFIG_PATH = ".cellfleet-dev/client.toml"
OWNER_CACHE_DEFAULT = 10_000
CONNECT_TIMEOUT_S = 2.0
DRAIN_TIMEOUT_S = 120.0


def now_ms() -> int:
    """Now in Unix milliseconds (the envelopes' clock)."""
    return time.time_ns() // 1_000_000


# ---------------------------------------------------------------- errors


class CellfleetError(Exception):
    """Every failure of a call. Act on the attributes, never on the text."""

    retry_safe = False
    maybe_applied = False
    retry_after_ms = 0
    name = "ERROR"


class Refused(CellfleetError):
    """A node refused the request with a Cellfleet error code (errors.proto)."""

    def __init__(self, code: int, grpc_code: grpc.StatusCode, message: str,
                 retry_safe: bool, retry_after_ms: int, owner_endpoint: str):
        self.code = code
        self.name = errors_pb2.ErrorCode.Name(code).removeprefix("ERROR_CODE_") \
            if code in errors_pb2.ErrorCode.values() else "UNSPECIFIED"
        self.grpc_code = grpc_code
        self.message = message
        self.retry_safe = retry_safe
        self.retry_after_ms = retry_after_ms
        self.owner_endpoint = owner_endpoint
        self.maybe_applied = code in (errors_pb2.ERROR_CODE_UNKNOWN_OUTCOME,
                                      errors_pb2.ERROR_CODE_INTERNAL)
        super().__init__(f"{self.name} ({grpc_code.name}): {message}")


class TransportError(CellfleetError):
    """No Cellfleet answer (connection, TLS, deadline). It may have been
    delivered; a command that failed only this way is settled by resolve."""

    name = "TRANSPORT"

    def __init__(self, grpc_code: grpc.StatusCode, message: str):
        self.grpc_code = grpc_code
        self.message = message
        self.retry_safe = grpc_code != grpc.StatusCode.NOT_FOUND
        self.maybe_applied = grpc_code != grpc.StatusCode.NOT_FOUND
        if grpc_code == grpc.StatusCode.NOT_FOUND:
            self.name = "NOT_FOUND"
        super().__init__(f"{self.name} ({grpc_code.name}): {message}")


class Unreachable(TransportError):
    """No connection to the node could be made (nothing listens there, or
    the TLS handshake failed): the request was never sent, so nothing was
    applied and a retry is safe."""

    def __init__(self, endpoint: str, timeout_s: float):
        self.endpoint = endpoint
        super().__init__(grpc.StatusCode.UNAVAILABLE,
                         f"no connection to {endpoint} within {timeout_s:.1f} s; is the "
                         f"node running, and is {endpoint} its client listener?")
        self.name = "UNREACHABLE"
        self.retry_safe = True
        self.maybe_applied = False
        self.args = (f"UNREACHABLE: {self.message}",)


class UnknownOutcome(CellfleetError):
    """A command may or may not have applied and its fate was not proven
    within the retry budget. It never applies twice: retry it with the same
    ``command_id`` or resolve it with ``expires_at_ms`` later."""

    name = "UNKNOWN_OUTCOME"
    retry_safe = True
    maybe_applied = True

    def __init__(self, command_id: bytes, expires_at_ms: int, attempts: int,
                 resolved: Optional[int], last: CellfleetError):
        self.command_id = command_id
        self.expires_at_ms = expires_at_ms
        self.attempts = attempts
        self.resolved = resolved
        self.last = last
        super().__init__(
            f"the outcome of command {command_id.hex()} is unknown after {attempts} "
            f"attempt(s) (last: {last}); retry with the same id or resolve it with "
            f"its expiry {expires_at_ms}")


class ConfigError(CellfleetError):
    """The client config, a certificate or a key could not be loaded."""

    name = "CONFIG"


def error_from_rpc(error: grpc.RpcError) -> CellfleetError:
    """The typed error of a failed call (its Cellfleet detail, if any)."""
    detail = None
    for key, value in (error.trailing_metadata() or ()):
        if key == ERROR_DETAIL_METADATA and isinstance(value, bytes) \
                and len(value) <= ERROR_DETAIL_BYTES_MAX:
            parsed = errors_pb2.ErrorDetail()
            try:
                parsed.ParseFromString(value)
                detail = parsed
            except Exception:  # an undecodable detail is no detail
                detail = None
    if detail is not None:
        return Refused(detail.code, error.code(), error.details() or "",
                       detail.retry_safe, detail.retry_after_ms,
                       detail.owner_hint.endpoint if detail.HasField("owner_hint") else "")
    return TransportError(error.code(), error.details() or "")


# ---------------------------------------------------------------- retry rule


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """Bounds on one call's retries (the Rust crate's defaults)."""

    attempts: int = 32
    budget_s: float = 30.0
    backoff_min_s: float = 0.025
    backoff_max_s: float = 1.0
    attempt_timeout_s: float = 10.0

    def backoff(self, attempt: int) -> float:
        return min(self.backoff_min_s * (2 ** min(max(attempt - 1, 0), 20)), self.backoff_max_s)


RETRY, RESOLVE, FAIL = "retry", "resolve", "fail"


def after_failure(policy: RetryPolicy, attempt: int, elapsed_s: float, in_doubt: bool,
                  error: CellfleetError, command: bool) -> tuple[str, float]:
    """The retry rule (pure): ("retry", pause), ("resolve", 0) or ("fail", 0).
    A command that may have applied is never "fail"."""
    if error.retry_safe:
        after = max(policy.backoff(attempt), error.retry_after_ms / 1000)
        if attempt < policy.attempts and elapsed_s + after < policy.budget_s:
            return RETRY, after
    if command and (in_doubt or error.maybe_applied):
        return RESOLVE, 0.0
    return FAIL, 0.0


# ---------------------------------------------------------------- values


@dataclasses.dataclass
class Receipt:
    """Proof of a committed command; a read-your-writes fence for queries."""

    cell_id: str
    epoch: int
    txid: int

    def to_proto(self) -> envelope_pb2.Receipt:
        return envelope_pb2.Receipt(cell_id=self.cell_id, epoch=self.epoch, txid=self.txid)


def _receipt(message, field="receipt") -> Optional[Receipt]:
    if not message.HasField(field):
        return None
    r = getattr(message, field)
    return Receipt(r.cell_id, r.epoch, r.txid)


@dataclasses.dataclass
class Executed:
    """A command's definite outcome: ``applied`` with ``result``, or a
    ``rejection`` (code name, message) the Cell stored."""

    command_id: bytes
    expires_at_ms: int
    applied: bool
    result: Any
    rejection: Optional[tuple[str, str]]
    receipt: Optional[Receipt]
    duplicate: bool
    served_by: str
    attempts: int


@dataclasses.dataclass
class Queried:
    """A query's result, the state it read and the node that served it."""

    value: Any
    receipt: Optional[Receipt]
    served_by: str


@dataclasses.dataclass
class Resolved:
    """What became of a command id: ``state`` is COMMITTED, ABSENT, UNKNOWN,
    EXPIRED or NEEDS_EXPIRY (client.proto)."""

    command_id: bytes
    state: str
    applied: Optional[bool]
    result: Any
    rejection: Optional[tuple[str, str]]
    receipt: Optional[Receipt]
    served_by: str


def _json(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return data.decode("utf-8", "replace")


def _rejection(r) -> tuple[str, str]:
    return client_pb2.RejectCode.Name(r.code).removeprefix("REJECT_CODE_"), r.message


def _args(args: Optional[dict]) -> bytes:
    if args is None:
        return b"{}"
    if not isinstance(args, dict):
        raise ConfigError(f"arguments must be a JSON object (a dict), not {args!r}")
    return json.dumps(args).encode()


def _host_port(endpoint: str) -> str:
    rest = endpoint.split("://", 1)[1] if "://" in endpoint else endpoint
    for stop in "/?":
        rest = rest.split(stop, 1)[0]
    return rest


# ---------------------------------------------------------------- config


@dataclasses.dataclass
class Config:
    """The client config file that ``cellfleet dev`` writes (client.toml)."""

    endpoints: list[str]
    ca: Path
    cert: Path
    key: Path
    signing_key: Path
    key_id: str
    window_ms: int = 60_000

    @staticmethod
    def path(explicit: Optional[str] = None) -> Path:
        """``explicit``, else ``$CELLFLEET_CONFIG``, else .cellfleet-dev/client.toml."""
        return Path(explicit or os.environ.get("CELLFLEET_CONFIG") or DEFAULT_CONFIG_PATH)

    @staticmethod
    def read(path) -> "Config":
        """Reads a config; relative paths are relative to its directory."""
        path = Path(path)
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise ConfigError(f"cannot read the client config {path}: {e}; start a local "
                              "cluster with `cellfleet dev`, or set CELLFLEET_CONFIG") from e
        known = {f.name for f in dataclasses.fields(Config)}
        unknown = set(data) - known
        if unknown:
            raise ConfigError(f"{path}: unknown settings {sorted(unknown)}")
        try:
            config = Config(**data)
        except TypeError as e:
            raise ConfigError(f"{path}: {e}") from e
        base = path.parent
        for name in ("ca", "cert", "key", "signing_key"):
            value = Path(getattr(config, name))
            setattr(config, name, value if value.is_absolute() else base / value)
        if not config.endpoints:
            raise ConfigError(f"{path}: endpoints is empty; list the nodes' client addresses")
        return config


# ---------------------------------------------------------------- shared core


class _Core:
    """What both clients share: the signer, the envelopes, the owner cache."""

    def __init__(self, config: Config, policy: Optional[RetryPolicy], owner_routing: bool,
                 owner_cache_size: int):
        try:
            key = load_pem_private_key(Path(config.signing_key).read_bytes(), password=None)
            self.ca = Path(config.ca).read_bytes()
            self.cert = Path(config.cert).read_bytes()
            self.tls_key = Path(config.key).read_bytes()
        except (OSError, ValueError) as e:
            raise ConfigError(f"client certificate or signing key: {e}") from e
        if not isinstance(key, Ed25519PrivateKey):
            raise ConfigError(f"{config.signing_key}: not an Ed25519 private key")
        self.key = key
        self.key_id = config.key_id
        self.window_ms = config.window_ms
        self.endpoints = [_host_port(e) for e in config.endpoints]
        self.policy = policy or RetryPolicy()
        self.owner_routing = owner_routing
        self.owners: OrderedDict[tuple[str, bytes], str] = OrderedDict()
        self.owners_max = max(owner_cache_size, 1)
        self.cursor = 0
        # Endpoints whose channel answered the last call (no readiness wait).
        self.connected: set[str] = set()

    def credentials(self):
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=self.tls_key, certificate_chain=self.cert)

    def seal(self, tag: bytes, body) -> envelope_pb2.SignedEnvelope:
        data = body.SerializeToString()
        return envelope_pb2.SignedEnvelope(
            body=data, signature=self.key.sign(tag + data), key_id=self.key_id)

    def window(self) -> tuple[int, int]:
        now = now_ms()
        return now, now + self.window_ms

    def command_request(self, kind, key, name, args, command_id, issued, expires):
        body = envelope_pb2.CommandBody(
            kind=kind, key=key, command=name, args_json=_args(args),
            command_id=command_id, issued_at_ms=issued, expires_at_ms=expires)
        return client_pb2.ExecuteRequest(envelope=self.seal(COMMAND_TAG, body))

    def query_request(self, kind, key, name, args, after: Optional[Receipt]):
        issued, expires = self.window()
        body = envelope_pb2.QueryBody(
            kind=kind, key=key, query=name, args_json=_args(args),
            request_id=os.urandom(16), issued_at_ms=issued, expires_at_ms=expires)
        if after is not None:
            body.min_receipt.CopyFrom(after.to_proto())
        return client_pb2.QueryRequest(envelope=self.seal(QUERY_TAG, body))

    def resolve_request(self, kind, key, command_id, command_expires_at_ms):
        issued, expires = self.window()
        body = envelope_pb2.ResolveBody(
            kind=kind, key=key, command_id=command_id, issued_at_ms=issued,
            expires_at_ms=expires, command_expires_at_ms=command_expires_at_ms)
        return client_pb2.ResolveRequest(envelope=self.seal(RESOLVE_TAG, body))

    @staticmethod
    def cells_request(owner_node_id: str, limit: int, page_token: str):
        return admin_pb2.ListCellsRequest(
            owner_node_id=owner_node_id, limit=limit, page_token=page_token)

    @staticmethod
    def describe_request(kind: str, key: bytes):
        return admin_pb2.DescribeCellRequest(address=admin_pb2.CellAddress(kind=kind, key=key))

    def drain_request(self, node_id: str, leases) -> tuple[str, Any]:
        """The node's own endpoint (from its lease) and the signed request."""
        endpoint = next((lease.endpoint for lease in leases if lease.node_id == node_id), None)
        if endpoint is None:
            raise ConfigError(f"no node {node_id!r} in the leases; `cellfleet leases` lists them")
        issued, expires = self.window()
        body = envelope_pb2.AdminBody(operation="drain", node_id=node_id,
                                   issued_at_ms=issued, expires_at_ms=expires)
        return _host_port(endpoint), admin_pb2.DrainRequest(envelope=self.seal(ADMIN_TAG, body))

    def start(self) -> int:
        self.cursor += 1
        return self.cursor - 1

    def target(self, cell, hint: Optional[str], start: int, attempt: int) -> str:
        if hint:
            return hint
        if attempt == 1 and self.owner_routing and cell in self.owners:
            self.owners.move_to_end(cell)
            return self.owners[cell]
        return self.endpoints[(start + attempt - 1) % len(self.endpoints)]

    def learn(self, cell, endpoint: str):
        if self.owner_routing and endpoint:
            self.owners[cell] = _host_port(endpoint)
            self.owners.move_to_end(cell)
            while len(self.owners) > self.owners_max:
                self.owners.popitem(last=False)

    def after_failure(self, cell, target: str, error: CellfleetError) -> Optional[str]:
        if self.owners.get(cell) == target:
            del self.owners[cell]
        hint = getattr(error, "owner_endpoint", "")
        return _host_port(hint) if hint else None

    def step(self, attempt: int, started: float, in_doubt: bool, error: CellfleetError,
             command: bool, unreachable: set) -> tuple[str, float]:
        """The retry rule, plus: once every configured node was unreachable
        since a node last answered (``unreachable``: the endpoints found so),
        retrying is pointless. Counting attempts instead would give up while
        a node still answers: with two of three nodes dead, an owner hint
        naming a dead node and the round robin land on dead nodes three
        times in a row while the third is live."""
        if self.endpoints and all(e in unreachable for e in self.endpoints):
            return (RESOLVE if command and in_doubt else FAIL), 0.0
        return after_failure(self.policy, attempt, time.monotonic() - started,
                             in_doubt, error, command)

    def attempt_timeout(self, started: float, until_ms: Optional[int] = None) -> float:
        left = self.policy.budget_s - (time.monotonic() - started)
        timeout = min(self.policy.attempt_timeout_s, max(left, 0.1))
        if until_ms is not None:
            timeout = min(timeout, max((until_ms - now_ms()) / 1000, 0.1))
        return timeout

    @staticmethod
    def executed(response, command_id, expires, attempts) -> Executed:
        which = response.WhichOneof("outcome")
        if which is None:
            raise ConfigError("the node answered a command without an outcome")
        return Executed(
            command_id=command_id, expires_at_ms=expires, applied=which == "result_json",
            result=_json(response.result_json) if which == "result_json" else None,
            rejection=_rejection(response.rejected) if which == "rejected" else None,
            receipt=_receipt(response), duplicate=response.duplicate,
            served_by=response.served_by, attempts=attempts)

    @staticmethod
    def settled(resolved: Optional[Resolved], command_id, expires, doubt) -> Executed:
        """A command in doubt after its resolve: its stored outcome, or
        :class:`UnknownOutcome` raised."""
        if resolved is not None and resolved.state == "COMMITTED" and resolved.applied is not None:
            return Executed(command_id, expires, resolved.applied, resolved.result,
                            resolved.rejection, resolved.receipt, True, resolved.served_by,
                            doubt.attempts)
        state = client_pb2.CommandState.Value("COMMAND_STATE_" + resolved.state) \
            if resolved is not None else None
        raise UnknownOutcome(command_id, expires, doubt.attempts, state, doubt.error)

    @staticmethod
    def resolved(response, command_id) -> Resolved:
        which = response.WhichOneof("outcome")
        return Resolved(
            command_id=command_id,
            state=client_pb2.CommandState.Name(response.state).removeprefix("COMMAND_STATE_"),
            applied=None if which is None else which == "result_json",
            result=_json(response.result_json) if which == "result_json" else None,
            rejection=_rejection(response.rejected) if which == "rejected" else None,
            receipt=_receipt(response), served_by=response.served_by)


def _key(key) -> bytes:
    return key.encode() if isinstance(key, str) else bytes(key)


# ---------------------------------------------------------------- blocking


class Client:
    """A blocking Cellfleet client (one gRPC channel per node, pooled).

    >>> client = Client.from_config(".cellfleet-dev/client.toml")   # doctest: +SKIP
    >>> put = client.execute("kv", "user-1", "put", {"key": "name", "value": "Ada"})  # doctest: +SKIP
    >>> client.query("kv", "user-1", "get", {"key": "name"}, after=put.receipt).value  # doctest: +SKIP
    """

    def __init__(self, config: Config, policy: Optional[RetryPolicy] = None,
                 owner_routing: bool = True, owner_cache_size: int = OWNER_CACHE_DEFAULT):
        self._core = _Core(config, policy, owner_routing, owner_cache_size)
        self._channels: dict[str, grpc.Channel] = {}

    @classmethod
    def from_config(cls, path=None, **options) -> "Client":
        """A client from a client.toml (default: $CELLFLEET_CONFIG, else
        .cellfleet-dev/client.toml)."""
        return cls(Config.read(Config.path(path)), **options)

    def close(self):
        """Closes every channel."""
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def cached_owner(self, kind: str, key) -> Optional[str]:
        """The endpoint the Cell's next request goes to, if learnt."""
        return self._core.owners.get((kind, _key(key)))

    def _channel(self, endpoint: str) -> grpc.Channel:
        channel = self._channels.get(endpoint)
        if channel is None:
            channel = grpc.secure_channel(endpoint, self._core.credentials())
            self._channels[endpoint] = channel
        return channel

    def _connect(self, endpoint: str, timeout: float):
        """Waits until the channel to ``endpoint`` is ready, unless its last
        call went through; :class:`Unreachable` if it does not get there."""
        if endpoint in self._core.connected:
            return
        wait = min(timeout, CONNECT_TIMEOUT_S)
        try:
            grpc.channel_ready_future(self._channel(endpoint)).result(timeout=wait)
        except grpc.FutureTimeoutError:
            raise Unreachable(endpoint, wait) from None

    def _call(self, cell, command: bool, send: Callable[[str, float], Any],
              until_ms: Optional[int] = None):
        core = self._core
        started, start, hint, in_doubt, attempt = time.monotonic(), core.start(), None, False, 0
        found_unreachable = set()
        while True:
            attempt += 1
            target = core.target(cell, hint, start, attempt)
            timeout = core.attempt_timeout(started, until_ms)
            try:
                self._connect(target, timeout)
                response = send(target, timeout)
                core.connected.add(target)
                return response, attempt
            except Unreachable as unreachable:
                error = unreachable
                found_unreachable.add(target)
            except grpc.RpcError as rpc:
                error = error_from_rpc(rpc)
                core.connected.discard(target)
                found_unreachable.clear()
            hint = core.after_failure(cell, target, error)
            step, pause = core.step(attempt, started, in_doubt, error, command,
                                    found_unreachable)
            in_doubt = in_doubt or error.maybe_applied
            if step == RETRY:
                time.sleep(pause)
            elif step == FAIL:
                raise error
            else:
                raise _InDoubt(error, attempt)

    def execute(self, kind: str, key, command: str, args: Optional[dict] = None,
                command_id: Optional[bytes] = None) -> Executed:
        """Runs ``command`` exactly once; returns its definite outcome or raises
        (:class:`UnknownOutcome` when its fate could not be proven)."""
        core, key = self._core, _key(key)
        command_id = command_id or os.urandom(16)
        issued, expires = core.window()
        request = core.command_request(kind, key, command, args, command_id, issued, expires)
        cell = (kind, key)

        def send(target, timeout):
            stub = client_pb2_grpc.ClientStub(self._channel(target))
            return stub.Execute(request, timeout=timeout)
        try:
            response, attempts = self._call(cell, True, send, until_ms=expires)
        except _InDoubt as doubt:
            return self._settle(kind, key, command_id, expires, doubt)
        core.learn(cell, response.served_by_endpoint)
        return core.executed(response, command_id, expires, attempts)

    def _settle(self, kind, key, command_id, expires, doubt: "_InDoubt") -> Executed:
        try:
            resolved = self.resolve(kind, key, command_id, expires)
        except CellfleetError:
            resolved = None
        return self._core.settled(resolved, command_id, expires, doubt)

    def query(self, kind: str, key, query: str, args: Optional[dict] = None,
              after: Optional[Receipt] = None) -> Queried:
        """Runs a read-only query on the Cell's owner (``after``: read-your-writes)."""
        core, key = self._core, _key(key)
        request = core.query_request(kind, key, query, args, after)

        def send(target, timeout):
            return client_pb2_grpc.ClientStub(self._channel(target)).Query(request, timeout=timeout)
        response, _ = self._call((kind, key), False, send)
        core.learn((kind, key), response.served_by_endpoint)
        return Queried(_json(response.result_json), _receipt(response), response.served_by)

    def resolve(self, kind: str, key, command_id: bytes, command_expires_at_ms: int = 0) -> Resolved:
        """What became of ``command_id``; give the command's expiry for a
        definite answer about a command the ledger does not hold."""
        core, key = self._core, _key(key)
        request = core.resolve_request(kind, key, command_id, command_expires_at_ms)

        def send(target, timeout):
            return client_pb2_grpc.ClientStub(self._channel(target)).Resolve(request, timeout=timeout)
        response, _ = self._call((kind, key), False, send)
        core.learn((kind, key), response.served_by_endpoint)
        return core.resolved(response, command_id)

    def leases(self) -> list:
        """Every node's lease (cellfleet.v1.NodeLease messages)."""
        def send(target, timeout):
            stub = admin_pb2_grpc.AdminStub(self._channel(target))
            return stub.ListLeases(admin_pb2.ListLeasesRequest(), timeout=timeout)
        response, _ = self._call(("", b""), False, send)
        return list(response.leases)

    def node_stats(self):
        """Every live node's counters, gauges and commit latency (a
        cellfleet.v1.NodeStatsResponse: ``nodes``, and ``unreachable`` for
        live nodes that did not answer); rates come from two calls."""
        def send(target, timeout):
            stub = admin_pb2_grpc.AdminStub(self._channel(target))
            return stub.NodeStats(admin_pb2.NodeStatsRequest(), timeout=timeout)
        response, _ = self._call(("", b""), False, send)
        return response

    def cells(self, owner_node_id: str = "", limit: int = 0, page_token: str = ""):
        """One page of the cluster's Cells (a cellfleet.v1.ListCellsResponse:
        ``cells`` and ``next_page_token``; pass it back for the next page)."""
        request = _Core.cells_request(owner_node_id, limit, page_token)

        def send(target, timeout):
            return admin_pb2_grpc.AdminStub(self._channel(target)).ListCells(
                request, timeout=timeout)
        response, _ = self._call(("", b""), False, send)
        return response

    def describe_cell(self, kind: str, key):
        """A Cell's authority root (cellfleet.v1.DescribeCellResponse: owner,
        epoch, TXID, LTX chain, log pointer); :class:`TransportError` named
        ``NOT_FOUND`` when the cluster has no such Cell."""
        request = _Core.describe_request(kind, _key(key))

        def send(target, timeout):
            return admin_pb2_grpc.AdminStub(self._channel(target)).DescribeCell(
                request, timeout=timeout)
        response, _ = self._call(("", b""), False, send)
        return response

    def drain(self, node_id: str):
        """Drains node ``node_id`` (it releases its Cells and retires its
        lease); sent once to that node's endpoint; the key needs ``admin = true``."""
        endpoint, request = self._core.drain_request(node_id, self.leases())
        try:
            return admin_pb2_grpc.AdminStub(self._channel(endpoint)).Drain(
                request, timeout=DRAIN_TIMEOUT_S)
        except grpc.RpcError as rpc:
            raise error_from_rpc(rpc) from None


class _InDoubt(Exception):
    def __init__(self, error: CellfleetError, attempts: int):
        self.error = error
        self.attempts = attempts


# ---------------------------------------------------------------- asyncio


class AsyncClient:
    """The asyncio twin of :class:`Client` (same methods, awaitable)."""

    def __init__(self, config: Config, policy: Optional[RetryPolicy] = None,
                 owner_routing: bool = True, owner_cache_size: int = OWNER_CACHE_DEFAULT):
        self._core = _Core(config, policy, owner_routing, owner_cache_size)
        self._channels: dict[str, grpc.aio.Channel] = {}

    @classmethod
    def from_config(cls, path=None, **options) -> "AsyncClient":
        """As :meth:`Client.from_config`."""
        return cls(Config.read(Config.path(path)), **options)

    async def close(self):
        """Closes every channel."""
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    def cached_owner(self, kind: str, key) -> Optional[str]:
        """The endpoint the Cell's next request goes to, if learnt."""
        return self._core.owners.get((kind, _key(key)))

    def _channel(self, endpoint: str) -> grpc.aio.Channel:
        channel = self._channels.get(endpoint)
        if channel is None:
            channel = grpc.aio.secure_channel(endpoint, self._core.credentials())
            self._channels[endpoint] = channel
        return channel

    async def _connect(self, endpoint: str, timeout: float):
        """As :meth:`Client._connect`."""
        if endpoint in self._core.connected:
            return
        wait = min(timeout, CONNECT_TIMEOUT_S)
        try:
            await asyncio.wait_for(self._channel(endpoint).channel_ready(), wait)
        except asyncio.TimeoutError:
            raise Unreachable(endpoint, wait) from None

    async def _call(self, cell, command: bool, send, until_ms: Optional[int] = None):
        core = self._core
        started, start, hint, in_doubt, attempt = time.monotonic(), core.start(), None, False, 0
        found_unreachable = set()
        while True:
            attempt += 1
            target = core.target(cell, hint, start, attempt)
            timeout = core.attempt_timeout(started, until_ms)
            try:
                await self._connect(target, timeout)
                response = await send(target, timeout)
                core.connected.add(target)
                return response, attempt
            except Unreachable as unreachable:
                error = unreachable
                found_unreachable.add(target)
            except grpc.RpcError as rpc:
                error = error_from_rpc(rpc)
                core.connected.discard(target)
                found_unreachable.clear()
            hint = core.after_failure(cell, target, error)
            step, pause = core.step(attempt, started, in_doubt, error, command,
                                    found_unreachable)
            in_doubt = in_doubt or error.maybe_applied
            if step == RETRY:
                await asyncio.sleep(pause)
            elif step == FAIL:
                raise error
            else:
                raise _InDoubt(error, attempt)

    async def execute(self, kind: str, key, command: str, args: Optional[dict] = None,
                      command_id: Optional[bytes] = None) -> Executed:
        """As :meth:`Client.execute`."""
        core, key = self._core, _key(key)
        command_id = command_id or os.urandom(16)
        issued, expires = core.window()
        request = core.command_request(kind, key, command, args, command_id, issued, expires)
        cell = (kind, key)

        def send(target, timeout):
            stub = client_pb2_grpc.ClientStub(self._channel(target))
            return stub.Execute(request, timeout=timeout)
        try:
            response, attempts = await self._call(cell, True, send, until_ms=expires)
        except _InDoubt as doubt:
            try:
                resolved = await self.resolve(kind, key, command_id, expires)
            except CellfleetError:
                resolved = None
            return core.settled(resolved, command_id, expires, doubt)
        core.learn(cell, response.served_by_endpoint)
        return core.executed(response, command_id, expires, attempts)

    async def query(self, kind: str, key, query: str, args: Optional[dict] = None,
                    after: Optional[Receipt] = None) -> Queried:
        """As :meth:`Client.query`."""
        core, key = self._core, _key(key)
        request = core.query_request(kind, key, query, args, after)

        def send(target, timeout):
            return client_pb2_grpc.ClientStub(self._channel(target)).Query(request, timeout=timeout)
        response, _ = await self._call((kind, key), False, send)
        core.learn((kind, key), response.served_by_endpoint)
        return Queried(_json(response.result_json), _receipt(response), response.served_by)

    async def resolve(self, kind: str, key, command_id: bytes,
                      command_expires_at_ms: int = 0) -> Resolved:
        """As :meth:`Client.resolve`."""
        core, key = self._core, _key(key)
        request = core.resolve_request(kind, key, command_id, command_expires_at_ms)

        def send(target, timeout):
            return client_pb2_grpc.ClientStub(self._channel(target)).Resolve(request, timeout=timeout)
        response, _ = await self._call((kind, key), False, send)
        core.learn((kind, key), response.served_by_endpoint)
        return core.resolved(response, command_id)

    async def leases(self) -> list:
        """As :meth:`Client.leases`."""
        def send(target, timeout):
            stub = admin_pb2_grpc.AdminStub(self._channel(target))
            return stub.ListLeases(admin_pb2.ListLeasesRequest(), timeout=timeout)
        response, _ = await self._call(("", b""), False, send)
        return list(response.leases)

    async def node_stats(self):
        """As :meth:`Client.node_stats`."""
        def send(target, timeout):
            stub = admin_pb2_grpc.AdminStub(self._channel(target))
            return stub.NodeStats(admin_pb2.NodeStatsRequest(), timeout=timeout)
        response, _ = await self._call(("", b""), False, send)
        return response

    async def cells(self, owner_node_id: str = "", limit: int = 0, page_token: str = ""):
        """As :meth:`Client.cells`."""
        request = _Core.cells_request(owner_node_id, limit, page_token)

        def send(target, timeout):
            return admin_pb2_grpc.AdminStub(self._channel(target)).ListCells(
                request, timeout=timeout)
        response, _ = await self._call(("", b""), False, send)
        return response

    async def describe_cell(self, kind: str, key):
        """As :meth:`Client.describe_cell`."""
        request = _Core.describe_request(kind, _key(key))

        def send(target, timeout):
            return admin_pb2_grpc.AdminStub(self._channel(target)).DescribeCell(
                request, timeout=timeout)
        response, _ = await self._call(("", b""), False, send)
        return response

    async def drain(self, node_id: str):
        """As :meth:`Client.drain`."""
        endpoint, request = self._core.drain_request(node_id, await self.leases())
        try:
            return await admin_pb2_grpc.AdminStub(self._channel(endpoint)).Drain(
                request, timeout=DRAIN_TIMEOUT_S)
        except grpc.RpcError as rpc:
            raise error_from_rpc(rpc) from None
