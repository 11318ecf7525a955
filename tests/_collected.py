"""The test files this pytest run's collection reached (a test collected, or the file skipped at import): filled
by conftest.py's ``pytest_collectreport``, read by tests/unit/test_collection.py when the run collected the whole
suite."""

FILES: set = set()
