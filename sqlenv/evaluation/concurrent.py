"""Evaluation with N episodes in flight: for policies that wait on something else (a model behind an endpoint).

`evaluate_concurrently(make_env, make_policy, n_episodes, seed, concurrency)` plays the same episodes as
`sqlenv.evaluate` — episode i is `reset(seed=seed + i)`, results in episode order — on `concurrency`
worker threads, each with its own environment and policy instance (an environment and a policy hold one
episode's state). Threads suffice: the workers wait on the network, and each environment's SQLite work is short.

A policy may expose `fatal_error`, an exception set when every further episode is pointless (the endpoint is gone,
the key was refused); the run then stops starting episodes and raises it. A policy with `episode_usage()` has its
dict stored in each transcript under "usage" (requests, tokens, latency).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Sequence

from sqlenv.evaluation.evaluate import EvaluationResult, episode_plan, play_episode

__all__ = ["evaluate_concurrently"]


def evaluate_concurrently(
    make_env: Callable[[], Any],
    make_policy: Callable[[], Any],
    n_episodes: int | None = None,
    seed: int = 0,
    concurrency: int = 1,
    progress_callback: Callable[[int, int, dict], None] | None = None,
    *,
    question_ids: Sequence[str] | None = None,
) -> EvaluationResult:
    """Play `n_episodes` episodes with up to `concurrency` in flight and score them like `evaluate`.

    Args:
        make_env: returns a new environment (a `SQLEnvironment` or anything with its interface); called once
            per worker, in the worker's thread, and closed when the worker ends.
        make_policy: returns a new policy (`sqlenv.evaluation.policies.Policy`); called once per worker.
        n_episodes: how many episodes; episode i is `env.reset(seed=seed + i)`, whichever worker plays it. With
            `question_ids` it defaults to their number (and may not exceed it).
        seed: the first episode's seed (default 0). Same seed, same questions as `evaluate`.
        concurrency: episodes in flight at once (default 1); also the number of environments open.
        progress_callback: called as `progress_callback(done, total, transcript)` after each episode, from one
            thread at a time, in completion order.
        question_ids: play these questions, one episode each: episode i is `question_ids[i]` (with seed
            `seed + i`), as `evaluate(..., question_ids=...)` plays them; default None: questions drawn by seed.

    Returns:
        An `EvaluationResult` whose episodes are in episode order, each with "wall_s" (seconds the episode took)
        and, for policies that count it, "usage".

    Raises:
        The first worker's `fatal_error` (e.g. `sqlenv.evaluation.openai_policy.EndpointError`), or any exception raised
        by `make_env` / `make_policy`, after every worker has stopped.
    """
    n_episodes, question_ids = episode_plan(n_episodes, question_ids)
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    results: list[dict | None] = [None] * n_episodes
    lock = threading.Lock()
    stop = threading.Event()
    state = {"next": 0, "done": 0, "error": None, "name": None}

    def take() -> int | None:
        with lock:
            if stop.is_set() or state["next"] >= n_episodes:
                return None
            state["next"] += 1
            return state["next"] - 1

    def fail(exc: BaseException) -> None:
        with lock:
            if state["error"] is None:
                state["error"] = exc
        stop.set()

    def worker() -> None:
        env = None
        try:
            env = make_env()
            policy = make_policy()
            with lock:
                state["name"] = state["name"] or getattr(policy, "name", type(policy).__name__)
            while (i := take()) is not None:
                started = time.perf_counter()
                transcript = play_episode(env, policy, seed + i,
                                          question_id=question_ids[i] if question_ids is not None else None)
                fatal = getattr(policy, "fatal_error", None)
                if fatal is not None:  # this episode and every later one would fail the same way
                    fail(fatal)
                    return
                transcript["wall_s"] = round(time.perf_counter() - started, 4)
                if hasattr(policy, "episode_usage"):
                    transcript["usage"] = policy.episode_usage()
                with lock:
                    results[i] = transcript
                    state["done"] += 1
                    if progress_callback is not None:
                        progress_callback(state["done"], n_episodes, transcript)
        except BaseException as exc:  # noqa: BLE001 - raised again in the calling thread
            fail(exc)
        finally:
            if env is not None and hasattr(env, "close"):
                env.close()

    threads = [threading.Thread(target=worker, name=f"sqlenv-eval-{k}", daemon=True)
               for k in range(min(concurrency, max(1, n_episodes)))]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            thread.join()
    except KeyboardInterrupt:
        stop.set()  # workers finish the episode in hand and stop
        raise
    if state["error"] is not None:
        raise state["error"]
    return EvaluationResult.from_episodes([r for r in results if r is not None], policy=state["name"], seed=seed)
