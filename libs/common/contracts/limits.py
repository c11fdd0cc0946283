"""The size limits of what the engine takes in, as ``Annotated`` types for input structs.

msgspec checks them whenever a struct is decoded (a REST body, a broker message), and the OpenAPI schema
is generated from them, so the documented bound and the enforced one are the same value. The domain's
checks for values built in code (:mod:`libs.common.core.validation`) use the same constants.
"""

from __future__ import annotations

from typing import Annotated

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

#: A name: 1 to 200 characters.
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_NAME_LENGTH)]
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
#: A private note: at most 10,000 characters.
Note = Annotated[str, msgspec.Meta(max_length=MAX_NOTE_LENGTH)]
#: Any other text: at most 65,536 characters.
Text = Annotated[str, msgspec.Meta(max_length=MAX_TEXT_LENGTH)]
