"""The foundation every stage stands on; it imports nothing of FiC outside `fic.core`.

- `errors`: `FicError`, the one error contract (file, record, field, what was expected).
- `config`: typed dataclass configs from YAML plus `key=value` overrides, `setting(...)` help.
- `files`: atomic writes, guarded readers of JSON/JSONL data files, resumable logs.
- `parsing`, `seeding`, `progress`, `stats`: numbers in text, derived seeds, progress lines,
  intervals and paired tests.
- `instance`: the Lost-in-Conversation instance and its shards.
- `chat`: chat-template rendering with token-exact loss masks and prompt ids.
- `model`: loading models and tokenizers, and preparing the bundled SmolLM2-135M-Instruct.
- `generation`: the `Backend` interface and its sampling settings.
"""
