"""The send-lane service: sends queued messages through the providers (WhatsApp Cloud API, Twilio)."""
