"""The webhooks face: each job's start and end POSTed to its `webhook_url` (or the
server's default), signed in the Standard Webhooks format, retried, and owed across a
restart until delivered or given up."""
