"""Replay's parallel efficiency on a local Dask cluster, beside its one-worker floor.

The ShareGPT-shaped log of replay_speed (c), replayed with its stages on a local cluster of
one worker process, then of N (default 2), each worker one thread; both clusters are started
before the clock starts, and their runs alternate (RUNS=3 pairs by default). Efficiency =
T(1) / (N x T(N)) per pair, the median printed: 1.0 is perfect scaling; the goal is 0.8. Every run's report is compared with the local run's, byte for byte. The load
average is printed beside each figure: this machine is shared.
Needs the cluster extra (dask[distributed]) and Qwen3's tokenizer from ../shared.
Run: python bench/replay_cluster.py [N]
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from replay_speed import TOKENIZER, sharegpt_log  # noqa: E402


def main() -> None:
    import dask
    import distributed

    from tmpl_lint.cluster import replay_on_cluster
    from tmpl_lint.diff import read_template
    from tmpl_lint.replay.attribution import Tracer
    from tmpl_lint.replay.log import read_log, sessions
    from tmpl_lint.replay.simulate import CacheSettings, replay
    from tmpl_lint.tokenizer import load_tokenizer

    if not TOKENIZER.is_dir():
        sys.exit(f"needs {TOKENIZER}")
    workers = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "sharegpt.jsonl"
        requests = sharegpt_log(log)
        tokenizer = load_tokenizer(TOKENIZER)
        text, _ = read_template(TOKENIZER)
        opened = read_log(log, "user")
        groups = sessions(opened, "user")
        settings = CacheSettings("vllm", 16)

        def tracer() -> Tracer:
            return Tracer(text, tokenizer, tokenizer.special_tokens, "vllm")

        def report(summary, problems) -> bytes:
            return json.dumps({"summary": summary.to_json(), "problems": problems}, sort_keys=True).encode()

        load = os.getloadavg()[0]
        start = time.perf_counter()
        local = report(*replay(tracer(), opened, groups, settings, [None], 1))
        print(f"{requests} requests; local, one process: {time.perf_counter() - start:6.1f} s (load {load:.1f})")
        runs = int(os.environ.get("RUNS", "3"))
        clusters = {}
        with dask.config.set({"distributed.worker.daemon": False}):
            for count in (1, workers):
                clusters[count] = distributed.LocalCluster(
                    n_workers=count, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None
                )
        times: dict[int, list[float]] = {1: [], workers: []}
        try:
            for _ in range(runs):  # alternated, so a change in the machine's load falls on both
                for count, cluster in clusters.items():
                    load = os.getloadavg()[0]
                    start = time.perf_counter()
                    result = report(
                        *replay_on_cluster(cluster.scheduler_address, tracer(), opened, groups, settings, [None], count)
                    )
                    times[count].append(time.perf_counter() - start)
                    assert result == local, f"{count} workers: not the local run's report"
                    print(f"cluster of {count} worker(s): {times[count][-1]:6.1f} s (load {load:.1f}); equals the local run")
        finally:
            for cluster in clusters.values():
                cluster.close()
        pairs = sorted(one / (workers * many) for one, many in zip(times[1], times[workers]))
        print(
            f"parallel efficiency on {workers} workers, median of {runs} alternated pairs: {statistics.median(pairs):.2f} "
            f"(range {pairs[0]:.2f}-{pairs[-1]:.2f}; goal 0.8; {os.cpu_count()} cores on this machine)"
        )


if __name__ == "__main__":
    main()
