"""A provider's embeddings of memory texts (``[memory] embeddings = "provider"`` on an
``openai``, ``chat`` or ``gemini`` endpoint), cached in the world and scored by cosine.

Before a phase that retrieves builds its inputs, the engine asks the endpoint for the
vectors of every text (cells and situations) the cache does not hold, a few batched
requests (``fetch``), and keeps them in ``.sim/embeddings/<model digest>.jsonl``: one
line naming the model and the vectors' length, then one line per text, ``{"text":
<sha256 of the text>, "vector": <base64 of float32 little-endian>}``. A resumed or
replayed tick finds them there and sends nothing.

Vectors are rounded to float32 the moment they arrive, so the ones scored live and the
ones read back from the cache are the same numbers: a replay chooses the same cells.

The file is untrusted: it is read without following links and only up to
``MAX_BYTES``; a line that is not an entry of this model's length (or a header for
another model) is skipped and its text fetched again, never a traceback. A header whose
``dimensions`` is not the length the model sends is named when the first answer shows it,
and the file's vectors are dropped for the cache to be rebuilt once (it used to fail, and
be paid for, every tick); a folder in the file's place is refused by name before anything
is fetched. It is rewritten whole, atomically (a temporary file renamed over it), so a
crash leaves the old one: read a line at a time and written as its lines are made, so a
cache costs about its vectors in memory (float32), not several times its file.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import io
import os
import random
import stat
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np
import numpy.typing as npt
import orjson

from sim import safefs
from sim.errors import InputError, RunError
from sim.llm.budget import Budget
from sim.llm.embedding import Embedded, Embedder, EmbeddingSent
from sim.llm.errors import LLMError
from sim.llm.recovery import RetryPolicy, classify
from sim.llm.types import Usage

#: where the caches live, under the world's folder
FOLDER = ".sim/embeddings"
#: the largest cache file read (a bigger one is ignored and rebuilt)
MAX_BYTES = 256 * 1024 * 1024
#: the longest vector kept (OpenAI's largest model has 3,072 dimensions)
MAX_DIMENSIONS = 16384
#: texts per embeddings request
BATCH = 256

Floats = npt.NDArray[np.float64]


@lru_cache(maxsize=262144)
def text_digest(text: str) -> str:
    """The key a text's vector is cached under."""
    return hashlib.sha256(text.encode()).hexdigest()


def cache_name(model: str) -> str:
    """The cache file of ``model``'s vectors (its name, digested: any model name is safe)."""
    return hashlib.sha256(model.encode()).hexdigest()[:16] + ".jsonl"


def _unit(raw: npt.NDArray[np.float32]) -> Floats:
    """A float32 vector as float64 of length one (zeros stay zeros)."""
    vector = raw.astype(np.float64)
    norm = float(np.sqrt(np.dot(vector, vector)))
    return vector / norm if norm > 0 else vector


class VectorCache:
    """One model's vectors of texts, as the world's cache file holds them and as fetched.

    Args:
        root: the world's folder (the file is ``root/.sim/embeddings/<cache_name>``).
        model: the embedding model.
    """

    def __init__(self, root: Path, model: str) -> None:
        self.root = root
        self.model = model
        self.rel = f"{FOLDER}/{cache_name(model)}"
        #: text digest -> float32 vector, as stored
        self._raw: dict[str, npt.NDArray[np.float32]] = {}
        #: text digest -> unit float64 vector, as scored
        self._unit: dict[str, Floats] = {}
        self.dimensions = 0
        #: why entries of the file were not used (one line each; shown in the tick's notes)
        self.notes: list[str] = []
        #: fetched since the file was read: it needs writing
        self.dirty = False
        #: tokens the embeddings requests of this run counted
        self.usage = Usage()
        self.requests = 0
        #: a situation was scored without its vector (a phase the engine did not prepare)
        self.unembedded = False
        #: ``dimensions`` is the file's header (not yet confirmed by the model's answers)
        self._from_file = False
        self._load()

    # -- the file -----------------------------------------------------------------------------

    @property
    def path(self) -> Path:
        """The cache file."""
        return self.root / self.rel

    def _check_target(self, dir_fd: int | None = None, name: str | None = None) -> None:
        """Refuse a folder where the cache file goes: it could never be replaced, and every
        tick would pay for vectors it cannot keep.

        Raises:
            UnsafePath: naming the cache file.
        """
        try:
            if dir_fd is None or name is None:
                mode = self.path.lstat().st_mode
            else:
                mode = os.lstat(name, dir_fd=dir_fd).st_mode
        except (FileNotFoundError, NotADirectoryError):
            return
        if stat.S_ISDIR(mode):
            raise safefs.UnsafePath(
                self.path,
                None,
                f"is a folder; expected the {self.model!r} embeddings cache file (a file "
                "sim writes): remove the folder",
            )

    def _load(self) -> None:
        self._check_target()  # before anything is fetched: nothing paid for in vain
        try:
            size = self.path.lstat().st_size
        except OSError:
            size = 0
        if size > MAX_BYTES:
            self.notes.append(
                f"{self.path} ignored (it is {size:,} bytes, over the cache's limit of "
                f"{MAX_BYTES:,}); its vectors are fetched again: delete it to start afresh"
            )
            return
        try:
            data = safefs.read_optional(self.root, self.rel, MAX_BYTES)
        except (InputError, OSError) as exc:  # a link, a folder, too big: not used
            self.notes.append(f"{self.path} ignored ({exc}); its vectors are fetched again")
            return
        if not data:
            return
        lines = io.BytesIO(data)  # one line at a time: never all of them at once
        try:
            head = orjson.loads(lines.readline())
        except orjson.JSONDecodeError:
            head = None
        dims = head.get("dimensions") if isinstance(head, dict) else None
        if (
            not isinstance(head, dict)
            or head.get("model") != self.model
            or not isinstance(dims, int)
            or isinstance(dims, bool)
            or not 0 < dims <= MAX_DIMENSIONS
        ):
            self.notes.append(
                f"{self.path} ignored (its first line does not name model {self.model!r} "
                "and its vectors' length, 'dimensions'); its vectors are fetched again"
            )
            return
        self.dimensions = dims
        self._from_file = True
        bad = 0
        for line in lines:
            if not line.strip():
                continue
            entry = self._entry(line, dims)
            if entry is None:
                bad += 1
                continue
            digest, vector = entry
            self._raw[digest] = vector
        if bad:
            self.notes.append(
                f"{self.path}: {bad} bad line(s) ignored (not a text's vector of "
                f"'dimensions' {dims} numbers); those texts are fetched again"
            )

    @staticmethod
    def _entry(line: bytes, dims: int) -> tuple[str, npt.NDArray[np.float32]] | None:
        try:
            item = orjson.loads(line)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(item, dict):
            return None
        digest, encoded = item.get("text"), item.get("vector")
        if not isinstance(digest, str) or len(digest) != 64 or not isinstance(encoded, str):
            return None
        try:
            raw = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            return None
        if len(raw) != 4 * dims:
            return None
        vector = np.frombuffer(raw, dtype="<f4").astype(np.float32)
        if not np.isfinite(vector).all():
            return None
        return digest, vector

    def save(self) -> None:
        """Write the cache (all of it, atomically) if anything was fetched since it was read."""
        if not self.dirty:
            return
        head = orjson.dumps({"model": self.model, "dimensions": self.dimensions}) + b"\n"

        def lines() -> Iterator[bytes]:
            # written as made, never built whole: a line is plain ASCII (a hex digest and
            # base64), formatted here as orjson would (whose output buffer for one such
            # line is many times its size: 20 MB of cache once took 350 MB to save)
            yield head
            for digest in sorted(self._raw):  # sorted: the same vectors, the same bytes
                encoded = base64.b64encode(self._raw[digest].astype("<f4").tobytes())
                yield b'{"text":"' + digest.encode() + b'","vector":"' + encoded + b'"}\n'

        folder, _, name = self.rel.rpartition("/")
        with safefs.open_dir(self.root, folder.split("/"), create=True) as dir_fd:
            self._check_target(dir_fd, name)
            tmp = name + ".tmp"
            safefs.unlink_at(dir_fd, tmp)  # a planted link is removed, never written through
            safefs.write_stream_at(dir_fd, tmp, self.root / self.rel, lines())
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        self.dirty = False

    # -- vectors ------------------------------------------------------------------------------

    def missing(self, texts: Iterable[str]) -> list[str]:
        """The distinct texts without a vector, in first-seen order; a blank text has none
        (an embeddings API refuses it) and is relevant to nothing."""
        out: dict[str, None] = {}
        for text in texts:
            if text not in out and text_digest(text) not in self._raw and text.strip():
                out[text] = None
        return list(out)

    def add(self, texts: Sequence[str], vectors: Sequence[Sequence[float]]) -> bool:
        """Keep fetched vectors (rounded to float32, as the file keeps them).

        The first vectors the model sends settle the length: when the file's header said
        another, the file is wrong for this model (tampered with, or written for another
        length), and its vectors are dropped (noted, naming the file and the field) for
        the cache to be rebuilt, once, rather than fail, and be paid for, every tick.

        Returns:
            Whether the file's vectors were dropped (their texts need fetching again).

        Raises:
            ValueError: a vector of another length than those this run fetched.
        """
        dropped = False
        for text, values in zip(texts, vectors, strict=True):
            vector = np.asarray(values, dtype=np.float32)
            if self._from_file and len(vector) != self.dimensions:
                self.notes.append(
                    f"{self.path}: field 'dimensions' is {self.dimensions}, but model "
                    f"{self.model!r} sends vectors of {len(vector)} numbers: its "
                    f"{len(self._raw)} vector(s) were dropped and the cache is rebuilt"
                )
                self._raw.clear()
                self._unit.clear()
                self.dimensions = 0
                dropped = True
            self._from_file = False
            if not self.dimensions:
                self.dimensions = len(vector)
            if len(vector) != self.dimensions or len(vector) > MAX_DIMENSIONS:
                raise ValueError(
                    f"model {self.model!r} sent a vector of {len(vector)} numbers; "
                    f"expected {self.dimensions}"
                )
            self._raw[text_digest(text)] = vector
            self.dirty = True
        return dropped

    def vectors_of(self, texts: Iterable[str]) -> dict[str, bytes]:
        """The vectors this cache holds of ``texts``, by text digest, as little-endian
        float32 bytes (what a sharded tick's coordinator sends a worker: ``take``)."""
        out: dict[str, bytes] = {}
        for text in texts:
            digest = text_digest(text)
            vector = self._raw.get(digest)
            if vector is not None:
                out[digest] = vector.astype("<f4").tobytes()
        return out

    def take(self, dimensions: int, vectors: Mapping[str, bytes]) -> None:
        """Keep vectors another process's cache holds (``vectors_of``: a sharded tick's
        worker takes its coordinator's), of ``dimensions`` numbers each. When this cache's
        are of another length (its file's, which the coordinator found wrong for the model
        and dropped), they are dropped first. The file is not written: the process that
        fetched them writes it."""
        if not vectors and not dimensions:  # the coordinator has none: nothing is fetched
            return
        if dimensions != self.dimensions:
            self._raw.clear()
            self._unit.clear()
            self.dimensions = dimensions
        self._from_file = False
        for digest, raw in vectors.items():
            vector = np.frombuffer(raw, dtype="<f4").astype(np.float32)
            if len(vector) != dimensions:
                raise ValueError(f"a vector of {len(vector)} numbers; expected {dimensions}")
            self._raw[digest] = vector

    def unit(self, text: str) -> Floats | None:
        """A text's vector scaled to length one, or ``None`` when it has none."""
        digest = text_digest(text)
        vector = self._unit.get(digest)
        if vector is None:
            raw = self._raw.get(digest)
            if raw is None:
                return None
            vector = self._unit[digest] = _unit(raw)
        return vector

    def similarities(self, docs: Sequence[str], query: str) -> list[float]:
        """Each document's cosine with the query, floored at 0 (0 without a vector)."""
        q = self.unit(query)
        if q is None and docs and not self.unembedded:
            self.unembedded = True  # said once a tick
            self.notes.append(
                f"a situation had no {self.model!r} embedding (not fetched before its "
                "phase); its relevance counted 0"
            )
        out = []
        for doc in docs:
            v = self.unit(doc)
            out.append(0.0 if q is None or v is None else max(float(np.dot(v, q)), 0.0))
        return out


async def fetch(
    cache: VectorCache,
    embedder: Embedder,
    texts: Iterable[str],
    timeout_seconds: float,
    budget: Budget | None = None,
    provider: str = "",
    retry: RetryPolicy | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    phase: str = "",
    on_sent: Callable[[EmbeddingSent], None] | None = None,
) -> int:
    """Fetch the vectors of ``texts`` the cache lacks, ``BATCH`` a request (fewer if the
    embedder's ``max_texts`` says so), and write the cache; the number of texts fetched.
    Each request is held against ``budget`` first (its worst case: a token per byte of
    its texts, priced as ``[prices]`` prices the model on ``provider``) and settled with
    the tokens the server counted. A rate limit or a transient failure (timeout, 5xx,
    connection) is retried as ``retry`` says (``[llm]``'s counts and backoff), as a
    call's would be. Each request whose vectors are used is handed to ``on_sent`` (the
    tick's log records it, for the books) before they are written to the cache file, so
    one the log lacks is never one the cache holds: a resumed tick that finds the texts
    cached finds the request logged too. (An answer refused as malformed stops the tick
    with nothing written: its tokens are in the budget only.)

    Raises:
        LLMError: a request failed (as a call's failures are named), or would cross a
            cap of the budget (``LLMBudgetExceededError``: not sent).
        RunError: the model sent vectors of different lengths.
    """
    texts = list(texts)
    wanted = cache.missing(texts)
    size = max(1, min(BATCH, embedder.max_texts))
    fetched = start = 0
    while start < len(wanted):
        chunk = wanted[start : start + size]
        start += len(chunk)
        fetched += len(chunk)
        held = None
        if budget is not None:
            worst = Usage(input_tokens=sum(len(t.encode()) + 1 for t in chunk))
            held = budget.reserve(cache.model, worst, provider)
        usage = Usage()
        try:
            answer = await _embed(embedder, cache.model, chunk, timeout_seconds, retry, sleep)
            usage = answer.usage
        finally:
            if budget is not None and held is not None:
                budget.settle(held, usage)
        cache.requests += 1
        cache.usage = cache.usage + usage
        try:
            dropped = cache.add(chunk, answer.vectors)
        except ValueError as exc:
            raise RunError(f"embeddings not used: {exc}") from None
        if on_sent is not None:  # logged before the cache keeps it
            on_sent(EmbeddingSent(phase, cache.model, provider, len(chunk), usage))
        cache.save()  # each batch kept at once: an interrupted tick does not pay twice
        if dropped:  # the file's vectors were of another length: their texts too
            wanted, start = cache.missing(texts), 0
    return fetched


async def _embed(
    embedder: Embedder,
    model: str,
    texts: Sequence[str],
    timeout_seconds: float,
    retry: RetryPolicy | None,
    sleep: Callable[[float], Awaitable[None]],
) -> Embedded:
    """One embeddings request, retried on a rate limit or a transient failure."""
    tries = 0
    while True:
        try:
            return await embedder.embed(model, texts, timeout_seconds)
        except LLMError as exc:
            kind = classify(exc)
            tries += 1
            if retry is None or kind not in ("rate_limit", "transient"):
                raise
            if tries > retry.retries(kind):
                raise
            await sleep(retry.delay(tries, exc, random.random))


def check_caches(root: Path, models: Iterable[str]) -> list[str]:
    """What ``sim check`` says of the world's caches of ``models``' vectors: each note of
    a cache that is there (what of it a tick would not use, and why).

    Raises:
        UnsafePath: a folder where a cache file goes (a tick refuses it too).
    """
    out: list[str] = []
    for model in sorted(set(models)):
        if os.path.lexists(root / FOLDER / cache_name(model)):
            out += VectorCache(root, model).notes
    return out


def embedding_notes(caches: Iterable[VectorCache]) -> list[str]:
    """The tick summary's lines about embeddings: requests sent and their tokens, and
    cache entries that were not used."""
    out: list[str] = []
    for cache in caches:
        out += cache.notes
        if cache.requests:
            out.append(
                f"embeddings: {cache.requests} request(s) to {cache.model!r}, "
                f"{cache.usage.input_tokens:,} input tokens"
            )
    return out
