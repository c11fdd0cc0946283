"""Configuration, read once from environment variables.

One msgspec struct per concern. Every field is documented in :data:`ENVIRONMENT`, which also feeds the
README's configuration table (a test keeps the two in step). A malformed value raises
:class:`SettingsError` naming the variable; the CLI turns that into a clean exit at start.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

import msgspec

from libs.common.contracts.limits import MAX_SECRET_OVERLAP_SECONDS

Check = Callable[[Any], "str | None"]


class SettingsError(Exception):
    """A configuration variable has a value the process cannot run with."""


@dataclass(frozen=True)
class Variable:
    """One environment variable: where it goes and what it means."""

    name: str
    field: str
    default: Any
    help: str


class _Settings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    pass


class DatabaseSettings(_Settings):
    url: str
    pool_min_size: int = 1
    pool_max_size: int = 10
    pool_timeout_seconds: float = 2.0


class BrokerSettings(_Settings):
    amqp_url: str | None = None
    queue_type: str = "quorum"
    events_exchange: str = "followups.events"


class ApiSettings(_Settings):
    host: str = "127.0.0.1"
    port: int = 8000
    threads: int = 100
    dashboard_secret: str | None = None
    dashboard_session_seconds: int = 43_200
    signin_failures_per_minute: int = 10
    auth_failures_per_minute: int = 30
    key_requests_per_minute: int = 6000
    limiter_max_entries: int = 100_000
    trusted_proxies: str = "127.0.0.1,::1"
    header_timeout_seconds: float = 10.0
    body_timeout_seconds: float = 60.0
    metrics_token: str | None = None
    metrics_port: int = 0


class WorkerSettings(_Settings):
    poll_interval_seconds: float = 1.0
    idle_max_sleep_seconds: float = 5.0
    threads: int = 4
    metrics_port: int = 9300


class FollowupSettings(_Settings):
    max_failures: int = 8
    busy_retry_seconds: float = 2.0
    backoff_min_seconds: float = 30.0
    backoff_max_seconds: float = 3600.0


class RuleSettings(_Settings):
    sweep_interval_seconds: float = 1.0
    execution_stale_after_seconds: float = 86400.0
    webhook_secret_overlap_seconds: int = 86400
    webhook_allowed_networks: str = ""
    webhook_timeout_seconds: float = 10.0
    webhook_concurrency: int = 16
    webhook_project_concurrency: int = 4


class AiSettings(_Settings):
    base_url: str | None = None
    api_key: str | None = None
    model: str = "gpt-4o-mini"
    timeout_seconds: float = 20.0
    lease_ms: int = 120_000
    concurrency: int = 16
    prompt_price_per_million: float = 0.0
    completion_price_per_million: float = 0.0
    #: The operator's cap on any project's monthly tokens (None: no cap).
    max_monthly_tokens_per_project: int | None = None
    #: How the JSON schema of the answer is asked for: ``json_schema`` (OpenAI, vLLM) or ``json_object``
    #: with a ``schema`` beside it (the llama.cpp server).
    response_format: str = "json_schema"

    @property
    def step_lease(self) -> timedelta | None:
        """How long the release path leases an AI step for its model call; None without a model configured
        (the step then takes its fallback at once)."""
        return timedelta(milliseconds=self.lease_ms) if self.base_url else None


class ChannelSettings(_Settings):
    """The providers' addresses (operator settings, never a tenant's) and the send lane's bounds."""

    whatsapp_graph_url: str = "https://graph.facebook.com/v21.0"
    twilio_api_url: str = "https://api.twilio.com"
    #: The API's public address as the providers call it (Twilio signs the URL it called).
    public_url: str | None = None
    timeout_seconds: float = 10.0
    concurrency: int = 64
    number_concurrency: int = 8
    batch: int = 200
    message_lifetime_seconds: float = 86400.0


class LogSettings(_Settings):
    level: str = "INFO"
    #: None: JSON, except plain text under ``followups dev`` (the command decides).
    json: bool | None = None


_DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/postgres"

#: Every environment variable the product reads, grouped by the struct it fills.
ENVIRONMENT: dict[type[_Settings], tuple[Variable, ...]] = {
    DatabaseSettings: (
        Variable("DATABASE_URL", "url", _DEFAULT_DATABASE_URL, "PostgreSQL connection URL."),
        Variable("DATABASE_POOL_MIN_SIZE", "pool_min_size", 1, "Connections each process keeps open."),
        Variable("DATABASE_POOL_MAX_SIZE", "pool_max_size", 10, "Most connections one process opens."),
        Variable(
            "DATABASE_POOL_TIMEOUT_SECONDS",
            "pool_timeout_seconds",
            2.0,
            "Longest wait for a connection of the pool; then the API answers 503 with `Retry-After` and a"
            " worker's loop retries (see docs/operations.md, Database outages).",
        ),
    ),
    BrokerSettings: (
        Variable(
            "AMQP_URL",
            "amqp_url",
            None,
            "RabbitMQ URL; several nodes of a cluster separated by commas (`amqp://u:p@rmq1/v,amqp://u:p@rmq2/v`),"
            " tried in turn. Required by `api` and `worker`; `dev` uses an in-process broker instead.",
        ),
        Variable(
            "AMQP_QUEUE_TYPE",
            "queue_type",
            "quorum",
            "`quorum` (replicated on the cluster's nodes) or `classic` (one node's): the type of every queue"
            " the product declares. A queue cannot change type in place: see docs/operations.md, Quorum"
            " queues.",
        ),
        Variable(
            "EVENTS_EXCHANGE",
            "events_exchange",
            "followups.events",
            "Topic exchange the outbox relay publishes domain events to.",
        ),
    ),
    ApiSettings: (
        Variable("API_HOST", "host", "127.0.0.1", "Address the API listens on (`--host` overrides)."),
        Variable("API_PORT", "port", 8000, "Port the API listens on (`--port` overrides)."),
        Variable(
            "API_THREADS",
            "threads",
            100,
            "Threads the API runs its request handlers in: at least as many as the clients it serves at"
            " once.",
        ),
        Variable(
            "DASHBOARD_SECRET",
            "dashboard_secret",
            None,
            "Signs the dashboard's CSRF tokens (32 characters or more); every API process behind one"
            " address needs the same. Unset: a random one per process (a restart makes open forms stale).",
        ),
        Variable(
            "DASHBOARD_SESSION_SECONDS",
            "dashboard_session_seconds",
            43_200,
            "How long a dashboard session lasts after signing in (12 hours); it ends sooner at sign-out or"
            " when its API key is revoked or expires.",
        ),
        Variable(
            "API_SIGNIN_FAILURES_PER_MINUTE",
            "signin_failures_per_minute",
            10,
            "Failed dashboard sign-ins one client address may make a minute (then 429 with `Retry-After`;"
            " docs/operations.md, Limits).",
        ),
        Variable(
            "API_AUTH_FAILURES_PER_MINUTE",
            "auth_failures_per_minute",
            30,
            "Requests with a wrong bearer key (401) one client address may make a minute; then its bearer"
            " requests are 429.",
        ),
        Variable(
            "API_KEY_REQUESTS_PER_MINUTE",
            "key_requests_per_minute",
            6000,
            "Requests one API key may make a minute, in bursts of as many (0: no limit); then 429.",
        ),
        Variable(
            "API_LIMITER_MAX_ENTRIES",
            "limiter_max_entries",
            100_000,
            "Addresses or keys each limit remembers at most (the oldest is forgotten first).",
        ),
        Variable(
            "API_TRUSTED_PROXIES",
            "trusted_proxies",
            "127.0.0.1,::1",
            "Comma-separated addresses or networks of reverse proxies whose `X-Forwarded-For` (and"
            " `X-Forwarded-Proto`) name the client (`*`: any; `none`: nobody, the client is the socket's"
            " peer). The default trusts only a proxy on the same host, as uvicorn does.",
        ),
        Variable(
            "API_HEADER_TIMEOUT_SECONDS",
            "header_timeout_seconds",
            10.0,
            "Longest a connection may take to send a request's headers (from its opening or its previous"
            " response); then it is closed.",
        ),
        Variable(
            "API_BODY_TIMEOUT_SECONDS",
            "body_timeout_seconds",
            60.0,
            "Longest a request may take to send its body after its headers; then 408 and the connection is"
            " closed.",
        ),
        Variable(
            "METRICS_TOKEN",
            "metrics_token",
            None,
            "When set, the API's `/metrics` needs `Authorization: Bearer <token>` (16 characters or more).",
        ),
        Variable(
            "API_METRICS_PORT",
            "metrics_port",
            0,
            "When set, the API serves its Prometheus metrics on this port instead of `/metrics` of"
            " `API_PORT` (0: on `/metrics`).",
        ),
    ),
    WorkerSettings: (
        Variable(
            "WORKER_POLL_INTERVAL_SECONDS",
            "poll_interval_seconds",
            1.0,
            "First sleep of an idle loop before it polls PostgreSQL again (doubles up to the maximum).",
        ),
        Variable(
            "WORKER_IDLE_MAX_SLEEP_SECONDS",
            "idle_max_sleep_seconds",
            5.0,
            "Longest sleep of an idle loop; broker nudges wake it sooner.",
        ),
        Variable("WORKER_THREADS", "threads", 4, "Dramatiq worker threads per worker process."),
        Variable(
            "WORKER_METRICS_PORT",
            "metrics_port",
            9300,
            "Port a worker serves Prometheus metrics on (0 disables).",
        ),
    ),
    FollowupSettings: (
        Variable(
            "FOLLOWUP_MAX_FAILURES",
            "max_failures",
            8,
            "Unexpected release errors after which an enrollment is failed.",
        ),
        Variable(
            "FOLLOWUP_BUSY_RETRY_SECONDS",
            "busy_retry_seconds",
            2.0,
            "Retry delay when the contact is locked by another transaction.",
        ),
        Variable(
            "FOLLOWUP_BACKOFF_MIN_SECONDS",
            "backoff_min_seconds",
            30.0,
            "First backoff after an unexpected release error (doubles each time).",
        ),
        Variable(
            "FOLLOWUP_BACKOFF_MAX_SECONDS",
            "backoff_max_seconds",
            3600.0,
            "Longest backoff after unexpected release errors.",
        ),
    ),
    RuleSettings: (
        Variable(
            "RULES_SWEEP_INTERVAL_SECONDS",
            "sweep_interval_seconds",
            1.0,
            "How often the triggers service sweeps the delayed rules that fell due (nudges wake it sooner).",
        ),
        Variable(
            "RULES_EXECUTION_STALE_AFTER_SECONDS",
            "execution_stale_after_seconds",
            86400.0,
            "A delayed rule found more than this late (the workers were down) is skipped `expired`.",
        ),
        Variable(
            "WEBHOOK_SECRET_OVERLAP_SECONDS",
            "webhook_secret_overlap_seconds",
            86400,
            "How long a rotated webhook secret still signs deliveries beside the new one, unless the"
            " rotation gives `overlap_seconds` (0 to 604800).",
        ),
        Variable(
            "WEBHOOK_ALLOWED_NETWORKS",
            "webhook_allowed_networks",
            "",
            "Comma-separated CIDRs webhooks may reach although they are not public (loopback, private,"
            " link-local ...), e.g. `127.0.0.0/8,::1/128` for a receiver on this host. Empty: public"
            " addresses only.",
        ),
        Variable(
            "WEBHOOK_TIMEOUT_SECONDS",
            "webhook_timeout_seconds",
            10.0,
            "The deadline of one webhook attempt: lookup, connect, send and the response's head together.",
        ),
        Variable(
            "WEBHOOK_CONCURRENCY",
            "webhook_concurrency",
            16,
            "Webhook deliveries one triggers process makes at once.",
        ),
        Variable(
            "WEBHOOK_PROJECT_CONCURRENCY",
            "webhook_project_concurrency",
            4,
            "Of those, at most this many of one project's at once (the rest go to other projects).",
        ),
    ),
    AiSettings: (
        Variable(
            "AI_BASE_URL",
            "base_url",
            None,
            "OpenAI-compatible API of the model AI steps use (`https://api.openai.com/v1`, vLLM, Ollama's"
            " `/v1`, llama.cpp server). Unset: every AI step takes its fallback (`ai_unavailable`).",
        ),
        Variable("AI_API_KEY", "api_key", None, "Bearer key for `AI_BASE_URL` (unset: none sent)."),
        Variable("AI_MODEL", "model", "gpt-4o-mini", "Model name sent with each AI step's request."),
        Variable(
            "AI_TIMEOUT_SECONDS",
            "timeout_seconds",
            20.0,
            "Longest wait for a model answer (then `ai_timeout`).",
        ),
        Variable(
            "FOLLOWUP_AI_LEASE_MS",
            "lease_ms",
            120_000,
            "How long an AI step is leased for its model call; a worker that dies lets it expire and the step"
            " is run again with a new fence.",
        ),
        Variable("AI_CONCURRENCY", "concurrency", 16, "Model calls one ai_steps process makes at once."),
        Variable(
            "AI_PROMPT_PRICE_PER_MILLION",
            "prompt_price_per_million",
            0.0,
            "Price of a million prompt tokens (in your currency): the ledger's cost of each call.",
        ),
        Variable(
            "AI_COMPLETION_PRICE_PER_MILLION",
            "completion_price_per_million",
            0.0,
            "Price of a million completion tokens: the ledger's cost of each call.",
        ),
        Variable(
            "AI_MAX_MONTHLY_TOKENS_PER_PROJECT",
            "max_monthly_tokens_per_project",
            None,
            "The operator's cap on the model tokens any one project's AI steps use in a calendar month (UTC):"
            " a project's `ai_monthly_token_budget` may not exceed it, and an unset budget means the cap."
            " Unset: no cap (a project's budget, if any, is the only limit).",
        ),
        Variable(
            "AI_RESPONSE_FORMAT",
            "response_format",
            "json_schema",
            "How the answer's JSON schema is sent first: `json_schema` (OpenAI's `response_format`, vLLM) or"
            ' `json_object` (`{"type": "json_object", "schema": ...}`, the llama.cpp server); a server'
            " refusing it is asked with the other, then without.",
        ),
    ),
    ChannelSettings: (
        Variable(
            "WHATSAPP_GRAPH_URL",
            "whatsapp_graph_url",
            "https://graph.facebook.com/v21.0",
            "WhatsApp Cloud API base URL with its version (the send lane POSTs to"
            " `<it>/<phone-number-id>/messages`); an operator setting, never a tenant's (docs/providers.md).",
        ),
        Variable(
            "TWILIO_API_URL",
            "twilio_api_url",
            "https://api.twilio.com",
            "Twilio REST API base URL (`<it>/2010-04-01/Accounts/<sid>/Messages.json`).",
        ),
        Variable(
            "PROVIDER_WEBHOOK_PUBLIC_URL",
            "public_url",
            None,
            "The API's public base URL as the providers reach it (`https://followups.example.com`): Twilio"
            " signs the URL it called, and each Twilio message asks for its status callback there. Unset:"
            " the URL of the request as received.",
        ),
        Variable(
            "SEND_LANE_TIMEOUT_SECONDS",
            "timeout_seconds",
            10.0,
            "Deadline of one provider request (connect, send, answer); an answer lost after the request"
            " went out is never resent (the message waits for its status).",
        ),
        Variable(
            "SEND_LANE_CONCURRENCY",
            "concurrency",
            64,
            "Provider requests one send-lane worker has in flight.",
        ),
        Variable(
            "SEND_LANE_NUMBER_CONCURRENCY",
            "number_concurrency",
            8,
            "Provider requests in flight per number, across every send-lane replica.",
        ),
        Variable("SEND_LANE_BATCH", "batch", 200, "Most messages one claim of the send lane takes."),
        Variable(
            "SEND_LANE_MESSAGE_LIFETIME_SECONDS",
            "message_lifetime_seconds",
            86400.0,
            "How long after it was queued a message may still be retried (429, provider unreachable) or"
            " wait for a lost answer's status; then it is FAILED (`expired`, `unconfirmed`).",
        ),
    ),
    LogSettings: (
        Variable("LOG_LEVEL", "level", "INFO", "DEBUG, INFO, WARNING or ERROR."),
        Variable(
            "LOG_JSON",
            "json",
            None,
            "One JSON object per log line (`false`: plain text). Unset: JSON, except plain text under"
            " `followups dev`.",
        ),
    ),
}

S = TypeVar("S", bound=_Settings)


def _positive(value: Any) -> str | None:
    return None if value > 0 else "must be positive"


def _not_negative(value: Any) -> str | None:
    return None if value >= 0 else "must not be negative"


def _overlap(value: Any) -> str | None:
    ok = 0 <= value <= MAX_SECRET_OVERLAP_SECONDS
    return None if ok else f"must be between 0 and {MAX_SECRET_OVERLAP_SECONDS} (a week)"


def _port(value: Any) -> str | None:
    return None if 0 <= value <= 65535 else "must be a TCP port (0-65535)"


def _prefix(*schemes: str) -> Check:
    def check(value: Any) -> str | None:
        ok = value is None or str(value).startswith(schemes)
        return None if ok else f"must start with {' or '.join(schemes)}"

    return check


def node_urls(url: str) -> list[str]:
    """The node URLs ``AMQP_URL`` lists: one, or several separated by commas (or by semicolons, Dramatiq's
    own separator), each starting with ``amqp://`` or ``amqps://`` (a comma inside a URL's query, in
    ``ssl_options`` say, does not split it)."""
    return [part.strip() for part in re.split(r"[,;]\s*(?=amqps?://)", url.strip()) if part.strip()]


def _amqp_urls(value: Any) -> str | None:
    text = str(value).strip()
    if not text.startswith(("amqp://", "amqps://")):
        return "must start with amqp:// or amqps://"
    if any(re.search(r"[,;]", node.split("?", 1)[0]) for node in node_urls(text)):
        return "each node's URL must start with amqp:// or amqps:// (nodes separated by commas)"
    return None


def _min_length(length: int) -> Check:
    def check(value: Any) -> str | None:
        return None if len(str(value)) >= length else f"must be at least {length} characters long"

    return check


def _exactly_one_of(*choices: str) -> Check:
    def check(value: Any) -> str | None:
        return None if value in choices else f"must be one of {', '.join(choices)}"

    return check


def _one_of(*choices: str) -> Check:
    def check(value: Any) -> str | None:
        return None if str(value).upper() in choices else f"must be one of {', '.join(choices)}"

    return check


def _addresses(value: Any) -> str | None:
    """``*``, ``none``, or comma-separated IP addresses and networks."""
    items = [item.strip() for item in str(value).split(",")]
    if items in (["*"], ["none"]):
        return None
    for item in items:
        try:
            ipaddress.ip_network(item, strict=False)
        except ValueError:
            return f"{item!r} is not an IP address or network (or use *)"
    return None


def parse_networks(value: str) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """Comma-separated IP networks (CIDRs or addresses; empty: none); ValueError names a bad one."""
    networks = []
    for item in (part.strip() for part in value.split(",")):
        if item:
            try:
                networks.append(ipaddress.ip_network(item, strict=False))
            except ValueError:
                raise ValueError(f"{item!r} is not an IP network (CIDR)") from None
    return tuple(networks)


def _networks(value: Any) -> str | None:
    try:
        parse_networks(str(value))
    except ValueError as exc:
        return str(exc)
    return None


#: Checks per variable, beyond the type conversion.
CHECKS: dict[str, Check] = {
    "DATABASE_URL": _prefix("postgresql://", "postgres://"),
    "DATABASE_POOL_MIN_SIZE": _positive,
    "DATABASE_POOL_MAX_SIZE": _positive,
    "DATABASE_POOL_TIMEOUT_SECONDS": _positive,
    "AMQP_URL": _amqp_urls,
    "AMQP_QUEUE_TYPE": _exactly_one_of("quorum", "classic"),
    "API_PORT": _port,
    "API_THREADS": _positive,
    "DASHBOARD_SECRET": _min_length(32),
    "DASHBOARD_SESSION_SECONDS": _positive,
    "API_SIGNIN_FAILURES_PER_MINUTE": _positive,
    "API_AUTH_FAILURES_PER_MINUTE": _positive,
    "API_KEY_REQUESTS_PER_MINUTE": _not_negative,
    "API_LIMITER_MAX_ENTRIES": _positive,
    "API_TRUSTED_PROXIES": _addresses,
    "API_HEADER_TIMEOUT_SECONDS": _positive,
    "API_BODY_TIMEOUT_SECONDS": _positive,
    "METRICS_TOKEN": _min_length(16),
    "API_METRICS_PORT": _port,
    "WORKER_POLL_INTERVAL_SECONDS": _positive,
    "WORKER_IDLE_MAX_SLEEP_SECONDS": _positive,
    "WORKER_THREADS": _positive,
    "WORKER_METRICS_PORT": _port,
    "FOLLOWUP_MAX_FAILURES": _positive,
    "FOLLOWUP_BUSY_RETRY_SECONDS": _positive,
    "FOLLOWUP_BACKOFF_MIN_SECONDS": _positive,
    "FOLLOWUP_BACKOFF_MAX_SECONDS": _positive,
    "RULES_SWEEP_INTERVAL_SECONDS": _positive,
    "RULES_EXECUTION_STALE_AFTER_SECONDS": _positive,
    "WEBHOOK_SECRET_OVERLAP_SECONDS": _overlap,
    "WEBHOOK_ALLOWED_NETWORKS": _networks,
    "WEBHOOK_TIMEOUT_SECONDS": _positive,
    "WEBHOOK_CONCURRENCY": _positive,
    "WEBHOOK_PROJECT_CONCURRENCY": _positive,
    "AI_BASE_URL": _prefix("http://", "https://"),
    "AI_TIMEOUT_SECONDS": _positive,
    "FOLLOWUP_AI_LEASE_MS": _positive,
    "AI_CONCURRENCY": _positive,
    "AI_PROMPT_PRICE_PER_MILLION": _not_negative,
    "AI_COMPLETION_PRICE_PER_MILLION": _not_negative,
    "AI_MAX_MONTHLY_TOKENS_PER_PROJECT": _positive,
    "AI_RESPONSE_FORMAT": _exactly_one_of("json_schema", "json_object"),
    "WHATSAPP_GRAPH_URL": _prefix("http://", "https://"),
    "TWILIO_API_URL": _prefix("http://", "https://"),
    "PROVIDER_WEBHOOK_PUBLIC_URL": _prefix("http://", "https://"),
    "SEND_LANE_TIMEOUT_SECONDS": _positive,
    "SEND_LANE_CONCURRENCY": _positive,
    "SEND_LANE_NUMBER_CONCURRENCY": _positive,
    "SEND_LANE_BATCH": _positive,
    "SEND_LANE_MESSAGE_LIFETIME_SECONDS": _positive,
    "LOG_LEVEL": _one_of("DEBUG", "INFO", "WARNING", "ERROR"),
}

_TYPES = {
    "str": str,
    "int": int,
    "float": float,
    "bool": bool,
    "str | None": str,
    "bool | None": bool,
    "int | None": int,
}


#: Variables whose value may hold a secret: an error shows them with the secret masked.
_SECRET_URLS = frozenset({"DATABASE_URL", "AMQP_URL", "AI_BASE_URL"})
_SECRETS = frozenset({"AI_API_KEY", "DASHBOARD_SECRET", "METRICS_TOKEN"})


def _shown(name: str, raw: str) -> str:
    """A bad value as an error may print it: a key masked, a URL's password masked."""
    if name in _SECRETS:
        return "***"
    if name in _SECRET_URLS:
        return re.sub(r"(?<=:)[^:@/]*(?=@)", "***", raw)
    return raw


def load(kind: type[S], environ: Mapping[str, str] | None = None) -> S:
    """Build one settings struct from the environment, naming the variable on a bad value."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for var in ENVIRONMENT[kind]:
        raw = env.get(var.name)
        if raw is None or raw == "":
            values[var.field] = var.default
            continue
        # Annotations are strings under `from __future__ import annotations`.
        target = _TYPES[kind.__annotations__[var.field]]
        try:
            value: Any = msgspec.convert(raw, target, strict=False)
        except msgspec.ValidationError as exc:
            raise SettingsError(f"{var.name}={_shown(var.name, raw)!r} is not valid: {exc}") from None
        check = CHECKS.get(var.name)
        problem = check(value) if check else None
        if problem:
            raise SettingsError(f"{var.name}={_shown(var.name, raw)!r} is not valid: {problem}")
        values[var.field] = value
    return msgspec.convert(values, kind)


@dataclass(frozen=True)
class Settings:
    """Every concern's settings, loaded together at process start."""

    database: DatabaseSettings
    broker: BrokerSettings
    api: ApiSettings
    worker: WorkerSettings
    followup: FollowupSettings
    log: LogSettings
    rules: RuleSettings = field(default_factory=RuleSettings)
    ai: AiSettings = field(default_factory=AiSettings)
    channels: ChannelSettings = field(default_factory=ChannelSettings)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        return cls(
            database=load(DatabaseSettings, environ),
            broker=load(BrokerSettings, environ),
            api=load(ApiSettings, environ),
            worker=load(WorkerSettings, environ),
            followup=load(FollowupSettings, environ),
            log=load(LogSettings, environ),
            rules=load(RuleSettings, environ),
            ai=load(AiSettings, environ),
            channels=load(ChannelSettings, environ),
        )


def markdown_table() -> str:
    """The README's configuration table, generated from :data:`ENVIRONMENT`."""
    lines = ["| Variable | Default | Meaning |", "|---|---|---|"]
    for variables in ENVIRONMENT.values():
        for var in variables:
            default = (
                "(none)"
                if var.default is None
                else f"`{str(var.default).lower() if isinstance(var.default, bool) else var.default}`"
            )
            lines.append(f"| `{var.name}` | {default} | {var.help} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown_table())
