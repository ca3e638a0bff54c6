"""The OpenAI-compatible backend: `POST {base_url}/chat/completions`, standard library only.

Works with the OpenAI API and with local servers that speak the same protocol (`vllm serve`,
llama.cpp, SGLang, TGI). Text in, text out: the server applies its own chat template and
never shows token ids, so `generate()` (token-in) is refused and `Generation.token_ids` is [].

Reliability: each request has a socket timeout; connection errors, timeouts, 408, 429 and 5xx
are retried with exponential backoff and jitter (a server's `Retry-After` is honoured, capped);
any other 4xx is a `FicError` at once with the status and the server's message, since sending
the same bad request again cannot help. `concurrency` requests run at once in threads.

Parameters sent: model, messages, max_tokens, temperature, top_p, seed (`params.seeds[i]`, else
seed + i for the i-th conversation of a call, so repeated conversations are sampled independently
yet reproducibly where the server honours seeds), and `logprobs: true` when `request_logprobs` is set.
`max_tokens` rather than `max_completion_tokens`: it is the field every compatible server reads.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fic.core.errors import FicError
from fic.core.generation import BackendConfig, Generation, SamplingParams, request_seeds


class _Transient(Exception):
    """A failure worth retrying; `retry_after` is the server's hint in seconds, if any."""

    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


class OpenAIBackend:
    """Chat completions from an OpenAI-compatible HTTP endpoint."""

    name = "openai"
    tokenizer = None

    def __init__(self, model: str, base_url: str, api_key: str | None = None, *,
                 timeout_s: float = 120.0, max_retries: int = 5, concurrency: int = 8,
                 request_logprobs: bool = False, backoff_s: float = 1.0, max_backoff_s: float = 60.0):
        if urllib.parse.urlparse(base_url).scheme not in ("http", "https"):
            raise FicError(f"base_url must start with http:// or https://, got {base_url!r}", field="base_url")
        self.model = model
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.api_key = api_key
        self.timeout_s, self.max_retries = timeout_s, max_retries
        self.concurrency, self.request_logprobs = max(1, concurrency), request_logprobs
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        raise FicError("token-in generation needs a local backend (hf or vllm); "
                       "the openai backend only offers chat()")

    def chat(self, conversations: list[list[dict]], params: SamplingParams) -> list[Generation]:
        if not conversations:
            return []
        seeds = request_seeds(params, len(conversations))
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(conversations)),
                                thread_name_prefix="fic-openai") as pool:
            futures = [pool.submit(self._complete, conv, params, seed)
                       for conv, seed in zip(conversations, seeds)]
            try:
                return [future.result() for future in futures]
            except BaseException:
                # One conversation failed for good: drop the queued ones instead of sending them.
                for future in futures:
                    future.cancel()
                raise

    def _complete(self, messages: list[dict], params: SamplingParams, seed: int | None) -> Generation:
        body: dict[str, Any] = {"model": self.model, "messages": messages,
                                "max_tokens": params.max_new_tokens,
                                "temperature": params.temperature, "top_p": params.top_p}
        if seed is not None:
            body["seed"] = seed
        if self.request_logprobs:
            body["logprobs"] = True
        return self._parse(self._post_with_retries(body))

    def _post_with_retries(self, body: dict) -> dict:
        payload = json.dumps(body).encode("utf-8")
        attempts = self.max_retries + 1
        for attempt in range(attempts):
            try:
                return self._post(payload)
            except _Transient as err:
                if attempt + 1 == attempts:
                    raise FicError(f"{self.url}: gave up after {attempts} attempt(s); last error: {err}") from None
                time.sleep(self._delay(attempt, err.retry_after))
        raise AssertionError("unreachable")

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        """Exponential backoff with jitter (so parallel workers do not retry in lockstep)."""
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_backoff_s)
        base = min(self.backoff_s * 2 ** attempt, self.max_backoff_s)
        return base * random.uniform(0.5, 1.0)

    def _post(self, payload: bytes) -> dict:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(self.url, data=payload, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                raw = response.read()
        except urllib.error.HTTPError as err:
            status, message = err.code, _server_message(err)
            if status in (408, 429) or status >= 500:  # timeouts, rate limits, server trouble
                raise _Transient(f"HTTP {status}: {message}", _retry_after(err.headers)) from None
            hint = " (check the API key in the variable named by api_key_env)" if status in (401, 403) else ""
            raise FicError(f"{self.url}: HTTP {status}: {message}{hint}") from None
        except (OSError, http.client.HTTPException) as err:
            # URLError (refused, DNS), socket timeouts and resets are all OSErrors; a connection
            # cut mid-response is an HTTPException (IncompleteRead, RemoteDisconnected).
            reason = getattr(err, "reason", err)
            raise _Transient(f"{type(reason).__name__}: {reason}") from None
        try:
            return json.loads(raw)
        except ValueError:
            raise FicError(f"{self.url}: response is not JSON: {raw[:200]!r}") from None

    def _parse(self, data: dict) -> Generation:
        try:
            choice = data["choices"][0]
            text = choice["message"].get("content") or ""
            reason = choice.get("finish_reason")
        except (KeyError, IndexError, TypeError, AttributeError):
            raise FicError(f"{self.url}: unexpected response, no choices[0].message: "
                           f"{json.dumps(data)[:300]}") from None
        # Chat-completions shape: {"logprobs": {"content": [{"token", "logprob", ...}, ...]}}.
        block = choice.get("logprobs")
        content = block.get("content") if isinstance(block, dict) else None
        logprobs = [float(item["logprob"]) for item in content or [] if "logprob" in item]
        # Anything but "length" (stop, tool_calls, content_filter, eos) ended the turn itself.
        return Generation(token_ids=[], text=text, logprobs=logprobs,
                          finish_reason="length" if reason == "length" else "stop")


def _server_message(err: urllib.error.HTTPError) -> str:
    """The error text a server sent: OpenAI's error.message, vLLM's message, FastAPI's detail."""
    try:
        raw = err.read().decode("utf-8", "replace")
    except Exception:  # the body is only a courtesy; the status is what matters
        return err.reason or ""
    try:
        data = json.loads(raw)
    except ValueError:
        return raw.strip()[:500] or str(err.reason or "")
    if isinstance(data, dict):
        inner = data.get("error")
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])[:500]
        for key in ("message", "detail", "error"):
            if data.get(key):
                return str(data[key])[:500]
    return raw.strip()[:500]


def _retry_after(headers: Any) -> float | None:
    value = headers.get("Retry-After") if headers is not None else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None  # an HTTP date; fall back to our own backoff


def openai_backend_from_config(cfg: BackendConfig) -> OpenAIBackend:
    """Build from a config; the key is read from the environment variable `cfg.api_key_env`."""
    api_key = os.environ.get(cfg.api_key_env) if cfg.api_key_env else None
    host = urllib.parse.urlparse(cfg.base_url).hostname or ""
    if not api_key and host.endswith("openai.com"):
        raise FicError(f"no API key: set the environment variable {cfg.api_key_env}", field="api_key_env")
    return OpenAIBackend(cfg.model, cfg.base_url, api_key, timeout_s=cfg.timeout_s,
                         max_retries=cfg.max_retries, concurrency=cfg.concurrency,
                         request_logprobs=cfg.request_logprobs)
