"""The retention service: periodic clean-up on a cron schedule (periodiq)."""
