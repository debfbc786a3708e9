"""The conformance suite (clients/conformance/scenarios.json), run with the threaded client."""

import pytest

from scenarios import SCENARIOS, Run


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s["name"] for s in SCENARIOS])
def test_scenario(testbed, scenario):
    Run(testbed, scenario).run()
