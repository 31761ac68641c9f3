"""The performance model (docs/model.md), in one package: step time = compute + exposed communication per sync
strategy, hardware and worker count (`perfmodel`); the hardware presets and the α-β fit (`hardware`); the
calibration of this machine (`calibration`) and the links between its namespace nodes (`links`); the prediction
and its validation against measured runs (`prediction`); and `predict --from`, a run measured elsewhere
(`elsewhere`). The α-β cost formulas the sync strategies share are in scalelab.analysis.hardware."""
