"""Per-run caps on tokens and on cost, with reservation before sending.

Each attempt reserves its worst case (estimated input + ``max_output_tokens``) before it is
sent and settles to the real usage afterwards, so a parallel batch can never overshoot a
cap: once spent + reserved + the next estimate would cross it, further calls fail with
``LLMBudgetExceededError`` and the runner does not commit the tick.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sim.llm.errors import LLMBudgetExceededError, LLMConfigurationError, LLMError
from sim.llm.tokens import estimate_tokens
from sim.llm.types import Adapter, AdapterResponse, ModelRequest, Usage
from sim.llm.wrapper import AdapterWrapper

#: what a call sent through the Batch API is charged, as a fraction of the list price (here,
#: not in ``sim.providers.batch``, so pricing a log never imports the OpenAI SDK)
BATCH_PRICE_FACTOR = 0.5


@dataclass(frozen=True, slots=True)
class Price:
    """US dollars per million tokens."""

    input: float = 0.0
    cached_input: float = 0.0
    output: float = 0.0

    def scaled(self, factor: float) -> Price:
        """This price times ``factor`` (the Batch API's discount)."""
        if factor == 1.0:
            return self
        return Price(self.input * factor, self.cached_input * factor, self.output * factor)


def cost_usd(usage: Usage, price: Price) -> float:
    """The one cost formula: uncached input, cached input and output at their prices."""
    cached = min(usage.cached_input_tokens, usage.input_tokens)
    return (
        (usage.input_tokens - cached) * price.input
        + cached * price.cached_input
        + usage.output_tokens * price.output
    ) / 1_000_000


def priced_model(answers_as: str, model: str) -> str:
    """The model a call to ``model`` is priced as on an endpoint whose kind answers under
    one model name whatever was asked (``ProviderProfile.answers_as``: the offline
    provider answers as ``offline``, priced as ``[prices."offline"]``, $0 by default)
    rather than at the price of the model a phase names; ``""``: as ``model``."""
    return answers_as or model


#: a dated snapshot: OpenAI's ``-2025-04-14`` or Anthropic's ``-20251001``
_SNAPSHOT = re.compile(r"^(?P<base>.+)-(?:\d{4}-\d{2}-\d{2}|\d{8})$")


def find_price(prices: Mapping[str, Any], model: str, provider: str = "") -> Price | None:
    """A model's price from a price table, or ``None`` when the table has none.

    A price for the model on its provider (``[prices."local/qwen2.5-7b"]``) wins over the
    model's own (``[prices."qwen2.5-7b"]``): the same model may cost differently, or
    nothing, on another endpoint. Providers often answer with a dated snapshot name
    (``gpt-4.1-mini-2025-04-14``, ``claude-haiku-4-5-20251001``) for the model asked for
    (``gpt-4.1-mini``): an exact entry wins, else the undated name's. The table's values
    may be ``Price`` or anything with ``input``, ``cached_input`` and ``output`` (the
    config's ``[prices]`` entries).
    """
    names = [model]
    if match := _SNAPSHOT.match(model):
        names.append(match["base"])
    keys = [f"{provider}/{name}" for name in names] if provider else []
    found = None
    for key in (*keys, *names):
        found = prices.get(key)
        if found is not None:
            break
    if found is None or isinstance(found, Price):
        return found
    return Price(float(found.input), float(found.cached_input), float(found.output))


@dataclass(frozen=True, slots=True)
class Cost:
    """A sum of money, and the models whose tokens it could not price.

    A cost with unpriced models is *unknown*: ``usd`` is then only what the priced part
    cost, and ``value`` is ``None``. Reports say "unknown" rather than show a number that
    leaves tokens out.
    """

    usd: float = 0.0
    unpriced: frozenset[str] = frozenset()

    @property
    def known(self) -> bool:
        return not self.unpriced

    @property
    def value(self) -> float | None:
        return round(self.usd, 8) if self.known else None

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.usd + other.usd, self.unpriced | other.unpriced)

    def text(self, digits: int = 4) -> str:
        return f"${self.usd:.{digits}f}" if self.known else "unknown"


def price_usage(
    usage: Usage,
    model: str,
    prices: Mapping[str, Any],
    cache: dict[str, Price | None] | None = None,
    provider: str = "",
    factor: float = 1.0,
) -> Cost:
    """What ``usage`` of ``model`` on ``provider`` cost at ``prices`` (no tokens cost
    nothing, priced or not).

    ``cache`` keeps each model's price once looked up (for callers pricing every call);
    ``factor`` scales the price (``BATCH_PRICE_FACTOR`` for a call sent in a batch).
    """
    if usage.total_tokens == 0:
        return Cost()
    key = f"{provider}/{model}" if provider else model
    if cache is None:
        price = find_price(prices, model, provider)
    elif key in cache:
        price = cache[key]
    else:
        price = cache[key] = find_price(prices, model, provider)
    if price is None:  # named as [prices] takes it for every provider
        return Cost(0.0, frozenset({model}))
    return Cost(cost_usd(usage, price.scaled(factor)))


def estimate_usage(request: ModelRequest) -> Usage:
    """The worst case of one attempt: its estimated input and all its output tokens."""
    tokens = estimate_tokens(request.instructions) + estimate_tokens(request.input)
    for exchange in request.history:
        tokens += estimate_tokens(exchange.input) + estimate_tokens(exchange.output)
    for message in request.messages:  # a tool conversation's calls and answers
        tokens += estimate_tokens(message.model_dump_json(exclude_none=True))
    return Usage(input_tokens=tokens, output_tokens=request.settings.max_output_tokens)


@dataclass(slots=True)
class Reservation:
    model: str
    tokens: int
    usd: float
    provider: str = ""
    #: the price factor the attempt is charged at (the Batch API's discount)
    factor: float = 1.0


class Budget:
    """Token and cost caps for one run (``None``: no cap), shared by every call.

    Args:
        max_total_tokens: cap on input + output tokens.
        max_cost_usd: cap on cost; needs a price for every model used.
        prices: price per model name.
    """

    def __init__(
        self,
        max_total_tokens: int | None = None,
        max_cost_usd: float | None = None,
        prices: Mapping[str, Price] | None = None,
    ) -> None:
        self.max_total_tokens = max_total_tokens
        self.max_cost_usd = max_cost_usd
        self.prices = dict(prices or {})
        #: each (model, provider)'s price, looked up once: every attempt is priced twice
        self._found: dict[tuple[str, str], Price | None] = {}
        self.spent_tokens = 0
        self.spent_usd = 0.0
        self.reserved_tokens = 0
        self.reserved_usd = 0.0

    def price(self, model: str, provider: str = "") -> Price:
        """The price of ``model`` on ``provider`` (nothing: free, unless a cost cap needs one).

        Raises:
            LLMConfigurationError: a cost cap is set and the model has no price.
        """
        key = (model, provider)
        if key in self._found:
            price = self._found[key]
        else:
            price = self._found[key] = find_price(self.prices, model, provider)
        if price is None:
            if self.max_cost_usd is not None:
                where = f" on {provider!r}" if provider else ""
                raise LLMConfigurationError(
                    f"no price for model {model!r}{where} while [budget] max_cost_usd is set; "
                    f'add [prices."{model}"] input/cached_input/output to config.toml'
                )
            return Price()
        return price

    def summary(self) -> str:
        caps = []
        if self.max_total_tokens is not None:
            caps.append(f"{self.max_total_tokens:,} tokens")
        if self.max_cost_usd is not None:
            caps.append(f"${self.max_cost_usd:.4f}")
        return f"spent {self.spent_tokens:,} tokens (${self.spent_usd:.4f})" + (
            f" of a cap of {' / '.join(caps)}" if caps else ""
        )

    def reserve(
        self, model: str, estimate: Usage, provider: str = "", factor: float = 1.0
    ) -> Reservation:
        """Hold an attempt's worst case (at ``factor`` times the price of ``model`` on
        ``provider``).

        Raises:
            LLMBudgetExceededError: the attempt could cross a cap.
            LLMConfigurationError: a cost cap is set and the model has no price.
        """
        usd = cost_usd(estimate, self.price(model, provider).scaled(factor))
        tokens = estimate.total_tokens
        if self.max_total_tokens is not None and (
            self.spent_tokens + self.reserved_tokens + tokens > self.max_total_tokens
        ):
            raise self._reached("token", f"needing up to {tokens:,}", model)
        if self.max_cost_usd is not None and (
            self.spent_usd + self.reserved_usd + usd > self.max_cost_usd
        ):
            raise self._reached("cost", f"costing up to ${usd:.4f}", model)
        self.reserved_tokens += tokens
        self.reserved_usd += usd
        return Reservation(model, tokens, usd, provider, factor)

    def _reached(self, cap: str, call: str, model: str) -> LLMBudgetExceededError:
        """The refusal of a call (``call``: what it could need) that could cross the
        ``cap`` ("token" or "cost") budget."""
        return LLMBudgetExceededError(
            f"{cap} budget reached: {self.summary()}; a call {call} more was not sent",
            model=model,
        )

    def settle(self, reservation: Reservation, usage: Usage) -> None:
        """Release a reservation and count what the attempt really used."""
        self.reserved_tokens -= reservation.tokens
        self.reserved_usd -= reservation.usd
        self.spent_tokens += usage.total_tokens
        price = self.price(reservation.model, reservation.provider)
        self.spent_usd += cost_usd(usage, price.scaled(reservation.factor))


class BudgetAdapter(AdapterWrapper):
    """Wraps an adapter: every attempt reserves before it is sent and settles after.

    Placed directly around the provider, so retries and fallback models are each priced
    with the provider and model actually used.

    Args:
        provider: the endpoint's name, for prices keyed by provider (``local/qwen``).
        answers_as: the one model the endpoint's kind answers as, whatever was asked (its
            profile's ``answers_as``): its calls are priced as that model
            (``priced_model``); ``""``: as the model asked for.
        batchable: the endpoint's adapter sends a call through a Batch API session when
            there is one (``openai``, ``chat``): such a call is priced at batch rates.
    """

    def __init__(
        self,
        inner: Adapter,
        budget: Budget,
        provider: str = "",
        *,
        answers_as: str = "",
        batchable: bool = True,
    ) -> None:
        super().__init__(inner)
        self.budget = budget
        self.provider = provider
        self.answers_as = answers_as
        self.batchable = batchable

    async def execute(self, request: ModelRequest) -> AdapterResponse:
        # a call in a Batch API session is half price, if this endpoint's adapter sends
        # it in the batch (openai, chat); another kind answers live at its list price
        batched = self.batchable and request.batch is not None
        factor = BATCH_PRICE_FACTOR if batched else 1.0
        model = priced_model(self.answers_as, request.settings.model)
        reservation = self.budget.reserve(model, estimate_usage(request), self.provider, factor)
        try:
            response = await self.inner.execute(request)
        except LLMError as exc:
            self.budget.settle(reservation, exc.usage)
            if self.answers_as:  # failed as what it answers as, and priced so (offline: $0)
                exc.answered_as = self.answers_as
            raise
        except BaseException:
            self.budget.settle(reservation, Usage())
            raise
        self.budget.settle(reservation, response.usage)
        return response
