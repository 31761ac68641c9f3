"""Run execution: every kind of run recorded, launched, summarised, exported and marked (`execute`)."""
