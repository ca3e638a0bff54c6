"""The command line: `main` (the `fic` parser and its error contract) and the verbs that
belong to no stage: `data` (prepare-model, shard, views, masks), `train`, `bench`,
`launch_check`."""
