-- Channels (issue 31): the provider each sending number sends through (WhatsApp Cloud API or Twilio), its
-- provider ids and its credentials (write-only through the API: never returned, never logged), and the
-- send lane's state of each message it claimed (one row from the claim until the provider's answer is
-- recorded, or, for an answer lost after the request went out, until a status reconciles it).

CREATE TABLE channel_numbers (
    project_id uuid NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    number_id uuid NOT NULL REFERENCES numbers (id) ON DELETE CASCADE,
    provider text NOT NULL CHECK (provider IN ('whatsapp_cloud', 'twilio')),
    -- WhatsApp Cloud API: the Graph phone-number id; Twilio: the account SID
    account_id text NOT NULL,
    -- Twilio: the sender (whatsapp:+E164) or a messaging service SID (MG...); WhatsApp: null
    sender text,
    -- the provider's secrets: {access_token, app_secret, verify_token} | {auth_token}
    credentials jsonb NOT NULL,
    -- round-robin of the send lane's claims across numbers (the least recently served first)
    served_at timestamptz,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    PRIMARY KEY (project_id, number_id)
);

-- A provider's webhook names the number in its path: the lookup that authenticates it (by signature)
CREATE UNIQUE INDEX channel_numbers_number_idx ON channel_numbers (number_id);

CREATE TABLE channel_sends (
    project_id uuid NOT NULL,
    message_id uuid NOT NULL,
    number_id uuid NOT NULL,
    -- sending: the request is (or may be) out, leased until next_attempt_at; retry: it never reached the
    -- provider, due again at next_attempt_at; unconfirmed: its answer was lost, waiting for a status (or
    -- the message's lifetime, next_attempt_at)
    state text NOT NULL CHECK (state IN ('sending', 'retry', 'unconfirmed')),
    attempts integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    last_error text,
    PRIMARY KEY (project_id, message_id)
);

CREATE INDEX channel_sends_in_flight_idx ON channel_sends (project_id, number_id) WHERE state = 'sending';
CREATE INDEX channel_sends_due_idx ON channel_sends (next_attempt_at);

-- The provider's error code of a FAILED message (docs/providers.md lists them), beside its text.
ALTER TABLE messages ADD COLUMN error_code text;

-- The send lane claims number by number (fair across numbers and projects, bounded per number).
CREATE INDEX messages_queued_number_idx ON messages (project_id, number_id, priority, created_at)
    WHERE status = 'QUEUED' AND direction = 'outbound';
