"""The release service: claim due enrollments, run the checks, queue the message, advance."""
