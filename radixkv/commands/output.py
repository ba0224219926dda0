"""What the subcommands write and show: output paths checked before a run, files that appear
whole or not at all, strict JSON that carries the run's metadata and units, the one way rates
are shown, and the progress bar."""
from __future__ import annotations

import json
import os
import secrets
import signal
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from radixkv import __version__
from radixkv.workloads import Workload

# The engine summary keys a result row of simulate, compare and generate leads with; the whole
# summary follows under "details".
JSON_KEYS = ("name", "hit_rate", "prefill_tokens", "ttft_p50", "ttft_p99", "e2e_p50", "e2e_p99",
             "throughput_tok_s", "evicted_tokens", "retractions")
UNITS = ("s", "us", "tokens", "tokens/s", "requests/s", "fraction", "count")


# ---- paths, checked before a run ------------------------------------------------------------
def check_file_target(path: Path, flag: str) -> Path:
    """A file `flag` may write: not a folder, in a folder that exists."""
    if path.is_dir():
        raise ValueError(f"{flag} {str(path)!r} is a folder; give a file name")
    if not path.parent.is_dir():
        raise ValueError(f"{flag} {str(path)!r}: the folder {str(path.parent)!r} does not exist")
    return path


def check_dir_target(path: Path, flag: str) -> Path:
    """A folder `flag` may write into: a folder, or one that can be made (its nearest existing
    ancestor is a folder)."""
    if path.exists() and not path.is_dir():
        raise ValueError(f"{flag} {str(path)!r} is a file, not a folder")
    up = path
    while not up.exists() and up != up.parent:
        up = up.parent
    if up.exists() and not up.is_dir():
        raise ValueError(f"{flag} {str(path)!r}: {str(up)!r} is a file, not a folder")
    return path


# ---- files that appear whole, all together, or not at all -----------------------------------
class Outputs:
    """`with Outputs() as out:` hands out a temporary path beside each final file
    (`out.path(final)`), and on a clean exit moves them all into place with os.replace; on any
    exception, Ctrl-C included, it removes them and the folders it made, so a run leaves its
    files complete or not at all."""

    def __init__(self) -> None:
        self._pending: list[tuple[Path, Path]] = []
        self._made: list[Path] = []

    def __enter__(self) -> Outputs:
        return self

    def path(self, final: Path) -> Path:
        final = Path(final)
        missing = []
        up = final.parent
        while not up.exists():
            missing.append(up)
            up = up.parent
        final.parent.mkdir(parents=True, exist_ok=True)
        self._made += reversed(missing)
        # same folder, so os.replace is a rename; the suffix keeps writers' format detection
        tmp = final.with_name(f".{final.stem}.{secrets.token_hex(4)}.tmp{final.suffix}")
        self._pending.append((tmp, final))
        return tmp

    def write_json(self, final: Path, obj: Any) -> None:
        text = dumps(obj, str(final))
        self.path(final).write_text(text, encoding="utf-8")

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            with _sigint_deferred():
                for tmp, final in self._pending:
                    os.replace(tmp, final)
            return
        for tmp, _ in self._pending:
            tmp.unlink(missing_ok=True)
        for folder in reversed(self._made):
            try:
                folder.rmdir()
            except OSError:              # not empty: something else is in it now
                pass


@contextmanager
def _sigint_deferred() -> Iterator[None]:
    """Ctrl-C waits until the block is done (the files move all together). Signal masks are
    POSIX and per thread: elsewhere, or off the main thread, the block just runs."""
    if sys.platform == "win32" or threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def dumps(obj: Any, where: str = "JSON") -> str:
    """Strict JSON: a NaN or infinity is refused, never written."""
    try:
        return json.dumps(obj, indent=2, allow_nan=False) + "\n"
    except ValueError as e:
        raise ValueError(f"{where}: a result is not a finite number ({e})") from None


# ---- what a JSON output holds ---------------------------------------------------------------
def engine_row(summary: dict) -> dict:
    """A result row of an engine run: the key figures, then the whole summary."""
    return {k: summary[k] for k in JSON_KEYS} | {"details": summary}


def unit_of(key: str) -> str:
    """The unit of a numeric result key, from its name."""
    if key.endswith("_tok_s"):
        return "tokens/s"
    if key.endswith("_req_s"):
        return "requests/s"
    if key.endswith("_us_per_request"):
        return "us"
    if key.endswith("_s") or key.startswith(("ttft_", "e2e_", "tpot_", "itl_")):
        return "s"
    if key.endswith("_tokens") or key == "capacity":
        return "tokens"
    if key.endswith(("_rate", "_usage", "_error")):
        return "fraction"
    if key in ("real", "simulated"):                 # validate's rows: a latency, both ways
        return "s"
    return "count"


def units_of(rows: Sequence[dict]) -> dict[str, str]:
    """key -> unit for every numeric key of the rows and of their details (a figure that is
    missing, None, counts as numeric)."""
    out: dict[str, str] = {}
    for row in rows:
        for part in (row, row.get("details") or {}):
            for k, v in part.items():
                if v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)):
                    out.setdefault(k, unit_of(k))
    return out


def workload_info(w: Workload, spec: str) -> dict:
    """name, source (the reader's or generator's account, else the spec), requests, prompt
    tokens."""
    source = w.meta.get("source")
    return {"name": w.name, "source": source if isinstance(source, str) and source else spec,
            "requests": len(w), "prompt_tokens": w.num_prompt_tokens}


def metadata(workload: dict, *, model: str | None, gpu: str | None,
             max_total_tokens: int | None, results: list[dict],
             max_concurrency: int | None = None, timing: str | None = None) -> dict:
    """The JSON a run writes: what ran it, on what, and its results with their units.
    `max_concurrency`: the clients of a closed-loop run, None for the arrival times;
    `timing`: what priced a simulated GPU's steps (None: no simulated GPU)."""
    return {
        "radixkv_version": __version__,
        "workload": workload,
        "model": model,
        "gpu": gpu,
        "timing": timing,
        "max_total_tokens": max_total_tokens,
        "max_concurrency": max_concurrency,
        "units": units_of(results),
        "results": results,
    }


# ---- the terminal ---------------------------------------------------------------------------
def console() -> Console:
    # a file or pipe gets lines wide enough for the tables instead of rich's 80 columns
    return Console(width=None if sys.stdout.isatty() else 160)


def pct(x: float | None) -> str:
    """A rate as every table shows it: 71.3%."""
    return "-" if x is None else f"{100 * x:.1f}%"


def seconds(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}s"


def progress_bar(con: Console, show: bool = True) -> Progress:
    """A transient bar, drawn only on a terminal."""
    return Progress(TextColumn("{task.description:<26}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=con, transient=True,
                    disable=not (show and con.is_terminal))


def advance_by(bar: Progress, name: str, total: int) -> Callable[[int], None]:
    task = bar.add_task(name, total=total)
    return lambda k: bar.advance(task, k)
