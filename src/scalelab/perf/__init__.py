"""The performance model (DESIGN F14): step time = compute + exposed communication, per sync strategy (whose
cost each strategy's registry entry gives), hardware and worker count. Calibration and prediction experiments
live in scalelab.experiments; the α-β collective costs and hardware presets in scalelab.analysis.hardware."""
