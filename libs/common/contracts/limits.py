"""The size limits of what the engine takes in, as ``Annotated`` types for input structs.

msgspec checks them whenever a struct is decoded (a REST body, a broker message), and the OpenAPI schema
is generated from them, so the documented bound and the enforced one are the same value. The domain's
checks for values built in code (:mod:`libs.common.core.validation`) use the same constants.
"""

from __future__ import annotations

import re
from typing import Annotated, Any
from zoneinfo import available_timezones

import msgspec

#: Longest name of a contact, sequence, number, rule or campaign (and a conversation's assignee or team).
MAX_NAME_LENGTH = 200
#: Longest text message: WhatsApp's limit for a text message, so the longest text of a step or of a rule's
#: message (a template, before its placeholders are filled in).
MAX_MESSAGE_LENGTH = 4096
#: Longest label of a lead's status, a deal's stage, a tag or a conversation label.
MAX_LABEL_LENGTH = 64
#: Longest key of an attribute (a contact's, a conversation's).
MAX_KEY_LENGTH = 64
#: Longest identifier chosen outside the engine: a provider's message id, a recipient id, a dedupe key.
MAX_EXTERNAL_ID_LENGTH = 256
#: Longest URL (of media: a step's, an inbound message's; signed links are long).
MAX_URL_LENGTH = 8192
#: Longest private note.
MAX_NOTE_LENGTH = 10_000
#: Most attributes one object (a contact's, a conversation's) carries.
MAX_ATTRIBUTES = 100
#: Most tags or labels one change names.
MAX_LABELS = 100
#: Largest JSON object stored as given (attributes, template variables), encoded as compact JSON.
MAX_JSON_BYTES = 16 * 1024
#: Longest text of any field without a lower limit of its own (an inbound message's body, an error).
MAX_TEXT_LENGTH = 65_536
#: Longest overlap of a webhook secret's rotation (the old secret signs too meanwhile): a week.
MAX_SECRET_OVERLAP_SECONDS = 7 * 86400
#: Most rules one project holds (active or not): a project's rules are matched together on every event.
MAX_RULES_PER_PROJECT = 500
#: Most nodes of one condition tree (a rule's, a segment's): groups and leaves together.
MAX_CONDITION_NODES = 200
#: Most children of one ``all`` / ``any`` group of a condition tree.
MAX_GROUP_CHILDREN = 50

#: Most template variables one enrollment, job or action carries (their keys: 1 to 64 characters).
MAX_VARIABLES = 100
#: Most tags or labels one rule action changes.
MAX_ACTION_LABELS = 20
#: Most actions one rule runs.
MAX_RULE_ACTIONS = 20
#: Longest dedupe key of an enrollment and idempotency key of a bulk job.
MAX_DEDUPE_KEY_LENGTH = 200
#: Longest note of a stop by hand.
MAX_STOP_NOTE_LENGTH = 500

#: A phone number in E.164: ``+``, then 7 to 15 digits, the first not 0 (the server also takes spaces,
#: dashes and brackets anywhere and drops them: :func:`libs.common.core.validation.phone`).
PHONE_PATTERN = r"^\+[1-9][0-9]{6,14}$"
#: A tag or label: a letter, digit or ``_``, then up to 63 of those or `` .:/-``; no empty or ``.`` segment
#: between slashes, so it survives a trip through a URL path (:func:`libs.common.core.validation.tag`).
TAG_PATTERN = r"^(?!.*//)(?!.*/\.?$)(?!.*/\./)[\w][\w .:/-]{0,63}$"
#: An absolute http or https URL (a media file's).
MEDIA_URL_PATTERN = r"^[Hh][Tt][Tt][Pp][Ss]?://[^\s/?#\[\]]+[^\s]*$"
#: A 24-hour clock time, ``HH:MM``.
CLOCK_PATTERN = r"^([01][0-9]|2[0-3]):[0-5][0-9]$"
#: Text that is not blank.
NOT_BLANK = r"\S"


def _documented_timezones() -> list[str]:
    """The IANA time zone names the server knows, as the OpenAPI document lists them: an alias that differs
    from a name already listed only in its punctuation (``GMT+0``, ``GMT-0`` beside ``GMT0``; ``Etc/GMT+1``
    beside ``Etc/GMT-1``) is left out, since client generators name enum members by letters and digits
    alone (the server still takes it)."""
    seen: set[str] = set()
    listed = []
    for name in sorted(available_timezones(), key=lambda n: ("+" in n or "-" in n, n)):
        key = re.sub(r"[^A-Za-z0-9]", "", name).upper()
        if key not in seen:
            seen.add(key)
            listed.append(name)
    return sorted(listed)


#: The IANA time zone names the OpenAPI document lists (see :func:`_documented_timezones`).
TIMEZONES = _documented_timezones()

#: A name: 1 to 200 characters, not blank (checked on write, stripped; the pattern documents it).
Name = Annotated[
    str,
    msgspec.Meta(min_length=1, max_length=MAX_NAME_LENGTH, extra_json_schema={"pattern": NOT_BLANK}),
]
#: A phone number as given (normalised and checked on write; the pattern documents what passes).
Phone = Annotated[
    str, msgspec.Meta(min_length=1, max_length=32, extra_json_schema={"pattern": PHONE_PATTERN})
]
#: A tag or label (stripped and checked on write, naming the list; the schema documents what passes).
Tag = Annotated[
    str,
    msgspec.Meta(extra_json_schema={"minLength": 1, "maxLength": MAX_LABEL_LENGTH, "pattern": TAG_PATTERN}),
]
#: An IANA time zone name, such as Europe/Lisbon (checked on write; the enum documents what passes).
Timezone = Annotated[str, msgspec.Meta(extra_json_schema={"enum": TIMEZONES})]
#: A 24-hour clock time (checked with the window it opens or closes).
Clock = Annotated[str, msgspec.Meta(extra_json_schema={"pattern": CLOCK_PATTERN})]
#: The text of a message (a template): at most 4,096 characters.
MessageText = Annotated[str, msgspec.Meta(max_length=MAX_MESSAGE_LENGTH)]
#: A lead status, a deal stage: 1 to 64 characters.
Label = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_LABEL_LENGTH)]
#: An attribute's key: 1 to 64 characters.
Key = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_KEY_LENGTH)]
#: An identifier chosen outside the engine: 1 to 256 characters.
ExternalId = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_EXTERNAL_ID_LENGTH)]
#: A URL: at most 8,192 characters (a signed link included).
Url = Annotated[str, msgspec.Meta(max_length=MAX_URL_LENGTH)]
#: A media file's URL: absolute http or https, at most 8,192 characters.
MediaUrl = Annotated[
    str, msgspec.Meta(max_length=MAX_URL_LENGTH, extra_json_schema={"pattern": MEDIA_URL_PATTERN})
]
#: What the schema says of a text the server refuses blank (it checks that itself, naming the field).
NOT_BLANK_TEXT = msgspec.Meta(extra_json_schema={"minLength": 1, "pattern": NOT_BLANK})
#: A private note: at most 10,000 characters.
Note = Annotated[str, msgspec.Meta(max_length=MAX_NOTE_LENGTH)]
#: Any other text: at most 65,536 characters.
Text = Annotated[str, msgspec.Meta(max_length=MAX_TEXT_LENGTH)]
#: The bounds of an attribute's or a variable's key, as the schema states them (checked on write, naming
#: the key: :func:`libs.common.core.validation.keyed`).
KEY_BOUNDS = {"minLength": 1, "maxLength": MAX_KEY_LENGTH}
#: Template variables: at most 100, each key 1 to 64 characters (and 16 KB as JSON, checked on write).
Variables = Annotated[
    dict[str, Any],
    msgspec.Meta(max_length=MAX_VARIABLES, extra_json_schema={"propertyNames": KEY_BOUNDS}),
]
#: A dedupe or idempotency key: 1 to 200 characters.
DedupeKey = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_DEDUPE_KEY_LENGTH)]
#: The note of a stop by hand: at most 500 characters.
StopNote = Annotated[str, msgspec.Meta(max_length=MAX_STOP_NOTE_LENGTH)]
