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
ALTER TABLE followup_settings ADD COLUMN min_recipient_gap_seconds integer NOT NULL DEFAULT 6,
    ADD COLUMN max_per_contact_day integer CHECK (max_per_contact_day > 0);
ALTER TABLE contacts ADD COLUMN undeliverable_at timestamptz,
    ADD COLUMN marketing_limited_until timestamptz;
ALTER TABLE message_status_events ADD COLUMN action text;
ALTER TABLE followup_instance_pacing ADD COLUMN widened_gap_ms integer NOT NULL DEFAULT 0,
    ADD COLUMN widened_at timestamptz;
