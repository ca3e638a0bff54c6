"""FiC (Found in Conversation): teach LLMs not to get lost in multi-turn conversation."""

__version__ = "0.1.0"
