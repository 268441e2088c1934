"""Across machines: decoder replicas on Ray Serve, and any front end serves any job.

`vaecast serve --ray ADDRESS` joins a Ray cluster (`connect`), deploys the decoder
replicas (`replica`: a Serve deployment whose streaming `decode` runs the one
pipeline, `vaecast.pipeline.run.run_pipeline`, for one job) and serves the same HTTP API
with the server's job manager built on runners whose jobs live in the cluster
(`runners`; each front end's copy of a job is a `mirror`).

The design, and why:
- A job lives in the cluster, not in one front end: a `SharedJob` kept by one of a few
  named, detached `JobHost` actors (`job_host`, `shared_job`; the job's id names its host) owns its
  record (`vaecast.job.record`, as every job has) and its fragments (in Ray's object
  store), and calls the replica itself, so a front end that dies takes no job with it,
  and a request for any job can land on any front end.
- Front ends keep a local mirror of each job they serve (a server Job whose runner
  applies the host's record transitions and fragments, by long polls of its host):
  every route reads the same structures as in a single process, so /content (live,
  finished, Range), /events, HLS and DELETE need no second implementation, and two
  front ends send byte-identical streams.
- The replica streams records through Serve's streaming handle; cancelling the call
  (DELETE, the client of a stream gone) cancels the replica's pipeline task, which
  stops the decoder at its next chunk. Serve's `max_ongoing_requests` bounds the
  decodes per replica and queues the rest; the relay in each replica, the push block
  queue of each job and the bridge in each pipeline are bounded.
- The records that cross processes (`records`) hold builtins and numpy only, so a
  job host never imports torch or PyAV.
- Hosts rather than an actor per job: an actor is a process, which takes seconds to
  start (and import Ray Serve) on a loaded node, all of it added to each job's time
  to first fragment, and some 150 MB each. The hosts start with the first front
  end; the price is coarser faults: a host that dies loses its share of the jobs.

Nothing here is imported unless `--ray` is given.
"""
