from tests.server.conftest import start_server  # noqa: F401 (the fixture)
