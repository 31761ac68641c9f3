"""An experiment's result kept in its study folder, so that the report is rendered from files, not re-derived.

`STUDY/results/<experiment>.json` holds what the report needs of one experiment: its tables (pandas' "table" JSON:
values and dtypes), the files its plots wrote (beside it, in STUDY/results/), its notes and figure inputs (meta),
and the analysis version that computed it. Its sentences and flags are recomputed from the tables when the report
is rendered: they are the experiment's `interpret` over these tables, so the tables are their inputs.

A saved result is used only when its analysis version is the code's (`version_of`): ANALYSIS_VERSION for what all
experiments share, each experiment's own `version` for its table and sentences. Any other result, a missing file
or a corrupt one is re-derived from the stored runs (a report is always rebuildable from the stored runs alone) and saved again.
`STUDY/results/study.json` keeps the study-wide figures: the noise floor from the reference cell.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from scalelab.errors import StoreError
from scalelab.lab.base import Experiment, Result
from scalelab.report.drawn import record_path
from scalelab.store import read_json, write_text_atomic
from scalelab.store.files import dumps

ANALYSIS_VERSION = 4  # 3: the pooled noise model's columns (issue 56); 4: exposed at the no-op's fastest rank, overlap of
# waiting + wire (issue 57). Raise when a shared analysis (comparison tables, intervals, the ranking) changes its output
STUDY_FILE = "study.json"


def version_of(experiment: Experiment) -> str:
    return f"{ANALYSIS_VERSION}.{experiment.version}"


def results_dir(study_dir: Path) -> Path:
    return Path(study_dir) / "results"


def frame_data(frame: pd.DataFrame) -> dict:
    """A table as JSON-ready data that reads back equal, float bits included (pandas' own JSON keeps 15 digits)."""
    return {"columns": [str(c) for c in frame.columns], "dtypes": [str(t) for t in frame.dtypes],
            "data": frame.to_numpy(dtype=object).tolist()}


def frame_of(data: dict) -> pd.DataFrame:
    frame = pd.DataFrame(data["data"], columns=data["columns"], dtype=object)
    return frame.astype(dict(zip(data["columns"], data["dtypes"]))) if len(frame.columns) else frame


def save(experiment: Experiment, result: Result, folder: Path) -> Path:
    """Write `result` to folder/<experiment>.json (atomically); its files are kept relative to `folder`."""
    folder = Path(folder)
    files = [str(Path(f).resolve().relative_to(folder.resolve())) if Path(f).resolve().is_relative_to(
        folder.resolve()) else str(f) for f in result.files]
    data = {"experiment": experiment.name, "name": result.name, "analysis_version": version_of(experiment),
            "tables": {k: frame_data(frame) for k, frame in result.tables.items()},
            "files": files, "notes": result.notes, "meta": result.meta}
    path = folder / f"{experiment.name}.json"
    write_text_atomic(path, dumps(data, indent=1) + "\n")
    return path


def load(experiment: Experiment, folder: Path) -> Result | None:
    """The saved result of `experiment` in `folder`, or None: missing, unreadable, of another analysis version, or
    naming a plot file that is gone or has no record of what it drew."""
    path = Path(folder) / f"{experiment.name}.json"
    if not path.is_file():
        return None
    try:
        data = read_json(path)
        if data.get("analysis_version") != version_of(experiment):
            return None
        tables = {k: frame_of(t) for k, t in data["tables"].items()}
        files = [Path(folder) / f for f in data["files"]]
    except (StoreError, KeyError, TypeError, ValueError):
        return None
    # a plot saved before figures recorded what they drew (report.drawn) is drawn again, with its record
    if not all(f.is_file() and (f.suffix != ".png" or record_path(f).is_file()) for f in files):
        return None
    return Result(data["name"], tables, files=files, notes=data.get("notes", {}), meta=data.get("meta", {}))


def save_study(folder: Path, noise_floor: str | None, *, budget: list[str] | None = None,
               budget_s: float | None = None, noise_model: str | None = None) -> None:
    """The study-wide figures: the noise floor, the pooled noise model the decisions read (in words: shown beside
    the noise floor), and the time budget with what it reduced or left out."""
    if noise_model:
        noise_floor = f"{noise_floor or 'no reference drift'}; pooled noise model: {noise_model}"
    write_text_atomic(Path(folder) / STUDY_FILE, dumps({"analysis_version": ANALYSIS_VERSION,
                                                        "noise_floor": noise_floor, "budget_s": budget_s,
                                                        "noise_model": noise_model,
                                                        "budget": budget or []}, indent=1) + "\n")


def load_study(folder: Path) -> dict | None:
    """The study-wide figures saved with the results (None: none saved, or of another analysis version)."""
    path = Path(folder) / STUDY_FILE
    try:
        data = read_json(path) if path.is_file() else None
    except StoreError:
        return None
    return data if data and data.get("analysis_version") == ANALYSIS_VERSION else None
