"""The kit's test suite, a package so that its shared helpers import by name (`from tests.cluster import
staging`): pytest.ini puts the repository on the path."""
