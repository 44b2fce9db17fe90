"""Saved or live rollouts as training data. ``saved_run`` (``SavedRun``: a run folder read back), ``rollouts`` (what
every format reads of one rollout), ``formats`` (the rows of each format), ``grouping`` (a task's rollouts together,
in bounded memory), ``sinks`` (JSONL / Parquet files with their description), ``writer`` (``TrainingDataWriter``,
``export_training_data``), ``schema`` and ``options`` (the formats' columns and options: light, for the CLI's parser).

Nothing is imported here, so the parser can read ``options`` without loading the rest."""
