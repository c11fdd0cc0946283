-- Rows of every kind the 0012 schema had, of two projects (q holds a contact, a sequence with its version and
-- an enrollment; p everything else), with their ids as named parameters: what
-- tests/test_migrate.py::test_a_0012_database_keeps_every_row_its_project_and_its_relationships migrates.
INSERT INTO projects (id, name) VALUES (%(p)s, 'p'), (%(q)s, 'q');
INSERT INTO api_keys (id, project_id, prefix, key_hash) VALUES (%(key)s, %(p)s, 'fu_abcde', '\x01');
INSERT INTO numbers (id, project_id, phone, is_default) VALUES (%(number)s, %(p)s, '+15550001000', true);
INSERT INTO contacts (id, project_id, phone, tags)
VALUES (%(contact)s, %(p)s, '+15550000001', '{vip}'), (%(silent)s, %(p)s, '+15550000002', '{}'),
       (%(theirs)s, %(q)s, '+15550000001', '{}');
INSERT INTO conversations (id, project_id, contact_id, number_id)
VALUES (%(conversation)s, %(p)s, %(contact)s, %(number)s);
INSERT INTO leads (id, project_id, contact_id) VALUES (%(lead)s, %(p)s, %(contact)s);
INSERT INTO deals (id, project_id, contact_id, lead_id, stage) VALUES (%(deal)s, %(p)s, %(contact)s, %(lead)s, 'won');
INSERT INTO followup_sequences (id, project_id, name, draft, status)
VALUES (%(sequence)s, %(p)s, 's', %(definition)s, 'active'), (%(their_sequence)s, %(q)s, 't', %(definition)s, 'active');
INSERT INTO followup_sequence_versions (id, project_id, sequence_id, definition, step_count)
VALUES (%(version)s, %(p)s, %(sequence)s, %(definition)s, 1), (%(one_off)s, %(p)s, NULL, %(definition)s, 1),
       (%(their_version)s, %(q)s, %(their_sequence)s, %(definition)s, 1);
UPDATE followup_sequences SET current_version_id = CASE id WHEN %(sequence)s THEN %(version)s::uuid
                                                           ELSE %(their_version)s::uuid END;
INSERT INTO followup_enrollments (id, project_id, sequence_id, version_id, contact_id, conversation_id, number_id,
                                  next_run_at, enrolled_at, updated_at, dedupe_key)
VALUES (%(enrollment)s, %(p)s, %(sequence)s, %(version)s, %(contact)s, %(conversation)s, %(number)s, %(at)s,
        %(at)s, %(at)s, 'a'),
       (%(one_off_enrollment)s, %(p)s, NULL, %(one_off)s, %(silent)s, NULL, NULL, %(at)s, %(at)s, %(at)s, 'b'),
       (%(their_enrollment)s, %(q)s, %(their_sequence)s, %(their_version)s, %(theirs)s, NULL, NULL, %(at)s,
        %(at)s, %(at)s, 'a');
INSERT INTO messages (id, project_id, contact_id, conversation_id, number_id, direction, status, source,
                      followup_enrollment_id, followup_step_index)
VALUES (%(queued)s, %(p)s, %(contact)s, %(conversation)s, %(number)s, 'outbound', 'QUEUED', 'followup',
        %(enrollment)s, 0),
       (%(inbound)s, %(p)s, %(contact)s, %(conversation)s, NULL, 'inbound', 'RECEIVED', 'contact', NULL, NULL);
INSERT INTO message_status_events (project_id, message_id, status, occurred_at)
VALUES (%(p)s, %(queued)s, 'QUEUED', %(at)s), (%(p)s, %(queued)s, 'PROCESSING', %(at)s);
INSERT INTO followup_step_runs (enrollment_id, step_index, project_id, outcome, message_id, due_at, ran_at)
VALUES (%(enrollment)s, 0, %(p)s, 'queued', %(queued)s, %(at)s, %(at)s),
       (%(enrollment)s, 1, %(p)s, 'skipped', NULL, %(at)s, %(at)s);
INSERT INTO activities (project_id, contact_id, kind, occurred_at) VALUES (%(p)s, %(contact)s, 'note', %(at)s);
INSERT INTO followup_settings (project_id, retention_days) VALUES (%(p)s, 30);
INSERT INTO followup_instance_pacing (number_id, project_id, next_release_at) VALUES (%(number)s, %(p)s, %(at)s);
INSERT INTO usage_counters (project_id, month, shard, messages) VALUES (%(p)s, '2030-01-01', 3, 1);
INSERT INTO outbox (project_id, type, aggregate_type, aggregate_id, data, occurred_at)
VALUES (%(p)s, 'message.queued', 'message', %(queued)s, '{}', %(at)s);
INSERT INTO ai_budget_ledger (project_id, kind, tokens, reference_id, occurred_at)
VALUES (%(p)s, 'followup', 12, %(enrollment)s, %(at)s);
INSERT INTO rules (id, project_id, name, event, actions) VALUES (%(rule)s, %(p)s, 'r', 'message.received', '[]');
INSERT INTO followup_triggers (project_id, type, contact_id, conversation_id, occurred_at, next_attempt_at)
VALUES (%(p)s, 'message.received', %(contact)s, %(conversation)s, %(at)s, %(at)s);
INSERT INTO rule_runs (trigger_id, rule_id, project_id, outcome, ran_at)
SELECT id, %(rule)s, %(p)s, 'scheduled', %(at)s FROM followup_triggers;
INSERT INTO rule_pending_executions (id, project_id, rule_id, conversation_id, contact_id, trigger_id, episode_key,
                                     due_at)
SELECT %(execution)s, %(p)s, %(rule)s, %(conversation)s, %(contact)s, id, 'event:1', %(at)s FROM followup_triggers;
INSERT INTO webhook_deliveries (id, project_id, rule_id, trigger_id, url, payload, created_at, updated_at)
SELECT %(delivery)s, %(p)s, %(rule)s, id, 'https://example.com', '{}', %(at)s, %(at)s FROM followup_triggers;
INSERT INTO followup_bulk_jobs (id, project_id, sequence_id) VALUES (%(job)s, %(p)s, %(sequence)s);
INSERT INTO followup_bulk_job_items (job_id, position, contact_id, phone, outcome)
VALUES (%(job)s, 1, %(contact)s, NULL, 'enrolled'), (%(job)s, 2, NULL, '+15550009999', NULL);
INSERT INTO followup_campaigns (id, project_id, sequence_id, created_at, updated_at)
VALUES (%(campaign)s, %(p)s, %(sequence)s, %(at)s, %(at)s)
