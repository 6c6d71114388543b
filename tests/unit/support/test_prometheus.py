"""Reading samples out of Prometheus' text exposition format (``tests/support/prometheus.py``)."""

from __future__ import annotations

import pytest

from tests.support.prometheus import parse, total, value

TEXT = """# HELP gateway_requests_total HTTP requests answered.
# TYPE gateway_requests_total counter
gateway_requests_total{method="GET",route="/health/live",status="200"} 3.0
gateway_requests_total{method="POST",route="/v1/completions",status="200"} 5.0
gateway_requests_total{method="POST",route="/v1/completions",status="503"} 2.0
# HELP gateway_requests_in_flight Requests being answered.
# TYPE gateway_requests_in_flight gauge
gateway_requests_in_flight 1.0
gateway_requests_in_flight_peak 7.0
# TYPE gateway_time_to_first_token_seconds histogram
gateway_time_to_first_token_seconds_bucket{le="0.1",model="tiny"} 4.0
gateway_time_to_first_token_seconds_bucket{le="1.0",model="tiny"} 9.0
gateway_time_to_first_token_seconds_bucket{le="+Inf",model="tiny"} 10.0
gateway_time_to_first_token_seconds_count{model="tiny"} 10.0
gateway_time_to_first_token_seconds_sum{model="tiny"} 2.5

tenant_note{tenant="say \\"hi\\", then go",note="a\\\\b\\nc"} 1
"""


def test_parse_reads_names_labels_and_values() -> None:
    samples = parse(TEXT)
    assert len(samples) == 11
    assert samples[0] == (
        "gateway_requests_total",
        {"method": "GET", "route": "/health/live", "status": "200"},
        3.0,
    )
    assert samples[3:5] == [
        ("gateway_requests_in_flight", {}, 1.0),
        ("gateway_requests_in_flight_peak", {}, 7.0),
    ]
    bucket = "gateway_time_to_first_token_seconds_bucket"
    assert samples[7] == (bucket, {"le": "+Inf", "model": "tiny"}, 10.0)
    assert samples[9] == ("gateway_time_to_first_token_seconds_sum", {"model": "tiny"}, 2.5)


def test_parse_unescapes_quotes_commas_backslashes_and_newlines_in_label_values() -> None:
    (_, labels, number) = parse(TEXT)[-1]
    assert labels == {"tenant": 'say "hi", then go', "note": "a\\b\nc"}
    assert number == 1.0


def test_value_is_the_one_sample_whose_labels_include_those_asked() -> None:
    assert value(TEXT, "gateway_requests_total", method="GET") == 3.0
    assert value(TEXT, "gateway_requests_total", status="503") == 2.0
    assert value(TEXT, "gateway_time_to_first_token_seconds_bucket", le="1.0") == 9.0
    assert value(TEXT, "gateway_time_to_first_token_seconds_count", model="tiny") == 10.0
    assert value(TEXT, "tenant_note", tenant='say "hi", then go') == 1.0


def test_value_does_not_take_a_family_whose_name_starts_with_the_one_asked() -> None:
    assert value(TEXT, "gateway_requests_in_flight") == 1.0
    assert value(TEXT, "gateway_requests_in_flight_peak") == 7.0


@pytest.mark.parametrize(
    ("family", "labels"),
    [
        ("gateway_requests_total", {"method": "DELETE"}),
        ("gateway_requests", {}),
        ("gateway_rate_limited_total", {}),
        ("gateway_time_to_first_token_seconds_bucket", {"model": "other"}),
    ],
)
def test_value_names_the_family_and_labels_none_of_the_samples_has(
    family: str, labels: dict[str, str]
) -> None:
    with pytest.raises(AssertionError, match=f"0 samples of {family} {labels}"):
        value(TEXT, family, **labels)


def test_value_refuses_labels_that_several_samples_share() -> None:
    with pytest.raises(AssertionError, match="2 samples of gateway_requests_total"):
        value(TEXT, "gateway_requests_total", method="POST")


def test_total_sums_every_sample_whose_labels_include_those_asked() -> None:
    assert total(TEXT, "gateway_requests_total") == 10.0
    assert total(TEXT, "gateway_requests_total", method="POST") == 7.0
    assert total(TEXT, "gateway_requests_total", method="POST", status="503") == 2.0
    assert total(TEXT, "gateway_time_to_first_token_seconds_bucket", model="tiny") == 23.0
    assert total(TEXT, "gateway_requests_in_flight") == 1.0


def test_total_is_zero_for_a_missing_family_or_label_set() -> None:
    assert total(TEXT, "gateway_rate_limited_total") == 0.0
    assert total(TEXT, "gateway_requests_total", method="DELETE") == 0.0
    assert total(TEXT, "gateway_requests") == 0.0
