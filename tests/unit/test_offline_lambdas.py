"""The offline Lambda runtime gives each function one execution environment, as Lambda gives a request."""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from d2ops.offline.lambdas import LocalLambdas
from d2ops.offline.stack import LocalFunction

HANDLER = '''
import threading, time
running = 0
peak = 0
lock = threading.Lock()

def handler(event, context):
    global running, peak
    with lock:
        running += 1
        peak = max(peak, running)
    time.sleep(0.05)
    with lock:
        running -= 1
    return {"peak": peak}
'''


def _function(code_dir: Path, module: str) -> LocalFunction:
    (code_dir / f"{module}.py").write_text(HANDLER)
    return LocalFunction(logical_id=module, name=module, arn=f"arn:aws:lambda:us-east-1:123456789012:function:{module}",
                         code_dir=code_dir, handler_module=module, handler_name="handler", timeout=30,
                         memory_size=128, environment={})


def test_one_function_runs_one_request_at_a_time_and_two_functions_run_side_by_side(tmp_path: Path) -> None:
    a, b = (f"fn_{uuid.uuid4().hex[:8]}" for _ in range(2))  # fresh module names: no import cache
    lambdas = LocalLambdas({a: _function(tmp_path, a), b: _function(tmp_path, b)})
    start = threading.Barrier(8)

    def call(name: str) -> int:
        start.wait()
        return int(lambdas.invoke(name, {})["peak"])

    with ThreadPoolExecutor(8) as pool:
        peaks = list(pool.map(call, [a, b] * 4))
    assert max(peaks[0::2]) == 1 and max(peaks[1::2]) == 1  # never two requests in one function's environment
