"""The main job (`fic demo`): `run` plays every stage on one task; `report` writes its table."""
