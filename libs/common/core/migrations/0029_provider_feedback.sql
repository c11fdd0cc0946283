-- Provider feedback (docs/providers.md, "What a failure changes"): what a provider's error code changes.
--   contacts.undeliverable_at            the provider said the phone cannot receive (131026, Twilio 63003 and
--                                        21211): the contact's follow-ups stopped, no more go out
--   contacts.marketing_limited_until     the provider refused a marketing message for the user's own limit
--                                        (131049): the contact's marketing follow-ups wait until then
--   message_status_events.action         what the engine did about a status (a reason code and its detail:
--                                        the message's timeline shows it)
--   followup_instance_pacing.widened_gap_ms / widened_at
--                                        the number's pacing gap widened by a rate limit (130429) and when;
--                                        it recovers by halves (libs/common/followups/pacing.py)
-- followup_settings.min_recipient_gap_seconds    the least time between two messages to one contact (6 s:
--                                        WhatsApp's pace per user), across sequences, rules and one-offs
-- followup_settings.max_per_contact_day   the most marketing messages to one contact per calendar day in its
--                                        zone (max_per_contact_24h's twin), over every message the engine makes
-- followup_settings.message_prices       the project's price of a template message by category (a sequence's
--                                        monthly spend in its statistics)
ALTER TABLE followup_settings ADD COLUMN min_recipient_gap_seconds integer NOT NULL DEFAULT 6,
    ADD COLUMN max_per_contact_day integer CHECK (max_per_contact_day > 0),
    ADD COLUMN message_prices jsonb;
ALTER TABLE contacts ADD COLUMN undeliverable_at timestamptz,
    ADD COLUMN marketing_limited_until timestamptz;
ALTER TABLE message_status_events ADD COLUMN action text;
ALTER TABLE followup_instance_pacing ADD COLUMN widened_gap_ms integer NOT NULL DEFAULT 0,
    ADD COLUMN widened_at timestamptz;

-- Portfolios (a business portfolio's messaging limit, shared by its numbers): its tier (a setting, or what
-- a number.quality_changed / portfolio.tier_changed platform event said), each number's portfolio, the
-- unique recipients of business-initiated conversations it opened in the last 24 h (one row a recipient,
-- its last opening), and how many it opened each hour by number (what the limit counts: at most 25 rows a
-- number, never a count over messages).
CREATE TABLE portfolios (
    project_id  uuid NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    id          uuid NOT NULL DEFAULT gen_random_uuid(),
    name        text NOT NULL,
    tier        text NOT NULL DEFAULT 'tier_250'
                CHECK (tier IN ('tier_250', 'tier_1k', 'tier_10k', 'tier_100k', 'tier_unlimited')),
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL,
    PRIMARY KEY (project_id, id)
);
ALTER TABLE numbers ADD COLUMN portfolio_id uuid,
    ADD CONSTRAINT numbers_portfolio_fkey FOREIGN KEY (project_id, portfolio_id)
        REFERENCES portfolios (project_id, id) ON DELETE SET NULL (portfolio_id);
CREATE TABLE portfolio_recipients (
    project_id    uuid NOT NULL,
    portfolio_id  uuid NOT NULL,
    contact_id    uuid NOT NULL,
    opened_at     timestamptz NOT NULL,
    PRIMARY KEY (project_id, portfolio_id, contact_id),
    FOREIGN KEY (project_id, portfolio_id) REFERENCES portfolios (project_id, id) ON DELETE CASCADE
);
CREATE TABLE portfolio_openings (
    project_id    uuid NOT NULL,
    portfolio_id  uuid NOT NULL,
    hour          timestamptz NOT NULL,
    number_id     uuid NOT NULL,
    opened        integer NOT NULL,
    PRIMARY KEY (project_id, portfolio_id, hour, number_id),
    FOREIGN KEY (project_id, portfolio_id) REFERENCES portfolios (project_id, id) ON DELETE CASCADE
);
