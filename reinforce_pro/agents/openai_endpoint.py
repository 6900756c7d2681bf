"""An OpenAI-compatible endpoint in front of the rollout engines, on loopback, for agents written to the SDK.

    client = openai.AsyncOpenAI(base_url=f"{endpoint.url}/s/{session}/v1", api_key="none")
    reply = await client.chat.completions.create(model="policy", messages=[...])

Served: POST /v1/chat/completions and /v1/completions (streamed when asked), POST /v1/messages (Anthropic's
Messages API), GET /v1/models and /health; each /v1 route also under
/s/<session>/v1 (a session is a base URL, as in NVIDIA's Molt), or given as the `X-Session-Id` header or a
`session_id` body field (OpenRLHF's example executor sends it through `extra_body`). Every request is tokenised
here (the tokenizer's chat template for chat), sampled by the engines from exactly those ids, and recorded in
its session's trajectory (agents/trajectory.py) with the engine's ids and log-probs: training never
re-tokenises text. The response carries the ids too (`token_ids`, as OpenRLHF's executor returns them).

Requests of all sessions are batched: the endpoint waits until every live agent has a request pending, or
`batch_wait_s` after the first, then makes one engine call per sampling setting. Sampling follows the run:
the trainer scores tokens under the run's temperature and filters (models/sampling_filter.py), so a request
may lower `max_tokens` and set `stop`, and a temperature, top-p or top-k different from the run's is refused
with a 400 that names it. Errors are OpenAI's JSON (`{"error": {"message", "type", "code"}}`), so the SDK
raises its usual exceptions; nothing a client sends can stop the run.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace

from reinforce_pro.agents.openai_app import EndpointError, build_app, top_logprobs
from reinforce_pro.agents.trajectory import Call, Trajectory
from reinforce_pro.rollout.engine_wait import ACTOR_LOST, EngineHung
from reinforce_pro.rollout.sampler import client_text

# Sampling fields a request may send only with the run's own value (or the neutral one): the trainer replays the
# run's settings, not a request's.
PINNED = ("temperature", "top_p", "top_k", "min_p", "min_tokens")
NEUTRAL = {"presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0, "logit_bias": None}
RUN_FLAG = {"min_tokens": "min_new_tokens"}  # a pinned field's flag where it is not the field's name
ENDED_KEPT = 65536  # ended sessions remembered for a 410 (older ones answer 404): bounded over a long run
# Fields real clients send that would change what is sampled in a way the trainer cannot score (or a response
# shape not served): refused with a 400 naming them unless they hold their neutral value. Fields that change
# nothing sampled (user, metadata, store, service_tier, stream_options, ...) are accepted; the table in
# docs/agents.md lists every field and what it does.
REFUSED = {
    "response_format": "structured output is not served: guided decoding masks the distribution the trainer "
    "scores under (ask for JSON in the prompt, or parse the text)",
    "functions": "the legacy functions API is not served: declare them as tools",
    "function_call": "the legacy functions API is not served: use tool_choice",
    "ignore_eos": "ignore_eos is not served: the trainer would train tokens past the response's end",
    "best_of": "best_of is not served: one completion per request",
    "use_beam_search": "beam search is not served: the trainer scores sampled tokens",
    "echo": "echo is not served: the response holds the completion only (token_ids carry the prompt's ids)",
    "suffix": "suffix (insertion) is not served",
    "prompt_logprobs": "prompt_logprobs are not served: the engine scores the sampled tokens",
    "audio": "audio output is not served: the policy samples text",
}
NEUTRAL_OF = {"response_format": ({"type": "text"},), "best_of": (1,), "functions": ([],)}
Sample = Callable[[list[list[int]], dict], list]  # Sampler.sample: (prompt ids, sampling) -> [Generation]


@dataclass
class Session:
    id: str
    engine: int | None = None  # the engine it is pinned to (Endpoint's engines), None: any
    trajectory: Trajectory = field(default_factory=Trajectory)
    open: bool = True
    # The last call's prompt text plus its completion, as the engine's ids decode (special tokens kept) and as
    # the client was shown it (a stop string cut off): a next prompt that starts with either extends the ids.
    seen_texts: tuple[str, ...] = ()
    # the ids of the tool calls parsed out of its completions -> the text sampled with them (agents/tools.py)
    sampled_calls: dict[str, str] = field(default_factory=dict)


class Batcher:
    """Collects the sessions' requests on the server's event loop and samples them together."""

    def __init__(self, sample: Sample, wait_s: float, engines: list | None = None):
        self.sample, self.wait_s, self.engines = sample, wait_s, engines or []
        # --partial_rollout: (prompts, sampling) -> (generations, each token's weight version), sampled in chunks
        # with weight syncs let in between (Sampler.sample_in_chunks); None: whole responses
        self.chunked: Callable | None = None
        # where engine calls run: None, a worker thread of the server's loop; else submit(fn, *args) ->
        # concurrent.futures.Future (partial rollouts: the thread that holds the engine gate, openai_agents.py)
        self.submit: Callable | None = None
        # (prompt ids, sampling, engine, future, whether its session is still open)
        self.pending: list[tuple[list[int], dict, int | None, asyncio.Future, Callable[[], bool]]] = []
        self.live = 0  # agents still running: when all of them wait, the batch is complete
        self.calls = 0  # engine calls made
        # the first error of an engine lost (dead, or hung past --engine_timeout_s) under the episodes in flight:
        # their source raises it once they end, so that the engine is replaced and the batch sampled again
        self.lost: BaseException | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._flushing = False

    def forget(self) -> None:
        """Drop what belonged to a stopped event loop (the endpoint was started again on a new one)."""
        self.pending, self._timer, self._flushing = [], None, False

    async def generate(self, prompt_ids: list[int], sampling: dict, engine: int | None = None,
                       alive: Callable[[], bool] = lambda: True):  # fmt: skip
        """The engines' Generation for `prompt_ids`; `engine`: the index of the engine the session is pinned to
        (None: the sampler splits the batch over its engines); `alive`: whether its session is still open (a
        request whose episode ended while it waited never reaches an engine)."""
        future = asyncio.get_running_loop().create_future()
        self.pending.append((prompt_ids, sampling, engine, future, alive))
        self.poke()
        return await future

    def poke(self) -> None:
        """Flush if every live agent waits; otherwise make sure a flush comes within wait_s."""
        if self._flushing or not self.pending:
            return
        if len(self.pending) >= self.live:
            asyncio.get_running_loop().create_task(self._flush())
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.wait_s, self._timed_flush)

    def _timed_flush(self) -> None:
        self._timer = None
        if not self._flushing and self.pending:
            asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        if self._flushing or not self.pending:
            return
        self._flushing = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        taken, self.pending, batch = self.pending, [], []
        for entry in taken:
            if entry[4]():
                batch.append(entry)
            elif not entry[3].done():  # its episode ended (the step is over): no engine call for it
                entry[3].set_exception(EndpointError(410, "the session has ended: its episode is over",
                                                     "session_ended"))  # fmt: skip
        try:
            # one call per sampling setting and engine, whatever each request's max_tokens (near --max_len every
            # session has its own room, and a key with it split a batch into a call a request; `within` cuts each
            # to its own), the engines' calls at once (they are separate actors)
            groups: dict[tuple[str, int | None], list[int]] = {}
            for k, (_, sampling, engine, _, _) in enumerate(batch):
                rest = {key: v for key, v in sampling.items() if key != "max_tokens"}
                groups.setdefault((json.dumps(rest, sort_keys=True), engine), []).append(k)
            await asyncio.gather(
                *(self._call(batch, key, engine, members) for (key, engine), members in groups.items())
            )
        finally:
            self._flushing = False
            self.poke()  # requests that arrived during the flush

    async def _call(self, batch: list, key: str, engine: int | None, members: list[int]) -> None:
        prompts, loop = [batch[k][0] for k in members], asyncio.get_running_loop()
        limits = [batch[k][1]["max_tokens"] for k in members]
        sampling = {**json.loads(key), "max_tokens": max(limits)}
        call = (self.sample, prompts, sampling) if engine is None else (self.sample_on, engine, prompts, sampling)
        if self.chunked is not None:
            call = (self.chunked, prompts, sampling)
        try:  # the engines are called off the loop: the endpoint keeps answering meanwhile
            out = await (loop.run_in_executor(None, *call) if self.submit is None else asyncio.wrap_future(
                self.submit(*call)))  # fmt: skip
            generations = list(zip(*out, strict=True)) if self.chunked is not None else [(g, None) for g in out]
            generations = [within(g, v, limit, len(p)) for (g, v), limit, p in zip(generations, limits, prompts,
                                                                                 strict=True)]  # fmt: skip
            self.calls += 1
        except Exception as e:  # an engine failure fails these requests (503), not the endpoint
            if isinstance(e, (*ACTOR_LOST, EngineHung)) and self.lost is None:
                self.lost = e
            failure = EndpointError(503, f"the engines failed: {type(e).__name__}: {e}", "engine")
            generations = [failure] * len(members)
        for k, g in zip(members, generations, strict=True):
            future = batch[k][3]
            if not future.done():  # a client that went away has cancelled its future
                future.set_exception(g) if isinstance(g, Exception) else future.set_result(g)

    def sample_on(self, engine: int, prompts: list[list[int]], sampling: dict) -> list:
        return self.sample(prompts, sampling, engines=[self.engines[engine]])


def within(generation, versions, limit: int, prompt_len: int):
    """(generation, versions) cut to a request's own max_tokens, where its batch was sampled with a larger one:
    the first `limit` tokens of a longer sample are a sample of `limit` tokens (each is drawn given those before
    it), ending for "length"."""
    if len(generation.token_ids) <= limit:
        return generation, versions
    routes = generation.routes[: prompt_len + limit - 1] if generation.routes is not None else None
    tops = generation.top_log_probs[:limit] if generation.top_log_probs is not None else None
    cut = replace(generation, token_ids=generation.token_ids[:limit], log_probs=generation.log_probs[:limit],
                  finish_reason="length", routes=routes, top_log_probs=tops)  # fmt: skip
    return cut, (versions[:limit] if versions is not None else None)


class Endpoint:
    """The server (uvicorn in a daemon thread, its own event loop), its sessions and its batcher."""

    def __init__(self, tokenizer, sample: Sample, sampling: dict, max_len: int, model_name: str = "policy",
                 batch_wait_s: float = 0.05, engines: list | None = None):  # fmt: skip
        """`engines`: with more than one, each session is pinned to one of them (round robin as sessions open),
        so that an episode's turns reuse that engine's prefix cache; `sample` then takes `engines=[engine]`."""
        self.tokenizer, self.sampling, self.max_len, self.model_name = tokenizer, dict(sampling), max_len, model_name
        self.batcher = Batcher(sample, batch_wait_s, engines if engines and len(engines) > 1 else None)
        self._opened = 0
        self.sessions: dict[str, Session] = {}
        # the latest sessions closed (at most ENDED_KEPT): their late requests get 410, not 404
        self.ended: OrderedDict[str, None] = OrderedDict()
        self.url = ""
        self._server = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the server's, seen by the first request
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ lifecycle (called from the driver)
    def start(self) -> str:
        """Start serving on 127.0.0.1 at a free port; returns the base URL (http://127.0.0.1:PORT)."""
        from reinforce_pro.serving import KeptServer

        self._server = KeptServer(lambda: build_app(self), "openai-endpoint", idle_timeout=30.0)
        self.url = self._server.start()
        return self.url

    def ensure(self) -> None:
        """Before episodes start: the endpoint answers, or is started again on its port (serving.KeptServer) with
        its sessions kept and the batcher's requests of the stopped loop dropped (none is in flight between
        episodes)."""
        if self._server is not None and self._server.ensure():
            self._loop = None
            self.batcher.forget()

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    @property
    def serving(self) -> bool:
        return self._server is not None and self._server.alive

    def open_session(self) -> str:
        sid = secrets.token_hex(12)
        with self._lock:
            engines = len(self.batcher.engines)
            self.sessions[sid] = Session(sid, self._opened % engines if engines else None)
            self._opened += 1
        return sid

    def close_session(self, sid: str) -> Session:
        """End a session: later requests to it get 410. Returns it (its trajectory) and forgets it."""
        with self._lock:
            session = self.sessions.pop(sid)
            session.open = False  # under the lock: complete() checks it and records under the same lock
            self.ended[sid] = None
            while len(self.ended) > ENDED_KEPT:
                self.ended.popitem(last=False)
        return session

    def set_live(self, count: int) -> None:
        """How many agents are running (thread-safe): the batcher flushes once they all wait."""
        self.batcher.live = count
        if self._loop is not None and self.serving:
            self._loop.call_soon_threadsafe(self.batcher.poke)

    # ------------------------------------------------------------------ requests (on the server's loop)
    def session_for(self, path_sid: str | None, header_sid: str | None, body: dict) -> Session:
        self._loop = asyncio.get_running_loop()
        sid = path_sid or header_sid or body.get("session_id")
        if sid is None:
            raise EndpointError(400, "no session: use the base URL /s/<session>/v1, the X-Session-Id header or a "
                                "session_id field (extra_body)", "session_missing")  # fmt: skip
        session = self.sessions.get(str(sid))
        if session is None:
            if str(sid) in self.ended:
                raise EndpointError(410, f"session {sid} has ended: its episode is over", "session_ended")
            raise EndpointError(404, f"unknown session {sid!r}", "session_unknown")
        return session

    def sampling_for(self, body: dict, prompt_len: int) -> dict:
        """The run's sampling with what a request may change: max_tokens (clamped to the run's and to the room
        the episode has left) and stop; anything the trainer could not replay is refused."""
        for key in PINNED:
            value = body.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
                raise EndpointError(400, f"{key} must be a number, got {value!r}", "invalid", key)
            run = self.sampling.get(key, _DEFAULTS[key])
            if value is not None and float(value) != float(run):
                raise EndpointError(400, f"{key} {body[key]} differs from the run's {run}: the trainer scores tokens "
                                    f"under the run's sampling settings, so a request cannot change it (set it for "
                                    f"the run: --{RUN_FLAG.get(key, key)})", "sampling_pinned", key)  # fmt: skip
        for key, why in REFUSED.items():
            if body.get(key) not in (None, False, "", *NEUTRAL_OF.get(key, ())):
                raise EndpointError(400, why, "unsupported", key)
        if body.get("modalities") not in (None, ["text"]):
            raise EndpointError(400, "modalities other than text are not served", "unsupported", "modalities")
        for key, neutral in NEUTRAL.items():
            if body.get(key) not in (None, neutral) and body.get(key) != {}:
                raise EndpointError(400, f"{key} is not served: the trainer could not replay it", "unsupported", key)
        if body.get("n") not in (None, 1):  # None: the default, as OpenAI reads it
            raise EndpointError(400, "n must be 1: one completion per request (open more sessions)", "unsupported", "n")
        if body.get("stream") not in (None, False, True):
            raise EndpointError(400, f"stream must be true or false, got {body['stream']!r}", "invalid", "stream")
        room = self.max_len - prompt_len
        if room <= 0:
            raise EndpointError(400, f"the prompt has {prompt_len} tokens; the episode's limit is {self.max_len} "
                                "(--max_len)", "context_length_exceeded", "messages")  # fmt: skip
        limit = self.sampling["max_tokens"]
        asked = body.get("max_completion_tokens", body.get("max_tokens"))
        if asked is not None and (not isinstance(asked, int) or isinstance(asked, bool) or asked < 1):
            raise EndpointError(400, f"max_tokens must be a positive integer, got {asked!r}", "invalid", "max_tokens")
        # above the run's --max_new_tokens: clamped to it (Anthropic's clients always send one, often 4096 or
        # more), and counted in the session's trajectory (complete: agent/clamped_max_tokens)
        sampling = {**self.sampling, "max_tokens": min(asked or limit, limit, room)}
        stop = body.get("stop")
        if stop is not None:
            stops = [stop] if isinstance(stop, str) else stop
            if not (isinstance(stops, list) and all(isinstance(s, str) and s for s in stops) and len(stops) <= 8):
                raise EndpointError(400, "stop must be a string or a list of up to 8 non-empty strings", "invalid",
                                    "stop")  # fmt: skip
            sampling["stop"] = stops
        return {**sampling, **self._engine_fields(body)}

    def _engine_fields(self, body: dict) -> dict:
        """What a request may add to the engine's sampling without changing the distribution the trainer scores:
        a seed, stop token ids, and how many of each position's likeliest tokens come back (top_logprobs; the
        completions route's integer `logprobs`)."""
        out, vocab = {}, len(self.tokenizer)
        seed = body.get("seed")
        if seed is not None:
            if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
                raise EndpointError(400, f"seed must be a non-negative integer, got {seed!r}", "invalid", "seed")
            out["seed"] = seed
        stop_ids = body.get("stop_token_ids")
        if stop_ids is not None:
            if not (isinstance(stop_ids, list) and len(stop_ids) <= 16 and all(
                    isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in stop_ids)):  # fmt: skip
                raise EndpointError(400, f"stop_token_ids must be a list of up to 16 token ids below {vocab}",
                                    "invalid", "stop_token_ids")  # fmt: skip
            if stop_ids:
                out["stop_token_ids"] = list(stop_ids)
        top = top_logprobs(body)
        if top:
            out["top_logprobs"] = top
        return out

    def prompt_ids(self, session: Session, text: str, with_bos: bool) -> list[int]:
        """The ids of a prompt `text`. Where it extends the session's conversation as text, only the new part is
        tokenised and appended to the ids the engine already saw and sampled (so the next turn continues the
        same token sequence, whatever a fresh tokenisation of the whole text would give); otherwise the whole
        text is tokenised, and the trajectory starts a new segment (`with_bos`: BOS first, as prompts are)."""
        for seen in session.seen_texts:
            if text.startswith(seen):
                return session.trajectory.last_full() + self._encode(text[len(seen) :])
        ids = self._encode(text)
        bos = self.tokenizer.bos_token_id
        if with_bos and bos is not None and ids[:1] != [bos]:
            ids = [bos] + ids
        return ids

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] if text else []

    async def complete(self, session: Session, prompt_text: str | None, prompt_ids: list[int], body: dict,
                       gone: Callable[[], Awaitable[bool]] | None = None,
                       kept_stop: str | None = None) -> Call:  # fmt: skip
        """Sample from exactly `prompt_ids` and record the call in the session's trajectory; `prompt_text`: the
        prompt as text (None for token ids in), which the next prompt's text is matched against; `gone`: whether
        the client has disconnected meanwhile (Starlette's request.is_disconnected): a generation it never
        received is not recorded, so an agent that retries continues from what it saw, not from a fork.
        `kept_stop`: one more stop string, kept in the text (a tool call's closing tag, parallel_tool_calls
        false)."""
        sampling = self.sampling_for(body, len(prompt_ids))
        if kept_stop is not None:
            sampling["stop"] = [*sampling.get("stop", ()), kept_stop]
        generation, versions = await self.batcher.generate(prompt_ids, sampling, session.engine, lambda: session.open)
        shown = client_text(self.tokenizer, generation.token_ids)  # <tool_call> kept where it is a special token
        raw = self.tokenizer.decode(generation.token_ids, skip_special_tokens=False)
        for stop in sampling.get("stop", ()):  # the engine's ids run through the stop string; the client's text not
            if stop in shown:
                shown = shown[: shown.index(stop) + (len(stop) if stop == kept_stop else 0)]
        call = Call(list(prompt_ids), list(generation.token_ids), list(generation.log_probs),
                    generation.finish_reason, shown, versions, generation.routes, generation.top_log_probs)  # fmt: skip
        if gone is not None and await gone():
            session.trajectory.abandoned += 1
            raise EndpointError(499, "the client disconnected before its completion was sent", "client_closed")
        asked = body.get("max_completion_tokens", body.get("max_tokens"))
        with self._lock:  # close_session (the driver's thread) cannot end it between the check and the record
            if not session.open:  # the episode ended while this request waited: nothing is recorded
                raise EndpointError(410, f"session {session.id} has ended: its episode is over", "session_ended")
            session.trajectory.add(call)
            session.trajectory.clamped += int(asked is not None and asked > self.sampling["max_tokens"])
            session.seen_texts = (prompt_text + raw, prompt_text + shown) if prompt_text is not None else ()
        return call


_DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "min_tokens": 0}
