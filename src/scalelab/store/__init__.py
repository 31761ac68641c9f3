"""Where runs are kept: atomic files (`files`), each run's directory (`rundir`), the SQLite catalog (`catalog`)."""
from scalelab.store.catalog import (COMPARE_ID_COLUMNS, DEFAULT_ROOT, DENORM_COLUMNS, FINAL_STATUSES, LIST_COLUMNS,
                                    STATUSES, Store, new_run_id, open_store)
from scalelab.store.files import (atomic_file, read_json, read_jsonl, write_bytes_atomic, write_json_atomic,
                                  write_jsonl_atomic, write_text_atomic)
from scalelab.store.rundir import ParsedRun, RunDir

__all__ = ["COMPARE_ID_COLUMNS", "DEFAULT_ROOT", "DENORM_COLUMNS", "FINAL_STATUSES", "LIST_COLUMNS", "STATUSES",
           "ParsedRun", "RunDir", "Store", "atomic_file", "new_run_id", "open_store", "read_json", "read_jsonl",
           "write_bytes_atomic", "write_json_atomic", "write_jsonl_atomic", "write_text_atomic"]
