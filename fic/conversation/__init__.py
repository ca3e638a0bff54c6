"""Playing multi-turn conversations, shared by evaluation, VASD rollouts and the probe.

- `simulator`: lockstep play of many conversations, token-exact (`play`, `Conversation`).
- `users`: the user simulators (verbatim shards, or an LLM under LiC's rules).
- `classify`: reply classifiers (rule, LLM) with LiC's seven labels.
"""
