"""The one place cost is computed: prices by model name, cached input apart, unknown models."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.config import load_config
from sim.llm.budget import Cost, Price, find_price, price_usage
from sim.llm.types import Usage
from sim.ticklog.books import attempts_cost
from sim.ticklog.records import AttemptRecord, TokenCounts

PRICES = {"gpt-4.1-mini": Price(input=0.4, cached_input=0.1, output=1.6)}


def test_cached_input_is_priced_apart() -> None:
    cost = price_usage(Usage(1_000_000, 1_000_000, 400_000), "gpt-4.1-mini", PRICES)
    assert cost.value == pytest.approx(0.6 * 0.4 + 0.4 * 0.1 + 1.6)


def test_a_dated_snapshot_uses_the_undated_price_unless_it_has_its_own() -> None:
    assert find_price(PRICES, "gpt-4.1-mini-2025-04-14") == PRICES["gpt-4.1-mini"]
    own = {**PRICES, "gpt-4.1-mini-2025-04-14": Price(1.0, 1.0, 1.0)}
    assert find_price(own, "gpt-4.1-mini-2025-04-14") == Price(1.0, 1.0, 1.0)
    assert find_price(PRICES, "gpt-4.1") is None


def test_a_model_without_a_price_makes_the_cost_unknown_not_zero() -> None:
    cost = price_usage(Usage(100, 10), "mystery", PRICES)
    assert cost.value is None and cost.text() == "unknown" and cost.unpriced == {"mystery"}
    mixed = attempts_cost(
        [
            AttemptRecord(model="gpt-4.1-mini", usage=TokenCounts(input_tokens=100)),
            AttemptRecord(model="mystery", usage=TokenCounts(input_tokens=100)),
        ],
        PRICES,
    )
    assert not mixed.known and mixed.usd > 0
    assert price_usage(Usage(), "mystery", PRICES) == Cost()  # no tokens cost nothing


def test_config_prices_work_and_offline_is_free(tmp_path: Path) -> None:
    prices = load_config(None, None, cwd=tmp_path).prices  # the built-in defaults
    assert find_price(prices, "gpt-4.1-mini") == Price(0.4, 0.1, 1.6)
    assert price_usage(Usage(5000, 500), "offline", prices).value == 0.0
