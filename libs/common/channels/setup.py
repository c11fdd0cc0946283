"""A number's channel: which provider it sends through, the provider's ids for it, and its credentials.

The credentials are write-only: :func:`set_channel` takes them, :class:`ChannelView` (what the API returns)
names only which are set, and :class:`Channel` (what the send lane and the webhooks use) keeps them out of
its ``repr``, so no log line or traceback shows one.

    whatsapp_cloud   phone_number_id (Graph's id of the number), access_token (a system user's token),
                     app_secret (signs the webhooks: X-Hub-Signature-256), verify_token (Meta's
                     hub.challenge handshake)
    twilio           account_sid, auth_token (Basic auth and X-Twilio-Signature), sender
                     (``whatsapp:+E164`` or a messaging service SID ``MG...``)
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec
from psycopg import Connection
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from libs.common.contracts.limits import ExternalId
from libs.common.core import decoding
from libs.common.core.errors import InvalidInput, NotFound
from libs.common.core.sql import load_queries
from libs.common.platform.numbers import get_number

QUERIES = load_queries("libs.common.channels", "setup.sql")

Provider = Literal["whatsapp_cloud", "twilio"]
PROVIDERS: tuple[Provider, ...] = ("whatsapp_cloud", "twilio")

_SECRET = r"^[!-~]([ -~]*[!-~])?$"
#: A credential: 8 to 512 printable ASCII characters, no space at either end (it goes into a header).
Secret = Annotated[str, msgspec.Meta(min_length=8, max_length=512, pattern=_SECRET)]
decoding.PATTERNS |= {_SECRET: "must be printable ASCII characters, without a space at either end"}


class _Setup(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, tag_field="provider"):
    pass


class WhatsAppCloudSetup(_Setup, kw_only=True, tag="whatsapp_cloud"):
    """A number on the WhatsApp Cloud API (Meta's Graph API)."""

    phone_number_id: Annotated[str, msgspec.Meta(pattern=r"^[0-9]{1,32}$")]
    access_token: Secret
    app_secret: Secret
    verify_token: Secret


class TwilioSetup(_Setup, kw_only=True, tag="twilio"):
    """A number on Twilio's Messages API (a WhatsApp sender, or a messaging service)."""

    account_sid: Annotated[str, msgspec.Meta(pattern=r"^AC[0-9a-fA-F]{32}$")]
    auth_token: Secret
    sender: Annotated[str, msgspec.Meta(pattern=r"^(whatsapp:\+[1-9][0-9]{6,14}|MG[0-9a-fA-F]{32})$")]


ChannelSetup = WhatsAppCloudSetup | TwilioSetup

#: The credentials of each provider (the fields :class:`ChannelView` names, never shows).
CREDENTIALS: dict[Provider, tuple[str, ...]] = {
    "whatsapp_cloud": ("access_token", "app_secret", "verify_token"),
    "twilio": ("auth_token",),
}


class ChannelView(msgspec.Struct, kw_only=True, frozen=True):
    """A number's channel as the API shows it: never a credential, only which are set."""

    number_id: uuid.UUID
    provider: str
    #: WhatsApp: the phone-number id; Twilio: the account SID.
    account_id: ExternalId
    sender: str | None
    credentials_set: list[str]
    #: Where the provider must send its webhooks (under the API's address).
    webhook_path: str
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class Channel:
    """A number's channel with its credentials (kept out of ``repr``: never logged)."""

    project_id: uuid.UUID
    number_id: uuid.UUID
    provider: Provider
    account_id: str
    sender: str | None
    credentials: dict[str, str] = field(repr=False)
    created_at: datetime
    updated_at: datetime

    def secret(self, name: str) -> str:
        return self.credentials[name]

    def view(self) -> ChannelView:
        return ChannelView(
            number_id=self.number_id,
            provider=self.provider,
            account_id=self.account_id,
            sender=self.sender,
            credentials_set=sorted(k for k in CREDENTIALS[self.provider] if self.credentials.get(k)),
            webhook_path=webhook_path(self.provider, self.number_id),
            created_at=self.created_at,
            updated_at=self.updated_at,
        )


def webhook_path(provider: str, number_id: uuid.UUID) -> str:
    """The path of a number's provider webhook."""
    name = "whatsapp" if provider == "whatsapp_cloud" else "twilio"
    return f"/v1/providers/{name}/{number_id}/webhook"


def _channel(row: dict[str, Any] | None) -> Channel | None:
    return None if row is None else Channel(**row)


def set_channel(
    conn: Connection[Any], project_id: uuid.UUID, number_id: uuid.UUID, setup: ChannelSetup, *, now: datetime
) -> ChannelView:
    """Set (or replace) the number's channel; 404 for another project's number."""
    get_number(conn, project_id, number_id, lock=True)
    if isinstance(setup, WhatsAppCloudSetup):
        provider: Provider = "whatsapp_cloud"
        account_id, sender = setup.phone_number_id, None
    else:
        provider = "twilio"
        account_id, sender = setup.account_sid, setup.sender
    credentials = {name: getattr(setup, name) for name in CREDENTIALS[provider]}
    for name, value in credentials.items():
        if not value.isprintable() or value != value.strip():
            raise InvalidInput(f"{name} must be printable, without surrounding spaces", field=name)
    params = {
        "project_id": project_id,
        "number_id": number_id,
        "provider": provider,
        "account_id": account_id,
        "sender": sender,
        "credentials": Jsonb(credentials),
        "now": now,
    }
    with conn.cursor(row_factory=dict_row) as cur:
        channel = _channel(cur.execute(QUERIES["upsert_channel"], params).fetchone())
    assert channel is not None
    return channel.view()


def get_channel(conn: Connection[Any], project_id: uuid.UUID, number_id: uuid.UUID) -> Channel:
    """The number's channel (404 when it has none, or is another project's)."""
    with conn.cursor(row_factory=dict_row) as cur:
        params = {"project_id": project_id, "number_id": number_id}
        channel = _channel(cur.execute(QUERIES["get_channel"], params).fetchone())
    if channel is None:
        raise NotFound("this number has no channel", field="number_id")
    return channel


def channel_of_webhook(conn: Connection[Any], number_id: uuid.UUID) -> Channel | None:
    """The channel a provider's webhook names (its signature, checked next, proves the caller)."""
    with conn.cursor(row_factory=dict_row) as cur:
        return _channel(cur.execute(QUERIES["channel_of_webhook"], {"number_id": number_id}).fetchone())


def delete_channel(conn: Connection[Any], project_id: uuid.UUID, number_id: uuid.UUID) -> None:
    """Forget the number's channel (404 when it has none)."""
    params = {"project_id": project_id, "number_id": number_id}
    if conn.execute(QUERIES["delete_channel"], params).fetchone() is None:
        raise NotFound("this number has no channel", field="number_id")
