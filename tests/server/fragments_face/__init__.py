"""A delivery face of the tests' own, to show that a face is one folder and one line
in the config: `GET /v1/videos/{id}/fragments` lists each fragment of a job's video
with its facts, and `/healthz` counts the segments its listeners heard."""

from tests.server.fragments_face.face import FragmentsFace

__all__ = ["FragmentsFace"]
