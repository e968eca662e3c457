from __future__ import annotations

import pytest

from runbook_lib.errors import CompatibilityError, PermanentError
from runbook_lib.model.versions import (
    TalosVersion,
    chart_is_newer,
    check_extension_tags,
    parse_kmod_tag,
    parse_toolkit_tag,
    require_matching_tags,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("v1.12.7", "v1.12.7"), ("1.12.7", "v1.12.7"), ("v1.12", "v1.12"), ("v1.12.0-beta.0", "v1.12.0-beta.0")],
)
def test_talos_versions_parse_and_print(text, expected):
    assert str(TalosVersion.parse(text)) == expected


@pytest.mark.parametrize("bad", ["1.12.x", "latest", "v1", "", "v1.12.0-foo", "1.12.7.1"])
def test_malformed_talos_versions_are_rejected_with_the_expected_form(bad):
    with pytest.raises(PermanentError) as err:
        TalosVersion.parse(bad)
    assert "vMAJOR.MINOR.PATCH" in str(err.value)


def test_prerelease_orders_before_release_and_minors_numerically():
    assert TalosVersion.parse("v1.12.0-beta.0") < TalosVersion.parse("v1.12.0")
    assert TalosVersion.parse("v1.9.5") < TalosVersion.parse("v1.10.0")
    assert TalosVersion.parse("v1.12.0-beta.0").at_least(1, 12)


def test_kmod_and_toolkit_tags_split_as_in_the_facts_examples():
    assert parse_kmod_tag("580.95.05-v1.12.0-beta.0") == ("580.95.05", TalosVersion.parse("v1.12.0-beta.0"))
    assert parse_toolkit_tag("580.95.05-v1.18.0") == ("580.95.05", "v1.18.0")
    with pytest.raises(PermanentError):
        parse_kmod_tag("580.95.05")  # the fabricmanager form names no Talos version
    with pytest.raises(PermanentError):
        parse_toolkit_tag("latest")


def test_matching_tags_for_the_node_pass():
    result = check_extension_tags("570.211.01-v1.12.7", "570.211.01-v1.18.2", "v1.12.7")
    assert result.ok and result.driver == "570.211.01"


def test_driver_mismatch_names_both_drivers_and_what_would_fit():
    result = check_extension_tags("580.105.08-v1.12.7", "570.195.03-v1.18.1", "v1.12.7")
    assert not result.ok
    (problem,) = result.problems
    assert "580.105.08" in problem and "570.195.03" in problem
    assert "580.105.08-v1.18.1" in problem  # the toolkit tag that would fit


def test_kmod_built_for_another_talos_release_says_which_tag_fits():
    result = check_extension_tags("580.105.08-v1.12.6", "580.105.08-v1.18.1", "v1.12.7")
    (problem,) = result.problems
    assert "built for Talos v1.12.6" in problem and "580.105.08-v1.12.7" in problem


def test_both_problems_reported_together_and_raised_as_compatibility_error():
    assert len(check_extension_tags("1.2.3-v1.11.0", "4.5.6-v1.18.0", "v1.12.0").problems) == 2
    with pytest.raises(CompatibilityError):
        require_matching_tags("1.2.3-v1.11.0", "4.5.6-v1.18.0", "v1.12.0")


@pytest.mark.parametrize(
    ("installed", "planned", "newer"),
    [
        ("v26.7.0", "v26.3.3", True),  # the GPU Operator chart NVIDIA publishes after the one Talos CI pins
        ("0.18.0", "0.17.2", True),
        ("0.18.0", "0.18.0", False),
        ("v26.3.3", "26.3.3", False),  # helm reads both spellings as one version
        ("0.18.0-rc.1", "0.18.0", False),  # a pre-release comes before its release (semver.org §11)
        ("26.3.3-1", "26.3.3", False),  # PEP 440 would read this as a post-release, after 26.3.3
        ("0.17.0-ubi8", "0.17.0", False),  # a suffix PEP 440 refuses to parse at all
        ("1.0.0-alpha.10", "1.0.0-alpha.9", True),  # numeric identifiers compare as numbers
        ("1.0.0-alpha.1", "1.0.0-alpha.beta", False),  # numbers before words
    ],
)
def test_chart_versions_compare_as_helm_orders_them(installed, planned, newer):
    assert chart_is_newer(installed, planned) is newer


def test_a_chart_version_constraint_is_not_compared():
    # helm --version takes a constraint; the runbook leaves it to helm instead of refusing it
    assert chart_is_newer("26.3.3", ">=26.3.1") is None
