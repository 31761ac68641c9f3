"""The cell engine: what an experiment is (`base`), the cells it runs and stores (`cells`), comparisons checked
against the noise (`checked`), progress on long work (`progress`), the experiment registry (`registry`) and the
study that runs them all (`study`). Experiments themselves live in scalelab.experiments, one module each."""
