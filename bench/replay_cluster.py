"""Replay's parallel efficiency on a local Dask cluster, beside its one-worker floor, and
where an N-worker run's time goes.

The ShareGPT-shaped log of replay_speed (c), replayed with its stages on a local cluster of
one worker process, then of N (default 2), each worker one thread; both clusters are started
before the clock starts, and their runs alternate (RUNS=3 pairs by default). Every run's
report is compared with the local run's, byte for byte.

Efficiency = T(1) / (N x T(N)) per pair, the median printed: 1.0 is perfect scaling; the
goal is 0.8. Two figures of it:
- wall: T is the run's wall clock. On a machine shared with other work (the load average is
  printed beside it) a worker waits for a core as long as the others make it, so this figure
  says as much about the other work as about replay.
- CPU: T is the run's critical path in CPU seconds, what its wall clock would be with a core
  for each process: the client's CPU, then the busiest worker's. The client's is the
  thread that ran replay (its serial work) and what the rest of its process spent beyond
  idle (its event loop, and the LocalClusters' schedulers, which this process holds); a
  worker's is its process (psutil) beyond idle, and the limited children it forked, each
  measured in the child. What each process spends idle (heartbeats, polling) is measured
  before the runs, 10 s of each: it grows with the wall clock, which the other work
  stretches, so left in it would favour the slower run. Latency that spends no CPU (the
  network, a worker waiting for a task) is not in this figure; the wall figure on an idle
  machine would hold it.
Beside them: the CPU of the whole run, 1 worker against N (1.0: splitting the work added
nothing), the imbalance (busiest worker / mean), and the breakdown of the N-worker runs: the
client's phases, each share's child (the tracing itself) and the worker's thread around it
(forking, reading the traces back), and what each worker process spent beyond idle outside
its tasks (receiving the tracer and the shares, sending the traces).
With ``--replicas R --router NAME`` the log is replayed on a fleet of R vLLM replicas behind
that router (as ``tmpl-lint replay --replicas R --router NAME``). A router that reads no cache
(round-robin, session, prefix) has its replicas simulated in one task per worker (printed
apart in the breakdown), and the client's "merge replicas" phase puts them together; the kv
router's fleet is simulated whole on the client ("simulate pools").
Needs the cluster extra (dask[distributed]) and Qwen3's tokenizer from ../shared.
With ``--scale K`` a log of K times as many conversations (distinct ones, as replay_speed
makes them) is measured after the default one, both printed: the default log is a few
seconds of work, so that the fixed costs of a cluster run (starting the tasks, sending the
tracer) weigh on it as they would not on a fleet's log.
Run: python bench/replay_cluster.py [N] [--replicas R --router NAME] [--scale K]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from replay_speed import TOKENIZER, sharegpt_log  # noqa: E402

IDLE_SECONDS = 10.0
CONVERSATIONS = 700  # replay_speed's log; --scale K replays K times as many besides


@dataclass
class Run:
    workers: int
    wall: float
    load: tuple[float, float]  # the 1-minute load average before and after
    client_cpu: float  # this process
    client_thread: float  # the thread that ran replay: the client's serial work
    worker_cpu: dict[int, float]  # worker pid -> its process's CPU during the run, children not included
    idle: dict[int | None, float]  # CPU per wall second of each process idle (None: this one)
    costs: object  # tmpl_lint.cluster.ClusterCosts
    began: float  # time.time() when the run began

    def children(self, pid: int) -> float:
        return sum(share.child_cpu for share in self.costs.shares if share.worker == pid)

    @property
    def client(self) -> float:
        """The client's CPU beyond what its process spends idle (event loops, heartbeats)."""
        loops = self.client_cpu - self.client_thread
        return self.client_thread + max(0.0, loops - self.idle[None] * self.wall)

    def per_worker(self) -> dict[int, float]:
        """Each worker's CPU beyond what it spends idle, with its children's."""
        return {pid: max(0.0, cpu - self.idle[pid] * self.wall) + self.children(pid) for pid, cpu in self.worker_cpu.items()}

    @property
    def critical(self) -> float:
        """The critical path in CPU seconds: the client, then the busiest worker."""
        return self.client + max(self.per_worker().values())

    @property
    def total(self) -> float:
        return self.client + sum(self.per_worker().values())

    @property
    def imbalance(self) -> float:
        loads = list(self.per_worker().values())
        return max(loads) / statistics.mean(loads)


def breakdown(label: str, runs: list[Run]) -> None:
    """Where these runs' time went, the median of each figure."""
    print(f"where the {label} runs' time went (medians):")
    phases = defaultdict(list)
    for run in runs:
        for name, phase in run.costs.phases.items():
            phases[name].append(phase)
    for name, figures in phases.items():
        thread = statistics.median(phase.thread_cpu for phase in figures)
        cpu = statistics.median(phase.cpu for phase in figures)
        wall = statistics.median(phase.wall for phase in figures)
        print(f"  client, {name:17s} {thread:5.2f} CPU s in replay's thread, {cpu:5.2f} in the process, {wall:6.2f} s wall")
    flat = [share for run in runs for share in run.costs.shares]
    children = statistics.median(sum(share.child_cpu for share in run.costs.shares) for run in runs)
    print(
        f"  {len(flat) // len(runs)} shares: their children (the tracing) {children:.2f} CPU s in all; each "
        f"{statistics.median(share.child_cpu for share in flat):.2f} CPU s, {statistics.median(share.end - share.start for share in flat):.2f} s wall; "
        f"the worker's thread around each (fork, wait, read back) {statistics.median(share.worker_cpu for share in flat):.3f} CPU s"
    )
    if any(run.costs.pools for run in runs):
        pools = [pool for run in runs for pool in run.costs.pools]
        busiest = statistics.median(
            max(sum(pool.cpu for pool in run.costs.pools if pool.worker == pid) for pid in run.worker_cpu) for run in runs
        )
        print(
            f"  {len(pools) // len(runs)} simulation tasks on the workers: each {statistics.median(pool.cpu for pool in pools):.2f} "
            f"CPU s, {statistics.median(pool.wall for pool in pools):.2f} s wall; the busiest worker's {busiest:.2f} CPU s"
        )
    around = [
        run.worker_cpu[pid]
        - run.idle[pid] * run.wall
        - sum(share.worker_cpu for share in run.costs.shares if share.worker == pid)
        - sum(pool.cpu for pool in run.costs.pools if pool.worker == pid)
        for run in runs
        for pid in run.worker_cpu
    ]
    latency = statistics.median(min(share.start for share in run.costs.shares) - run.began for run in runs)
    print(
        f"  each worker's process beyond idle, outside its tasks (receiving the tracer and the shares, "
        f"sending traces): {statistics.median(around):.2f} CPU s; the first share began {latency:.2f} s wall into the run"
    )


def cpu_seconds(process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def measure(
    size: int, clusters: dict, processes: dict, idle: dict, workers: int, runs: int, arguments: argparse.Namespace
) -> None:
    """The log of ``size`` times replay_speed's conversations, replayed locally, then on
    each cluster in turn, ``runs`` times; its efficiency and breakdown printed."""
    from tmpl_lint.cluster import ClusterCosts, replay_on_cluster
    from tmpl_lint.diff import read_template
    from tmpl_lint.replay.attribution import Tracer
    from tmpl_lint.replay.log import read_log, sessions
    from tmpl_lint.replay.simulate import CacheSettings, replay
    from tmpl_lint.tokenizer import load_tokenizer

    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "sharegpt.jsonl"
        requests = sharegpt_log(log, CONVERSATIONS * size)
        tokenizer = load_tokenizer(TOKENIZER)
        text, _ = read_template(TOKENIZER)
        opened = read_log(log, "user")
        groups = sessions(opened, "user")
        settings = CacheSettings("vllm", 16, replicas=arguments.replicas, router=arguments.router)

        def tracer() -> Tracer:
            return Tracer(text, tokenizer, tokenizer.special_tokens, "vllm")

        def report(summary, problems) -> bytes:
            return json.dumps({"summary": summary.to_json(), "problems": problems}, sort_keys=True).encode()

        load = os.getloadavg()[0]
        start = time.perf_counter()
        local = report(*replay(tracer(), opened, groups, settings, [None], 1))
        fleet = f"{arguments.replicas} replicas, router {arguments.router}; " if arguments.replicas > 1 else ""
        print(
            f"\n{requests} requests ({CONVERSATIONS * size} conversations), {log.stat().st_size / 1e6:.1f} MB; {fleet}"
            f"local, one process: {time.perf_counter() - start:6.1f} s (load {load:.1f})"
        )
        done: dict[int, list[Run]] = {1: [], workers: []}
        for _ in range(runs):  # alternated, so a change in the machine's load falls on both
            for count, cluster in clusters.items():
                costs = ClusterCosts()
                before = {process.pid: cpu_seconds(process) for process in processes[count]}
                load = os.getloadavg()[0]
                began, wall, cpu, thread = time.time(), time.perf_counter(), time.process_time(), time.thread_time()
                outcome = replay_on_cluster(cluster.scheduler_address, tracer(), opened, groups, settings, [None], None, costs)
                wall, cpu, thread = time.perf_counter() - wall, time.process_time() - cpu, time.thread_time() - thread
                after = {process.pid: cpu_seconds(process) for process in processes[count]}
                spent = {pid: after[pid] - before[pid] for pid in before}
                run = Run(count, wall, (load, os.getloadavg()[0]), cpu, thread, spent, idle, costs, began)
                done[count].append(run)
                assert report(*outcome) == local, f"{count} workers: not the local run's report"
                per_worker = " + ".join(f"{seconds:.1f}" for seconds in run.per_worker().values())
                print(
                    f"cluster of {count} worker(s): {wall:6.1f} s wall (load {load:.1f}-{run.load[1]:.1f}); CPU s: "
                    f"client {run.client:.1f} ({thread:.1f} replay's thread, {cpu:.1f} the process), workers {per_worker}; "
                    f"critical path {run.critical:.1f}; equals the local run"
                )
    ones, manys = done[1], done[workers]

    def efficiency(name: str, figure) -> None:
        pairs = sorted(figure(one) / (workers * figure(many)) for one, many in zip(ones, manys))
        print(f"  {name:4s} {statistics.median(pairs):.2f} (range {pairs[0]:.2f}-{pairs[-1]:.2f})")

    loads = [load for run in ones + manys for load in run.load]
    print(
        f"parallel efficiency on {workers} workers, {requests} requests, median of {runs} alternated pairs (goal 0.8; "
        f"{os.cpu_count()} cores, load average {min(loads):.1f}-{max(loads):.1f} during the runs):"
    )
    efficiency("wall", lambda run: run.wall)
    efficiency("CPU", lambda run: run.critical)
    work = statistics.median(one.total / many.total for one, many in zip(ones, manys))
    print(f"  CPU of the whole run, 1 worker / {workers}: {work:.2f}; imbalance of {workers} workers (busiest / mean): "
          f"{statistics.median(run.imbalance for run in manys):.2f}")  # fmt: skip
    for label, group in ((f"{workers}-worker", manys), ("1-worker", ones)):
        breakdown(label, group)


def main() -> None:
    import dask
    import distributed
    import psutil

    if not TOKENIZER.is_dir():
        sys.exit(f"needs {TOKENIZER}")
    parser = argparse.ArgumentParser()
    parser.add_argument("workers", nargs="?", type=int, default=2)
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--router", default="round-robin")
    parser.add_argument("--scale", type=int, default=1, help="also replay a log of K times the conversations")
    arguments = parser.parse_args()
    workers = arguments.workers
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    logging.getLogger("distributed").setLevel(logging.ERROR)  # each cluster's start and stop, said at INFO
    runs = int(os.environ.get("RUNS", "3"))
    clusters, processes = {}, {}
    with dask.config.set({"distributed.worker.daemon": False}):
        for count in (1, workers):
            clusters[count] = distributed.LocalCluster(
                n_workers=count, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=":0"
            )
            with distributed.Client(clusters[count]) as client:
                processes[count] = [psutil.Process(pid) for pid in client.run(os.getpid).values()]
    try:
        # What each process spends idle (event loops, heartbeats: this process holds both
        # clusters' schedulers) grows with the wall clock, which the machine's other work
        # stretches: measured here, it is taken off each run's CPU.
        every = [process for count in clusters for process in processes[count]]
        before = {process.pid: cpu_seconds(process) for process in every}
        cpu, wall = time.process_time(), time.perf_counter()
        time.sleep(IDLE_SECONDS)
        wall = time.perf_counter() - wall
        idle: dict[int | None, float] = {process.pid: (cpu_seconds(process) - before[process.pid]) / wall for process in every}
        idle[None] = (time.process_time() - cpu) / wall
        print(
            f"CPU s per s idle: this process (client, schedulers) {idle[None]:.3f}, "
            f"workers {', '.join(f'{idle[process.pid]:.3f}' for process in every)}"
        )
        for size in sorted({1, arguments.scale}):
            measure(size, clusters, processes, idle, workers, runs, arguments)
    finally:
        for cluster in clusters.values():
            cluster.close()


if __name__ == "__main__":
    main()
