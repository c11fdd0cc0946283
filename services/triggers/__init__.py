"""The triggers service: rule trigger matching, segment conditions, bulk jobs and the delayed-rule sweep."""
