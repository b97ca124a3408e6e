"""How the GPU checks report a contender measured in the same run, and count gates against it.

A contender's entry in a row of ``gpu_check.py`` / ``gpu_models.py`` is a dict whose ``status`` is

    "measured"           it ran: its times (``ms``; ``prefill_ms`` / ``decode_ms``) and, where its
                         outputs were compared with the op's reference, ``ok`` and
                         ``max_abs_diff``
    "skipped: <why>"     not run: not given, not installed, no GPU, the time budget spent
    "failed: <error>"    run, and it raised

A gate compares ssmcc with one contender (``gate``): met where both were measured, the
contender's outputs (when compared) were right and ssmcc's time is at most ``max_ratio`` times
the contender's; not met where ssmcc is slower, failed or wrong; unmeasured (``None``) where the
contender was skipped, failed or wrong -- never met. Which gates a GPU run must pass belongs to
the GPU measurement; these scripts count them (``gate_summary``) as that must count them.
"""

from __future__ import annotations


def skipped(why: str) -> dict:
    return {"status": f"skipped: {why}"}


def failed(error: BaseException | str) -> dict:
    text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    return {"status": f"failed: {text.strip()}"[:400]}


def measured(**values) -> dict:
    return {"status": "measured", **values}


def is_measured(entry: dict | None) -> bool:
    return bool(entry) and entry.get("status") == "measured"


def gate(ours_ms, ours_ok, theirs: dict | None, key: str = "ms", max_ratio: float = 1.0):
    """True (met), False (not met) or None (unmeasured): see the module docstring."""
    if not is_measured(theirs) or theirs.get("ok") is False or theirs.get(key) is None:
        return None
    if not ours_ok or not isinstance(ours_ms, (int, float)):
        return False
    return ours_ms <= max_ratio * theirs[key]


def gate_summary(rows: list[dict], keys: dict[str, str], max_ratio: float = 1.0) -> dict:
    """``{contender: {their_key: {"met": n, "not_met": n, "unmeasured": n}}}`` over ``rows``;
    ``keys`` maps each contender time key to ssmcc's time key in the same row."""
    summary: dict = {}
    for row in rows:
        for name, entry in row.get("contenders", {}).items():
            for theirs, ours in keys.items():
                met = gate(row.get(ours), row.get("ok"), entry, theirs, max_ratio)
                counts = summary.setdefault(name, {}).setdefault(
                    theirs, {"met": 0, "not_met": 0, "unmeasured": 0}
                )
                counts["unmeasured" if met is None else "met" if met else "not_met"] += 1
    return summary


def describe(entry: dict, key: str = "ms") -> str:
    """An entry as one short cell of a printed table."""
    if not is_measured(entry):
        return entry.get("status", "?")
    text = f"{entry[key]:.3f} ms" if isinstance(entry.get(key), float) else "- ms"
    if "ok" in entry:
        text += " ok" if entry["ok"] else " BAD"
    return text
