-- AI steps: a monthly token budget per project, and what each model call used.
ALTER TABLE followup_settings ADD COLUMN ai_monthly_token_budget bigint CHECK (ai_monthly_token_budget > 0);
ALTER TABLE ai_budget_ledger
    ALTER COLUMN tokens TYPE bigint,
    ADD COLUMN prompt_tokens      bigint NOT NULL DEFAULT 0,
    ADD COLUMN completion_tokens  bigint NOT NULL DEFAULT 0,
    ADD COLUMN outcome            text;
