"""The OpenAI-compatible backend: chat completions through the `openai` SDK (the `openai` extra).

Works with the OpenAI API and with local servers that speak the same protocol (`vllm serve`,
llama.cpp, SGLang, TGI). Text in, text out: the server applies its own chat template and
never shows token ids, so `generate()` (token-in) is refused and `Generation.token_ids` is [].

The SDK owns the transport: timeouts, retries of connection errors, timeouts, 408, 409, 429 and
5xx with exponential backoff and jitter, a server's `Retry-After` (honoured up to two minutes),
proxies (`HTTPS_PROXY`) and TLS (`SSL_CERT_FILE`). FiC keeps what is its own:

- lockstep batching: `chat` answers a batch of conversations together, `concurrency` requests in
  flight at once, replies in the order asked, and the rest of the batch cancelled when one fails
  for good;
- what it records: the seed of each request (`params.seeds[i]`, else seed + i for the i-th
  conversation of a call, so repeated conversations are sampled independently yet reproducibly
  where the server honours seeds) and the reply, its finish reason and any log-probs;
- a server's refusal of a sampling field adapted once per backend, logged: reasoning models
  reject `temperature` (and `top_p`, `seed`, `logprobs`), which are then left out so the model
  samples at its own default, and `max_tokens`, which is then sent as `max_completion_tokens`;
- errors as one line: a 4xx other than those is a `FicError` at once with the status and the
  server's message (sending the same bad request again cannot help); a failure the SDK retried
  says how many attempts it made.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fic.core.errors import FicError, one_line
from fic.core.generation import BackendConfig, Generation, SamplingParams, request_seeds
from fic.core.optional import need

LOCAL_KEY = "EMPTY"  # sent where no key is set: local servers ignore it (vLLM's convention), the SDK needs one
# Fields a reasoning model may refuse, and what is sent instead (None: nothing, the model's default).
ADAPTED = {"temperature": None, "top_p": None, "seed": None, "logprobs": None, "max_tokens": "max_completion_tokens"}
RETRIED = (408, 409, 429)  # and 5xx: the statuses the SDK retries
_REFUSED = re.compile(r"[Uu]nsupported (?:parameter|value):? '(\w+)'")

log = logging.getLogger(__name__)


class OpenAIBackend:
    """Chat completions from an OpenAI-compatible HTTP endpoint."""

    name = "openai"
    tokenizer = None

    def __init__(self, model: str, base_url: str, api_key: str | None = None, *,
                 timeout_s: float = 120.0, max_retries: int = 5, concurrency: int = 8,
                 request_logprobs: bool = False):
        if urllib.parse.urlparse(base_url).scheme not in ("http", "https"):
            raise FicError(f"base_url must start with http:// or https://, got {base_url!r}", field="base_url")
        self.sdk = need("openai", "the openai backend (kind: openai)", field="kind")
        self.model, self.api_key = model, api_key
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.max_retries = max_retries
        self.concurrency, self.request_logprobs = max(1, concurrency), request_logprobs
        self.client = self.sdk.OpenAI(base_url=base_url, api_key=api_key or LOCAL_KEY, timeout=timeout_s,
                                      max_retries=max_retries)
        self.refused: dict[str, str | None] = {}  # field the server refused -> the field sent instead
        self._lock = threading.Lock()

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

    def _fields(self, params: SamplingParams, seed: int | None) -> dict[str, Any]:
        fields: dict[str, Any] = {"max_tokens": params.max_new_tokens, "temperature": params.temperature,
                                  "top_p": params.top_p}
        if seed is not None:
            fields["seed"] = seed
        if self.request_logprobs:
            fields["logprobs"] = True
        with self._lock:
            for name, instead in self.refused.items():
                if name in fields:
                    value = fields.pop(name)
                    if instead is not None:
                        fields[instead] = value
        return fields

    def _complete(self, messages: list[dict], params: SamplingParams, seed: int | None) -> Generation:
        sdk = self.sdk
        for _ in range(len(ADAPTED) + 1):  # each refused field is adapted once
            fields = self._fields(params, seed)
            try:
                response = self.client.chat.completions.create(model=self.model, messages=messages, **fields)
            except sdk.BadRequestError as err:
                if self._adapt(err, fields):
                    continue
                raise self._status_error(err) from None
            except sdk.APIStatusError as err:
                raise self._status_error(err) from None
            except sdk.APIConnectionError as err:  # refused, DNS, reset, timeout: the SDK retried it already
                cause = err.__cause__ or err
                raise FicError(f"{self.url}: gave up after {self.max_retries + 1} attempt(s); last error: "
                               f"{type(cause).__name__}: {one_line(cause)[:300]}") from None
            except sdk.APIResponseValidationError as err:
                raise FicError(f"{self.url}: unexpected response: {one_line(err)[:300]}") from None
            return self._parse(response)
        raise FicError(f"{self.url}: the server refused every adaptation of the request")

    def _adapt(self, err: Any, fields: dict) -> bool:
        """Whether the refusal names a field FiC can leave out or rename (remembered for every later request)."""
        body = err.body if isinstance(err.body, dict) else {}
        found = _REFUSED.search(str(body.get("message") or err.message))
        name = body.get("param") if body.get("param") in ADAPTED else (found.group(1) if found else None)
        if name not in ADAPTED or name not in fields:
            return False
        with self._lock:
            first = name not in self.refused
            self.refused[name] = ADAPTED[name]
        if first:
            instead = f"sent as {ADAPTED[name]}" if ADAPTED[name] else "left out: the model samples at its own default"
            log.warning(f"fic: {self.url}: model {self.model} refuses {name} ({_server_message(err)[:160]}); "
                        f"from now on {name} is {instead}")
        return True

    def _status_error(self, err: Any) -> FicError:
        status, message = err.status_code, _server_message(err)
        if status in RETRIED or status >= 500:  # the SDK retried these before giving up
            return FicError(f"{self.url}: gave up after {self.max_retries + 1} attempt(s); last error: "
                            f"HTTP {status}: {message}")
        hint = " (check the API key in the variable named by api_key_env)" if status in (401, 403) else ""
        return FicError(f"{self.url}: HTTP {status}: {message}{hint}")

    def _parse(self, response: Any) -> Generation:
        try:
            choice = response.choices[0]
            text = choice.message.content or ""
            reason = choice.finish_reason
        except (AttributeError, IndexError, TypeError):
            raise FicError(f"{self.url}: unexpected response, no choices[0].message: {str(response)[:300]}") from None
        # Chat-completions shape: {"logprobs": {"content": [{"token", "logprob", ...}, ...]}}.
        content = getattr(choice.logprobs, "content", None) or []
        logprobs = [float(item.logprob) for item in content if getattr(item, "logprob", None) is not None]
        # Anything but "length" (stop, tool_calls, content_filter, eos) ended the turn itself.
        return Generation(token_ids=[], text=text, logprobs=logprobs,
                          finish_reason="length" if reason == "length" else "stop")


def _server_message(err: Any) -> str:
    """The error text a server sent: OpenAI's error.message, vLLM's message, FastAPI's detail."""
    body = err.body
    if isinstance(body, dict):
        for key in ("message", "detail", "error"):
            if body.get(key):
                return str(body[key])[:500]
    if isinstance(body, str) and body.strip():
        return body.strip()[:500]
    return re.sub(r"^Error code: \d+ - ", "", str(err.message))[:500]


def openai_backend_from_config(cfg: BackendConfig) -> OpenAIBackend:
    """Build from a config; the key is read from the environment variable `cfg.api_key_env`."""
    api_key = os.environ.get(cfg.api_key_env) if cfg.api_key_env else None
    host = urllib.parse.urlparse(cfg.base_url).hostname or ""
    if not api_key and host.endswith("openai.com"):
        raise FicError(f"no API key: set the environment variable {cfg.api_key_env}", field="api_key_env")
    return OpenAIBackend(cfg.model, cfg.base_url, api_key, timeout_s=cfg.timeout_s,
                         max_retries=cfg.max_retries, concurrency=cfg.concurrency,
                         request_logprobs=cfg.request_logprobs)
