"""The SFT warm-start corpus (FiC stage 1's data): `build` writes deferral, recovery and
single-turn conversations with their data card (`fic sft-data`)."""
