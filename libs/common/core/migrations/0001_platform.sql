-- The platform core: the parts of the messaging platform the engine needs, owned here so it runs alone.
-- Every tenant table carries project_id, and every query filters on it.

CREATE TABLE projects (
    id                      uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    name                    text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    timezone                text NOT NULL DEFAULT 'UTC',
    -- plan: the entitlement the follow-ups engine checks (NULL = unlimited)
    plan_active             boolean NOT NULL DEFAULT true,
    max_active_enrollments  integer CHECK (max_active_enrollments >= 0),
    created_at              timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE api_keys (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    project_id  uuid NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    name        text NOT NULL DEFAULT 'default',
    prefix      text NOT NULL,
    key_hash    bytea NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz,
    CONSTRAINT api_keys_key_hash_key UNIQUE (key_hash)
);
CREATE INDEX api_keys_project_idx ON api_keys (project_id);

-- Sending instances (WhatsApp numbers).
CREATE TABLE numbers (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    project_id  uuid NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    phone       text NOT NULL,
    status      text NOT NULL DEFAULT 'connected' CHECK (status IN ('connected', 'disconnected')),
    is_default  boolean NOT NULL DEFAULT false,
    created_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT numbers_project_phone_key UNIQUE (project_id, phone)
);
CREATE UNIQUE INDEX numbers_one_default_idx ON numbers (project_id) WHERE is_default;

CREATE TABLE contacts (
    id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    project_id    uuid NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    phone         text,  -- E.164; NULL once erased
    name          text,
    timezone      text,  -- IANA name; NULL falls back to the project's
    attributes    jsonb NOT NULL DEFAULT '{}'::jsonb,
    tags          text[] NOT NULL DEFAULT '{}',
    opted_out_at  timestamptz,
    consent       text NOT NULL DEFAULT 'unknown' CHECK (consent IN ('unknown', 'granted', 'revoked')),
    erased_at     timestamptz,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT contacts_project_phone_key UNIQUE (project_id, phone)
);
CREATE INDEX contacts_tags_idx ON contacts USING gin (tags);

CREATE TABLE conversations (
    id                        uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    project_id                uuid NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    contact_id                uuid NOT NULL REFERENCES contacts (id) ON DELETE CASCADE,
    number_id                 uuid REFERENCES numbers (id) ON DELETE SET NULL,
    status                    text NOT NULL DEFAULT 'open'
                              CHECK (status IN ('open', 'pending', 'snoozed', 'resolved')),
    status_changed_at         timestamptz NOT NULL DEFAULT now(),
    waiting_since             timestamptz,
    priority                  text CHECK (priority IN ('low', 'medium', 'high', 'urgent')),
    assignee                  text,
    labels                    text[] NOT NULL DEFAULT '{}',
    inbox_thread              text,
    last_incoming_message_id  uuid,
    last_outgoing_message_id  uuid,
    last_incoming_at          timestamptz,
    last_outgoing_at          timestamptz,
    created_at                timestamptz NOT NULL DEFAULT now(),
    updated_at                timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX conversations_contact_idx ON conversations (contact_id, created_at DESC);
-- follow-ups thread into the contact's newest conversation that is not resolved
CREATE INDEX conversations_open_idx ON conversations (contact_id, created_at DESC) WHERE status <> 'resolved';

CREATE TABLE messages (
    id                      uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    project_id              uuid NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    contact_id              uuid NOT NULL REFERENCES contacts (id) ON DELETE CASCADE,
    conversation_id         uuid REFERENCES conversations (id) ON DELETE SET NULL,
    number_id               uuid REFERENCES numbers (id) ON DELETE SET NULL,
    direction               text NOT NULL CHECK (direction IN ('inbound', 'outbound')),
    status                  text NOT NULL CHECK (status IN
                            ('QUEUED', 'PROCESSING', 'SENT', 'DELIVERED', 'READ', 'FAILED', 'CANCELLED', 'RECEIVED')),
    source                  text NOT NULL CHECK (source IN
                            ('contact', 'human', 'followup', 'rule', 'campaign', 'api')),
    priority                smallint NOT NULL DEFAULT 5,
    body                    text,
    media_url               text,
    media_kind              text CHECK (media_kind IN ('image', 'video', 'audio', 'document')),
    provider_message_id     text,
    -- deliberately no foreign key: retention deletes messages and enrollments independently
    followup_enrollment_id  uuid,
    followup_step_index     integer,
    error                   text,
    created_at              timestamptz NOT NULL DEFAULT now(),
    status_changed_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX messages_conversation_idx ON messages (conversation_id, created_at);
CREATE INDEX messages_contact_idx ON messages (contact_id, created_at);
CREATE UNIQUE INDEX messages_provider_id_idx ON messages (project_id, provider_message_id)
    WHERE provider_message_id IS NOT NULL;
-- the send lane claims QUEUED outbound messages by priority, then age
CREATE INDEX messages_send_queue_idx ON messages (priority, created_at) WHERE status = 'QUEUED';
-- the stop paths cancel a contact's follow-up messages still waiting for the send lane
CREATE INDEX messages_queued_contact_idx ON messages (contact_id) WHERE status = 'QUEUED';
CREATE INDEX messages_enrollment_idx ON messages (followup_enrollment_id)
    WHERE followup_enrollment_id IS NOT NULL;

CREATE TABLE message_status_events (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    project_id   uuid NOT NULL,
    message_id   uuid NOT NULL REFERENCES messages (id) ON DELETE CASCADE,
    status       text NOT NULL,
    detail       text,
    occurred_at  timestamptz NOT NULL
);
CREATE INDEX message_status_events_message_idx ON message_status_events (message_id);

CREATE TABLE activities (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    project_id   uuid NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    contact_id   uuid REFERENCES contacts (id) ON DELETE CASCADE,
    kind         text NOT NULL,
    data         jsonb NOT NULL DEFAULT '{}'::jsonb,
    occurred_at  timestamptz NOT NULL
);
CREATE INDEX activities_contact_idx ON activities (contact_id, occurred_at);

CREATE TABLE usage (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    project_id   uuid NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    kind         text NOT NULL,
    quantity     integer NOT NULL DEFAULT 1,
    message_id   uuid,
    occurred_at  timestamptz NOT NULL
);
CREATE INDEX usage_project_month_idx ON usage (project_id, kind, occurred_at);

CREATE TABLE leads (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    project_id  uuid NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    contact_id  uuid NOT NULL REFERENCES contacts (id) ON DELETE CASCADE,
    status      text NOT NULL DEFAULT 'open',
    closed_at   timestamptz,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX leads_contact_idx ON leads (contact_id);

CREATE TABLE deals (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    project_id  uuid NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    contact_id  uuid NOT NULL REFERENCES contacts (id) ON DELETE CASCADE,
    lead_id     uuid REFERENCES leads (id) ON DELETE SET NULL,
    stage       text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX deals_contact_idx ON deals (contact_id);

-- Transactional outbox: domain events written in the transaction that caused them, relayed in id order.
CREATE TABLE outbox (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    project_id      uuid NOT NULL,
    event_id        uuid NOT NULL DEFAULT gen_random_uuid(),
    type            text NOT NULL,
    aggregate_type  text NOT NULL,
    aggregate_id    uuid NOT NULL,
    data            jsonb NOT NULL,
    occurred_at     timestamptz NOT NULL,
    published_at    timestamptz
);
CREATE INDEX outbox_unpublished_idx ON outbox (id) WHERE published_at IS NULL;
