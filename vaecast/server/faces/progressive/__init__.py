"""The progressive face: a job's fragmented MP4 over plain HTTP while it decodes, then
as a file. `content` has the rules of a request, `broadcast` sends each new segment to
every caught-up viewer in one batch, `fanout_sender` makes those sends on a thread of
their own, `routes` is the HTTP plumbing and `face` what the app builds."""
